// The throughput fabric's benchmark: aggregate tok/s of a backbone serving concurrent greedy sequences through
// the serve scheduler, against the number of workers (1, 2, 4, 8 `essaim-worker` processes, the experts of
// every layer cut into that many ranges) and the batch (1, 16, 64 concurrent sequences), at an injected round
// trip (20 ms: a DelayProxy per worker, bench/support/swarm_harness.h), with f32 and bf16 expert outputs
// (`--expert-output`), and the wire bytes per token per MoE layer from the dispatch counters. The reference
// measured in the same run is the monolithic backbone (the local executor in the same output mode) serving the
// same sequences; every sharded sequence must give the monolithic tokens, with no fallback, or the benchmark
// refuses to report. Then rows/s of one worker's expert FFN at 512 rows per expert at the 122B shapes beside
// the machine's roofline (the int8 peak and the read bandwidth, measured in the same run; bench/support/
// expert_rows.h). Prints one JSON document, and the table as markdown on stderr.
//
//   build/bench/fabric_bench --data-dir /tmp/essaim-bench                      # the default grid (minutes)
//                                       # (tiny synth qwen3moe, 8 layers, 16 experts top-2, Q4_K_M)
//   build/bench/fabric_bench --workers 1,8 --seqs 64 --outputs bf16 --no-rows-512
//   build/bench/fabric_bench --preset q35-122b --layers 2 --decode 4           # the 122B shapes (~3 GB file)
//   build/bench/fabric_bench --backbone-flags "--worker-timeout-ms 5000 --hedge-factor 0"
//
// The backbone is built from `essaim serve`'s own swarm flags (cli/dispatch_flags.h into
// backbone/swarm_setup.h): --backbone-flags is parsed by the same code, so any backbone flag works here as
// it does there (e.g. a hot-expert cache once the backbone has one); the bench itself sets --worker (the proxies) and --expert-output (the mode of the row).
// tok/s counts every generated token over the wall time from submit to the last sequence's end (prefill
// included); decode tok/s counts the tokens after each sequence's first over the time after the last first
// token. Latencies are per sequence, submit to end.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cli/dispatch_flags.h"
#include "core/ggml_type.h"
#include "core/thread_pool.h"
#include "decode_steps.h"
#include "expert_rows.h"
#include "model/model.h"
#include "speed/memory_bandwidth.h"
#include "swarm_harness.h"
#include "swarm_requests.h"
#include "synth/synth.h"

namespace essaim {
namespace {

using json = nlohmann::json;

struct Options {
  std::string model;
  std::string data_dir = "bench-data";
  std::string worker_bin;
  std::string preset = "tiny";
  uint32_t layers = 8;
  uint32_t experts = 16;  // tiny preset only: enough for 8 workers to hold 2 each
  std::vector<int> workers = {1, 2, 4, 8};
  std::vector<int> seqs = {1, 16, 64};
  std::vector<std::string> outputs = {"f32", "bf16"};
  int rtt_ms = 20;
  int jitter_ms = 0;
  int worker_threads = 1;
  int threads = 2;
  int prompt = 8;
  int decode = 16;
  int timeout_ms = 60000;
  std::string backbone_flags;
  bool rows_512 = true;
  bool warmup = true;
  int roofline_threads = 0;
  int roofline_reps = 3;
};

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "fabric_bench: %s\n", what.c_str());
  std::exit(1);
}

std::string ensure_model(const Options& o) {
  if (!o.model.empty()) return o.model;
  if (o.preset == "q35-122b") {
    Result<std::string> p = bench::ensure_q35_122b_model(o.data_dir, o.layers, "fabric_bench");
    if (!p) die(p.status().message());
    return *p;
  }
  if (o.preset != "tiny") die("--preset is tiny or q35-122b");
  const std::string path = o.data_dir + "/qwen3moe-tiny-" + std::to_string(o.layers) + "l-" +
                           std::to_string(o.experts) + "x-q4_k_m.gguf";
  if (std::filesystem::exists(path)) return path;
  std::filesystem::create_directories(o.data_dir);
  Result<SynthPlan> plan = synth_plan({.arch = SynthArch::QWEN3MOE, .preset = SynthPreset::TINY, .layers = o.layers,
                                       .experts = o.experts, .types = SynthTypeMix::Q4_K_M, .seed = 1});
  if (!plan) die(plan.status().message());
  std::fprintf(stderr, "fabric_bench: writing %s\n", path.c_str());
  Result<SynthSummary> s = synth_write(*plan, path + ".part");
  if (!s) die(s.status().message());
  std::filesystem::rename(path + ".part", path);
  return path;
}

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(q * double(v.size())))];
}

serve::SchedulerOptions scheduler_options(const Options& o, int n) {
  return {.parallel = n, .batch_tokens = std::max(512, n * o.prompt), .queue_capacity = 0,
          .cache = {.n_ctx = o.prompt + o.decode + 4}};
}

bench::ServedRun serve(const Model& m, ExpertExecutor* ex, ThreadPool* pool, const Options& o, int n) {
  const std::vector<serve::SequenceRequest> reqs = bench::greedy_requests(m, n, o.prompt, o.decode, /*seed=*/1);
  Result<bench::ServedRun> r = bench::serve_concurrently(m, ex, pool, reqs, scheduler_options(o, n),
                                                         std::chrono::minutes(30));
  if (!r) die(r.status().message());
  for (const bench::ServedRequest& q : r->requests)
    if (q.reason != serve::FinishReason::LENGTH) die("a sequence ended early: " + q.error);
  return *r;
}

// Untimed, once per executor: the largest batch for 2 tokens, so the timed runs find the weights (backbone
// and workers) in their page tables and the links' round trips measured.
void warm_up(const Model& m, ExpertExecutor* ex, ThreadPool* pool, const Options& o) {
  if (!o.warmup) return;
  Options w = o;
  w.decode = 2;
  (void)serve(m, ex, pool, w, *std::max_element(o.seqs.begin(), o.seqs.end()));
}

json rates(const bench::ServedRun& r, int n) {
  std::vector<double> latency;
  double last_first = 0;
  for (const bench::ServedRequest& q : r.requests) {
    latency.push_back(q.latency_s);
    last_first = std::max(last_first, q.first_token_s);
  }
  const double decode_s = r.wall_s - last_first;
  return {{"sequences", n},
          {"tokens_per_s", double(r.generated) / r.wall_s},
          {"decode_tokens_per_s", decode_s > 0 ? double(r.generated - uint64_t(n)) / decode_s : 0.0},
          {"latency_s_median", quantile(latency, 0.5)},
          {"latency_s_p90", quantile(latency, 0.9)},
          {"steps", r.scheduler.steps}};
}

// The backbone `essaim serve` would build from these flags, dispatching to `addresses` in `mode`.
backbone::ExecutorChoice backbone(const Model& m, ThreadPool* pool, const Options& o,
                             const std::vector<std::string>& addresses, const std::string& mode) {
  backbone::SwarmSetup flags;
  flags.timeout_ms = o.timeout_ms;
  CLI::App parser{"backbone flags"};
  cli::add_dispatch_flags(parser, flags);
  try {
    parser.parse(o.backbone_flags, /*program_name_included=*/false);
  } catch (const CLI::ParseError& e) {
    die("--backbone-flags: " + std::string(e.what()));
  }
  if (!flags.workers.empty() || !flags.expert_map.empty() || !flags.coordinator.empty())
    die("--backbone-flags: the bench gives the workers itself (no --worker, --expert-map or --coordinator)");
  if (flags.expert_output != "f32") die("--backbone-flags: the bench sets --expert-output per row (--outputs)");
  flags.workers = addresses;
  flags.expert_output = mode;
  Result<backbone::ExecutorChoice> ex = backbone::make_expert_executor(m, pool, flags, "fabric_bench");
  if (!ex) die(ex.status().message());
  if (!ex->remote) die("the backbone did not build a dispatcher");
  // The first handshake hashes the claimed experts (the weights check); with big experts that can outlast the
  // connect deadline, and the retry after the backoff finds the digests cached.
  for (int i = 0; i < 900 && ex->remote->connected() != addresses.size(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  if (ex->remote->connected() != addresses.size()) die("not every worker connected: " + ex->remote->stats().to_json());
  return std::move(*ex);
}

json rows_512(const Options& o) {
  ThreadPool pool(size_t(o.roofline_threads));
  json out = {{"threads", pool.size()}, {"rows_per_expert", 512}, {"experts_per_call", bench::kExpertsPerCall}};
  out["int8_peak"] = bench::int8_peak(&pool);
  const Bandwidth bw = measure_bandwidth({.bytes = 512 << 20, .reps = 5, .copy = false}, &pool);
  out["read_gb_per_s"] = bw.read_gb_per_s;
  const double peak = out["int8_peak"]["int8_gops_per_s"].get<double>() * 1e9;
  const double ops_per_row = 2.0 * 3 * bench::kExpertEmbd * double(bench::kExpertFf);  // gate + up + down
  out["cases"] = json::array();
  for (GgmlType down : {GgmlType::Q4_K, GgmlType::Q6_K}) {
    const int32_t n_experts = 2 * bench::kExpertsPerCall;
    const bench::ExpertWeights ex = bench::make_expert_weights(down, n_experts);
    int next = 0;
    json r = bench::time_expert_batch(ex, n_experts, 512, o.roofline_reps, &pool, next);
    // The roofline of this batch: compute-bound at the int8 peak, memory-bound at reading the 8 experts once.
    const double call_rows = 512.0 * bench::kExpertsPerCall;
    const double weight_bytes = double(bench::kExpertsPerCall) *
                                double(ex.layer.gate.expert_stride + ex.layer.up.expert_stride + ex.layer.down.expert_stride);
    const double compute_bound = peak / ops_per_row;
    const double memory_bound = call_rows / (weight_bytes / (bw.read_gb_per_s * 1e9));
    r["down_type"] = std::string(type_name(down));
    r["roofline_rows_per_s"] = std::min(compute_bound, memory_bound);
    r["compute_bound_rows_per_s"] = compute_bound;
    r["memory_bound_rows_per_s"] = memory_bound;
    r["fraction_of_roofline"] = r["rows_per_s"].get<double>() / std::min(compute_bound, memory_bound);
    // Per CPU-second too (the machine is shared: wall time also counts other work's share of the cores).
    const double per_thread_peak = out["int8_peak"]["int8_gops_per_cpu_s_per_thread"].get<double>() * 1e9;
    r["rows_per_cpu_s"] = r["gflop_per_cpu_s"].get<double>() * 1e9 / ops_per_row;
    r["fraction_of_int8_peak_per_cpu_s"] = r["rows_per_cpu_s"].get<double>() / (per_thread_peak / ops_per_row);
    std::fprintf(stderr,
                 "fabric_bench: one worker, 512 rows/expert, down %s: %.0f rows/s (roofline %.0f, %.0f%%), "
                 "%.0f rows per CPU-s (%.0f%% of the int8 peak per CPU-s)\n",
                 std::string(type_name(down)).c_str(), r["rows_per_s"].get<double>(),
                 r["roofline_rows_per_s"].get<double>(), 100 * r["fraction_of_roofline"].get<double>(),
                 r["rows_per_cpu_s"].get<double>(), 100 * r["fraction_of_int8_peak_per_cpu_s"].get<double>());
    out["cases"].push_back(r);
  }
  out["gpu_reference_rows_per_s"] = {{"value", 53000},
                                     {"what", "the seeds' figure for one GPU worker at batch 512 (quoted, not measured here)"}};
  return out;
}

int run(const Options& o) {
  if (o.worker_bin.empty()) die("--worker-bin is required when the default path does not exist");
  for (const std::string& mode : o.outputs)
    if (mode != "f32" && mode != "bf16") die("--outputs takes f32 and/or bf16");
  const double load_before = bench::load_average();
  const std::string path = ensure_model(o);
  Result<std::unique_ptr<Model>> loaded = load_model(path);
  if (!loaded) die(loaded.status().message());
  const Model& m = **loaded;
  {  // fault the mapping in: the timings should see RAM, not the disk
    const auto bytes = m.file().mapping().bytes();
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < bytes.size(); i += 4096) sink = sink + bytes[i];
  }
  for (int n : o.workers)
    if (n > m.info().n_expert)
      die(std::to_string(n) + " workers but " + std::to_string(m.info().n_expert) +
          " experts per layer: every worker needs at least one (--experts)");
  int moe_layers = 0;
  for (int32_t l = 0; l < m.expert_store().n_layers(); ++l) moe_layers += m.expert_store().ranges(l).empty() ? 0 : 1;
  ThreadPool pool(size_t(o.threads));
  const int max_n = *std::max_element(o.seqs.begin(), o.seqs.end());

  // The monolithic reference, per output mode: its tokens (sequence i's prompt does not depend on the batch,
  // and batch invariance makes its tokens independent of it) and its tok/s at every batch.
  json rows = json::array();
  std::vector<std::string> table;
  std::vector<std::vector<std::vector<int32_t>>> want(o.outputs.size());  // [mode][sequence] tokens
  std::vector<std::vector<double>> mono_tps(o.outputs.size());            // [mode][batch index]
  for (size_t mi = 0; mi < o.outputs.size(); ++mi) {
    LocalExpertExecutor local(m.expert_store(), &pool, o.outputs[mi] == "bf16" ? ExpertOutput::BF16 : ExpertOutput::F32);
    warm_up(m, &local, &pool, o);
    for (int n : o.seqs) {
      const bench::ServedRun r = serve(m, &local, &pool, o, n);
      if (n == max_n)
        for (const bench::ServedRequest& q : r.requests) want[mi].push_back(q.tokens);
      json j = rates(r, n);
      j["executor"] = "monolithic";
      j["workers"] = 0;
      j["expert_output"] = o.outputs[mi];
      mono_tps[mi].push_back(j["tokens_per_s"].get<double>());
      rows.push_back(j);
      char line[200];
      std::snprintf(line, sizeof line, "| monolithic | — | %s | %d | %.1f | %.1f | %.2f | — |", o.outputs[mi].c_str(), n,
                    j["tokens_per_s"].get<double>(), j["decode_tokens_per_s"].get<double>(),
                    j["latency_s_median"].get<double>());
      table.push_back(line);
      std::fprintf(stderr, "fabric_bench: %s\n", line);
    }
  }
  auto check = [&](const bench::ServedRun& r, size_t mi, const std::string& what) {
    for (size_t i = 0; i < r.requests.size(); ++i)
      if (r.requests[i].tokens != want[mi][i])
        die(what + ": sequence " + std::to_string(i) + " generated other tokens than the monolithic run");
  };

  for (int n_workers : o.workers) {
    Result<std::vector<std::vector<std::string>>> slices = bench::ensure_slices(m, path, n_workers, o.data_dir);
    if (!slices) die(slices.status().message());
    const int one_way_us = o.rtt_ms * 500, jitter_us = o.jitter_ms * 500;
    Result<std::unique_ptr<bench::Swarm>> swarm = bench::Swarm::start(
        {.worker_bin = o.worker_bin, .parts = *slices, .replicas = 1,
         .speed = [&](int, int) {
           return bench::NodeSpeed{.one_way = std::chrono::microseconds(one_way_us),
                                   .jitter = std::chrono::microseconds(jitter_us), .threads = o.worker_threads};
         },
         .seed = 1});
    if (!swarm) die(swarm.status().message());
    std::vector<std::string> addresses;
    for (const backbone::WorkerEndpoint& w : (*swarm)->map().workers) addresses.push_back(w.address);
    for (size_t mi = 0; mi < o.outputs.size(); ++mi) {
      backbone::ExecutorChoice ex = backbone(m, &pool, o, addresses, o.outputs[mi]);
      warm_up(m, ex.executor.get(), &pool, o);
      for (size_t si = 0; si < o.seqs.size(); ++si) {
        const int n = o.seqs[si];
        const backbone::DispatchStats before = ex.remote->stats();
        const bench::ServedRun r = serve(m, ex.executor.get(), &pool, o, n);
        const backbone::DispatchStats after = ex.remote->stats();
        const std::string what = std::to_string(n_workers) + " workers, " + o.outputs[mi] + ", " + std::to_string(n) +
                                 " sequences";
        check(r, mi, what);
        if (after.fallbacks() > before.fallbacks()) die(what + ": fallbacks during the benchmark: " + after.to_json());
        if (after.pairs_local > before.pairs_local) die(what + ": pairs computed on the backbone: " + after.to_json());
        const double token_layers = r.scheduler.batch_rows.sum() * double(moe_layers);
        json j = rates(r, n);
        j["executor"] = "workers";
        j["workers"] = n_workers;
        j["expert_output"] = o.outputs[mi];
        j["rtt_ms"] = o.rtt_ms;
        j["jitter_ms"] = o.jitter_ms;
        j["wire_bytes_sent_per_token_per_layer"] = double(after.bytes_sent() - before.bytes_sent()) / token_layers;
        j["wire_bytes_received_per_token_per_layer"] =
            double(after.bytes_received() - before.bytes_received()) / token_layers;
        j["pairs_per_token_per_layer"] = double(after.pairs_remote - before.pairs_remote) / token_layers;
        j["requests_per_layer_call"] =
            double(after.requests - before.requests) / std::max<double>(1, double(after.layer_calls - before.layer_calls));
        j["hedges"] = after.hedges - before.hedges;
        j["vs_monolithic"] = j["tokens_per_s"].get<double>() / mono_tps[mi][si];
        rows.push_back(j);
        char line[240];
        std::snprintf(line, sizeof line, "| %d workers | %d | %s | %d | %.1f | %.1f | %.2f | %.0f / %.0f |", n_workers,
                      o.rtt_ms, o.outputs[mi].c_str(), n, j["tokens_per_s"].get<double>(),
                      j["decode_tokens_per_s"].get<double>(), j["latency_s_median"].get<double>(),
                      j["wire_bytes_sent_per_token_per_layer"].get<double>(),
                      j["wire_bytes_received_per_token_per_layer"].get<double>());
        table.push_back(line);
        std::fprintf(stderr, "fabric_bench: %s\n", line);
      }
      ex.executor.reset();  // links closed before the proxies go
    }
  }

  json doc;
  doc["benchmark"] = "fabric";
  doc["cpu"] = cpu_model_name();
  doc["hardware_threads"] = std::thread::hardware_concurrency();
  doc["model"] = path;
  doc["n_embd"] = m.info().n_embd;
  doc["moe_layers"] = moe_layers;
  doc["n_expert"] = m.info().n_expert;
  doc["n_expert_used"] = m.info().n_expert_used;
  doc["backbone_threads"] = pool.size();
  doc["worker_threads"] = o.worker_threads;
  doc["backbone_flags"] = o.backbone_flags;
  doc["prompt_tokens"] = o.prompt;
  doc["generated_tokens_per_sequence"] = o.decode;
  doc["reference"] = "monolithic backbone (local executor, same output mode) serving the same sequences";
  doc["rows"] = rows;
  doc["tokens_identical"] = true;
  if (o.rows_512) doc["rows_512_per_worker"] = rows_512(o);
  doc["load_average"] = {load_before, bench::load_average()};
  std::printf("%s\n", doc.dump(2).c_str());
  std::fprintf(stderr, "| backbone | RTT ms | outputs | sequences | tok/s | decode tok/s | latency median s | wire B/token/layer sent / received |\n");
  for (const std::string& l : table) std::fprintf(stderr, "%s\n", l.c_str());
  return 0;
}

}  // namespace
}  // namespace essaim

int main(int argc, char** argv) {
  essaim::Options o;
  o.worker_bin = essaim::bench::default_worker_binary(argv[0]);
  CLI::App app{"essaim fabric benchmark: aggregate tok/s vs workers and batch at an injected RTT, f32 vs bf16"};
  app.add_option("--model", o.model, "GGUF file (default: a synth qwen3moe, written once)");
  app.add_option("--preset", o.preset, "Synth preset when no --model: tiny (default) or q35-122b");
  app.add_option("--layers", o.layers, "Layers of the synth model (default 8)")->check(CLI::Range(1, 48));
  app.add_option("--experts", o.experts, "Routed experts per layer of the tiny synth model (default 16)")
      ->check(CLI::Range(2, 1024));
  app.add_option("--data-dir", o.data_dir, "Where the synth model and its slices are written once (default ./bench-data)");
  app.add_option("--worker-bin", o.worker_bin, "essaim-worker binary (default: <build>/src/cli/essaim-worker)");
  app.add_option("--workers", o.workers, "Worker counts (default 1,2,4,8)")->delimiter(',')->check(CLI::Range(1, 64));
  app.add_option("--seqs", o.seqs, "Concurrent sequences (default 1,16,64)")->delimiter(',')->check(CLI::Range(1, 1024));
  app.add_option("--outputs", o.outputs, "Expert output modes (default f32,bf16)")->delimiter(',');
  app.add_option("--rtt-ms", o.rtt_ms, "Injected round trip per request in ms (default 20)")->check(CLI::Range(0, 10000));
  app.add_option("--jitter-ms", o.jitter_ms, "Extra seeded round-trip jitter, uniform in [0, J] ms (default 0)")
      ->check(CLI::Range(0, 10000));
  app.add_option("--worker-threads", o.worker_threads, "Threads per worker (default 1)")->check(CLI::Range(1, 256));
  app.add_option("--threads", o.threads, "Backbone threads (default 2)")->check(CLI::Range(1, 256));
  app.add_option("--prompt", o.prompt, "Prompt tokens per sequence (default 8)")->check(CLI::Range(1, 4096));
  app.add_option("--decode", o.decode, "Generated tokens per sequence (default 16)")->check(CLI::Range(2, 4096));
  app.add_option("--timeout-ms", o.timeout_ms, "Worker deadline (default 60000: no fallback on a loaded machine)");
  app.add_option("--backbone-flags", o.backbone_flags,
                 "Extra `essaim serve` swarm flags for the backbone, one string (e.g. \"--hedge-factor 0\")");
  app.add_flag("!--no-warmup", o.warmup, "Do not run the largest batch for 2 tokens before each timed run");
  app.add_flag("!--no-rows-512", o.rows_512, "Skip rows/s of one worker at 512 rows per expert (122B shapes)");
  app.add_option("--roofline-threads", o.roofline_threads, "Threads of the 512-row worker measurement (0 = all)");
  app.add_option("--roofline-reps", o.roofline_reps, "Timed repetitions at 512 rows (default 3)")->check(CLI::Range(1, 100));
  CLI11_PARSE(app, argc, argv);
  return essaim::run(o);
}
