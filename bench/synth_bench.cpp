// Synthetic-model write throughput: `essaim synth` of Qwen3.5-122B-shaped layers at Q4_K_M, beside the disk
// roofline — a plain sequential write of the same byte count to the same directory — and the generation
// alone (blocks into memory, no I/O), measured in the same run. Prints one JSON document.
//
//   build/bench/synth_bench --dir /tmp --layers 1 --reps 3
//
// Nothing is fsync'ed unless --fsync is given (then both writes fsync before the clock stops): the default
// measures what a user waits for, with the page cache absorbing the data the same way for both writes.
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "core/thread_pool.h"
#include "synth/synth.h"
#include "synth/synth_fill.h"
#include "synth/synth_random.h"
#include "median.h"

namespace essaim {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

using bench::median;

bool fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  const bool ok = fd >= 0 && ::fsync(fd) == 0;
  if (fd >= 0) ::close(fd);
  return ok;
}

// The roofline: `bytes` of incompressible data through fwrite in the writer's chunk size, then fclose.
bool sequential_write(const std::string& path, uint64_t bytes, const std::vector<uint8_t>& chunk) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  bool ok = f != nullptr;
  for (uint64_t done = 0; ok && done < bytes;) {
    const size_t n = size_t(std::min<uint64_t>(chunk.size(), bytes - done));
    ok = std::fwrite(chunk.data(), 1, n, f) == n;
    done += n;
  }
  if (f != nullptr) ok = std::fclose(f) == 0 && ok;
  return ok;
}

// Generation only: every tensor's rows into a reused buffer on the same pool, no I/O.
double generate_only(const SynthPlan& plan, size_t threads) {
  ThreadPool pool(threads);
  const SynthFillContext ctx = synth_fill_context(plan);
  std::vector<uint8_t> buf(size_t(32) << 20);
  const double t0 = now_s();
  for (const SynthTensor& t : plan.tensors) {
    const uint64_t rows = t.rows(), row_bytes = t.nbytes / rows;
    const uint64_t per_chunk = std::max<uint64_t>(1, buf.size() / row_bytes);
    for (uint64_t r0 = 0; r0 < rows; r0 += per_chunk) {
      const uint64_t n = std::min(per_chunk, rows - r0);
      if (buf.size() < n * row_bytes) buf.resize(size_t(n * row_bytes));
      parallel_for(&pool, size_t(n), [&](size_t b, size_t e) {
        synth_fill_rows(ctx, t, r0 + b, r0 + e, buf.data() + b * row_bytes);
      });
    }
  }
  return now_s() - t0;
}

int run(const std::string& dir, const std::string& arch_name, uint32_t layers, int reps, bool do_fsync,
        size_t threads) {
  const SynthArch arch = arch_name == "qwen3moe" ? SynthArch::QWEN3MOE : SynthArch::QWEN35MOE;
  const SynthOptions options{.arch = arch, .preset = SynthPreset::Q35_122B, .layers = layers,
                             .types = SynthTypeMix::Q4_K_M, .seed = 1, .threads = threads};
  Result<SynthPlan> plan = synth_plan(options);
  if (!plan) {
    std::fprintf(stderr, "synth_bench: %s\n", plan.status().message().c_str());
    return 1;
  }
  const std::string model = (fs::path(dir) / "essaim-synth-bench.gguf").string();
  const std::string plain = (fs::path(dir) / "essaim-synth-bench-seq.bin").string();

  std::vector<double> synth_s, seq_s, gen_s;
  uint64_t file_bytes = 0;
  std::vector<uint8_t> chunk(size_t(32) << 20);
  SynthRng rng(7);
  for (size_t i = 0; i + 8 <= chunk.size(); i += 8) {
    const uint64_t r = rng.next();
    std::copy_n(reinterpret_cast<const uint8_t*>(&r), 8, chunk.data() + i);
  }
  for (int r = 0; r < reps; ++r) {
    double t0 = now_s();
    Result<SynthSummary> s = synth_write(*plan, model);
    if (!s || (do_fsync && !fsync_path(model))) {
      std::fprintf(stderr, "synth_bench: %s\n", s ? "fsync failed" : s.status().message().c_str());
      return 1;
    }
    synth_s.push_back(now_s() - t0);
    file_bytes = s->file_bytes;
    fs::remove(model);

    t0 = now_s();
    if (!sequential_write(plain, file_bytes, chunk) || (do_fsync && !fsync_path(plain))) {
      std::fprintf(stderr, "synth_bench: sequential write to %s failed\n", plain.c_str());
      return 1;
    }
    seq_s.push_back(now_s() - t0);
    fs::remove(plain);

    gen_s.push_back(generate_only(*plan, threads));
  }

  const double mb = double(file_bytes) / 1e6;
  const double synth_med = median(synth_s), seq_med = median(seq_s), gen_med = median(gen_s);
  json out = {
      {"bench", "synth_write"},
      {"arch", arch_name},
      {"preset", "q35-122b"},
      {"layers", layers},
      {"types", "q4_k_m"},
      {"tensors", plan->tensors.size()},
      {"file_bytes", file_bytes},
      {"reps", reps},
      {"threads", threads == 0 ? size_t(std::max(1u, std::thread::hardware_concurrency())) : threads},
      {"fsync", do_fsync},
      {"synth_s", synth_s},
      {"synth_s_median", synth_med},
      {"synth_MBps", mb / synth_med},
      {"sequential_write_s", seq_s},
      {"sequential_write_s_median", seq_med},
      {"sequential_write_MBps", mb / seq_med},
      {"generate_only_s_median", gen_med},
      {"generate_only_MBps", mb / gen_med},
      {"synth_vs_sequential_write", seq_med / synth_med},
  };
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace
}  // namespace essaim

int main(int argc, char** argv) {
  CLI::App app{"essaim synth write throughput vs a plain sequential write (JSON)"};
  std::string dir = std::filesystem::temp_directory_path().string();
  std::string arch = "qwen35moe";
  uint32_t layers = 1;
  int reps = 3;
  bool do_fsync = false;
  size_t threads = 0;
  app.add_option("--dir", dir, "Directory to write in (the same for both writes)")->capture_default_str();
  app.add_option("--arch", arch, "qwen35moe | qwen3moe")->check(CLI::IsMember({"qwen35moe", "qwen3moe"}))
      ->capture_default_str();
  app.add_option("--layers", layers, "Layers of the q35-122b preset")->check(CLI::Range(1, 48))->capture_default_str();
  app.add_option("--reps", reps, "Repetitions (median reported)")->check(CLI::Range(1, 50))->capture_default_str();
  app.add_flag("--fsync", do_fsync, "fsync both files before stopping the clock");
  app.add_option("--threads", threads, "Generation threads (0 = all cores)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  return essaim::run(dir, arch, layers, reps, do_fsync, threads);
}
