// `essaim bench -m FILE [-p 512] [-n 64] [-r 3] [-t N] [--json] [--bandwidth-mb MB] [--mlock] [--no-mmap]
// [--keep-page-cache]`:
// how fast this machine runs a model, as llama-bench reports it — one row per test (pp<N>: a prompt of N
// tokens in one forward; tg<N>: N tokens generated one at a time), tokens/s as mean ± standard deviation
// over the repetitions — plus, for generation, the weight bytes one decoded token reads and the fraction of
// the machine's read bandwidth (measured in the same run, same threads) that this rate streams. Decoding a
// big MoE model is a memory stream, so that fraction is how close to the machine's limit the engine runs.
//
//   essaim bench -m q35-122b-4l.gguf -t 2                 # pp512 and tg64, 3 repetitions, a table
//   essaim bench -m tiny.gguf -p 64 -n 16 -r 5 --json     # one JSON document on stdout
//   essaim bench -m model.gguf -p 0 -n 32                 # generation only
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/model_load.h"
#include "core/huge_pages.h"
#include "core/mapped_file.h"
#include "core/thread_pool.h"
#include "kernels/kernel_traits.h"
#include "model/model.h"
#include "moe/executor.h"
#include "speed/memory_bandwidth.h"
#include "speed/model_speed.h"

namespace essaim::cli {
namespace {

using json = nlohmann::json;

struct BenchArgs {
  std::string model;
  int n_prompt = 512;
  int n_gen = 64;
  int reps = 3;
  int threads = 0;
  bool json_out = false;
  bool mlock = false;
  bool no_mmap = false;
  bool keep_page_cache = false;
  int64_t bandwidth_mb = 512;
};

Status run_bench(const BenchArgs& a) {
  keep_freed_memory_for_reuse();
  ESSAIM_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                          load_model_for_cli(a.model, {.mlock = a.mlock, .no_mmap = a.no_mmap}, a.keep_page_cache));
  const ModelInfo& info = model->info();
  ThreadPool pool(size_t(a.threads > 0 ? a.threads : 0));
  LocalExpertExecutor experts(model->expert_store(), &pool);

  const Bandwidth bw = measure_bandwidth({.bytes = a.bandwidth_mb << 20, .reps = 5, .copy = false}, &pool);
  touch_model_pages(*model);
  // How much of the model the weight streams read through 2 MiB pages (0 for --no-mmap: that copy is
  // anonymous memory, in 2 MiB pages where the kernel gave them, which smaps counts elsewhere).
  const MappedFile& mapping = model->file().mapping();
  const double huge_fraction =
      mapping.file_backed()
          ? double(file_pmd_mapped_bytes(mapping.bytes().data(), mapping.size())) / double(mapping.size())
          : 0.0;
  ESSAIM_ASSIGN_OR_RETURN(std::vector<SpeedResult> rows,
                          measure_model_speed(*model, experts, &pool,
                                              {.n_prompt = a.n_prompt, .n_gen = a.n_gen, .reps = a.reps}));

  const double bytes_per_token = double(info.active_bytes_per_token);
  json doc{{"model", a.model},           {"arch", info.arch},
           {"n_layer", info.n_layer},    {"file_bytes", model->file().file_size()},
           {"cpu", cpu_model_name()},    {"isa", std::string(isa_name(kernels_isa()))},
           {"threads", pool.size()},     {"reps", a.reps},
           {"mlock", a.mlock},           {"no_mmap", a.no_mmap},
           {"keep_page_cache", a.keep_page_cache},
           {"mapped_in_2mib_pages", huge_fraction},
           {"prefetch_bytes", weight_prefetch_bytes()},
           {"amx", amx_enabled()},
           {"lanes", lanes_enabled()},
           {"row_lanes", rowlanes_enabled()},
           {"read_gb_per_s", bw.read_gb_per_s},
           {"read_gb_per_s_best", bw.read_gb_per_s_best},
           {"tests", json::array()}};
  for (const SpeedResult& r : rows) {
    json t{{"test", r.name},         {"n_prompt", r.n_prompt},   {"n_gen", r.n_gen},
           {"avg_ts", r.avg_ts},     {"stddev_ts", r.stddev_ts}, {"median_ts", r.median_ts},
           {"samples_s", r.seconds}};
    if (r.n_gen > 0) {
      const double gb_per_s = bytes_per_token * r.median_ts / 1e9;
      t["bytes_per_token"] = info.active_bytes_per_token;
      t["weight_gb_per_s"] = gb_per_s;
      // Against the fastest probe repetition: on a loaded machine the median understates the bandwidth
      // and so overstates the fraction; the best one errs the other way, which is the honest side.
      t["fraction_of_read_bandwidth"] = gb_per_s / bw.read_gb_per_s_best;
      // Apart from the fraction, which is the weight stream's: a hybrid model's token also reads and writes
      // back its sequence's recurrent state (qwen35moe's 122B shapes: 4.3 MB per Gated DeltaNet layer).
      t["recurrent_state_bytes"] = info.recurrent_state_bytes;
    }
    doc["tests"].push_back(std::move(t));
  }
  if (a.json_out) {
    std::printf("%s\n", doc.dump(2).c_str());
    return Status::ok();
  }
  std::printf("| model | size | threads | isa | test | t/s | MB/token | %% of read bw |\n");
  std::printf("| --- | ---: | ---: | --- | --- | ---: | ---: | ---: |\n");
  for (const json& t : doc["tests"]) {
    std::string extra = "| | ";
    if (t.contains("bytes_per_token")) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "| %.1f | %.0f %% ", bytes_per_token / 1e6,
                    100 * t["fraction_of_read_bandwidth"].get<double>());
      extra = buf;
    }
    std::printf("| %s %dL | %.2f GiB | %zu | %s | %s | %.2f ± %.2f %s|\n", info.arch.c_str(), info.n_layer,
                double(model->file().file_size()) / double(1ull << 30), pool.size(),
                (std::string(isa_name(kernels_isa())) + (amx_enabled() ? "+amx" : "")).c_str(),
                t["test"].get<std::string>().c_str(),
                t["avg_ts"].get<double>(), t["stddev_ts"].get<double>(), extra.c_str());
  }
  std::printf("\nread bandwidth (same run, %zu threads): %.1f GB/s median, %.1f GB/s best; CPU: %s\n", pool.size(),
              bw.read_gb_per_s, bw.read_gb_per_s_best, cpu_model_name().c_str());
  if (info.recurrent_state_bytes > 0 && a.n_gen > 0)
    std::printf("a decoded token also reads and writes back %.1f MB of recurrent state (not in MB/token)\n",
                double(info.recurrent_state_bytes) / 1e6);
  if (mapping.file_backed()) std::printf("model mapped in 2 MiB pages: %.0f %%\n", 100 * huge_fraction);
  return Status::ok();
}

}  // namespace

void register_bench(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand("bench", "Prompt and generation speed (llama-bench-like) and % of read bandwidth");
  cmd->add_option("-m,--model", args->model, "GGUF model file")->required();
  cmd->add_option("-p,--n-prompt", args->n_prompt, "Prompt tokens of the pp test (default 512; 0: none)")
      ->check(CLI::Range(0, 65536));
  cmd->add_option("-n,--n-gen", args->n_gen, "Generated tokens of the tg test (default 64; 0: none)")
      ->check(CLI::Range(0, 65536));
  cmd->add_option("-r,--repetitions", args->reps, "Timed repetitions of each test (default 3)")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("-t,--threads", args->threads, "Threads (default: all cores)")->check(kNonNegative);
  cmd->add_flag("--json", args->json_out, "Print one JSON document instead of the table");
  cmd->add_flag("--mlock", args->mlock,
                "Read the model into RAM and pin it there (as run --mlock): no page of it is reclaimed while timing");
  add_no_mmap_flag(*cmd, args->no_mmap);
  add_keep_page_cache_flag(*cmd, args->keep_page_cache);
  cmd->add_option("--bandwidth-mb", args->bandwidth_mb, "Buffer of the read-bandwidth probe in MiB (default 512)")
      ->check(CLI::Range(16, 1 << 16));
  cmd->callback([args, &exit_code] {
    Status s = run_bench(*args);
    if (!s) {
      std::fprintf(stderr, "essaim bench: %s\n", s.message().c_str());
      exit_code = 1;
      return;
    }
    exit_code = 0;
  });
}

}  // namespace essaim::cli
