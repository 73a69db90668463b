// Batched decode steps without HTTP (serve_bench is the serving benchmark through HTTP): aggregate generated
// tok/s and per-token latency of continuous decoding at 1, 4, 16 and 64 concurrent sequences, monolithic
// and sharded over 4 `essaim-worker` processes with an injected round trip of 0, 5 and 20 ms per request
// (bench/support/delay_proxy.h; netem is not available here). It drives
// Model::forward_batch exactly as the serve scheduler does each step: N sequences prefilled together, then
// greedy decode steps of all N at once (one row each), so each MoE layer of a step sends each worker one
// request for the whole batch. Prints one JSON document; per-token latency is the step time (each sequence
// gets one token per step), median and p90 over the timed steps.
//
//   build/bench/batch_steps_bench                                   # tiny synth qwen3moe, 8 layers, q4_k_m
//   build/bench/batch_steps_bench --seqs 1,64 --rtt-ms 20 --decode 8
//   build/bench/batch_steps_bench --preset q35-122b --layers 2 --seqs 1,16 --rtt-ms 20 --decode 4
//
// Every run's tokens must equal the monolithic tokens of the same sequences (sequence i has the same prompt
// whatever N is, and batch invariance makes its tokens independent of N), with no fallback, or the
// benchmark refuses to report: a fast wrong answer is not a result.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backbone/remote_executor.h"
#include "core/thread_pool.h"
#include "batch_decode.h"
#include "decode_steps.h"
#include "delay_proxy.h"
#include "model/model.h"
#include "worker_processes.h"

namespace essaim {
namespace {

using json = nlohmann::json;

struct Options {
  std::string model;
  std::string data_dir = "bench-data";
  std::string worker_bin;
  std::string preset = "tiny";
  uint32_t layers = 8;
  int workers = 4;
  int worker_threads = 1;
  int threads = 2;
  std::vector<int> seqs = {1, 4, 16, 64};
  std::vector<int> rtt_ms = {0, 5, 20};
  int prompt = 8;
  int decode = 8;
  int timeout_ms = 60000;
};

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "batch_steps_bench: %s\n", what.c_str());
  std::exit(1);
}

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(q * double(v.size())))];
}

using bench::cpu_name;
using bench::load_average;

std::string ensure_model(const Options& o) {
  if (!o.model.empty()) return o.model;
  Result<std::string> path = bench::ensure_synth_model(o.data_dir, o.preset, o.layers, "batch_steps_bench");
  if (!path) die(path.status().message());
  return *path;
}

// The serve scheduler's loop (bench/support/batch_decode.h); a failed step ends the benchmark.
using Run = bench::BatchRun;
Run continuous_decode(const Model& m, const Options& o, int N, ExpertExecutor& ex,
                      const backbone::RemoteExpertExecutor* remote, ThreadPool& pool) {
  Result<Run> r = bench::batch_decode(m, {.prompt = o.prompt, .decode = o.decode}, N, ex, remote, pool);
  if (!r) die(r.status().message());
  return std::move(*r);
}

json row(const std::string& executor, int rtt, int N, const Run& r, double tps_1, int moe_layers) {
  const double tps = r.tokens_per_s(N);
  json j = {{"executor", executor},
            {"rtt_ms", rtt},
            {"sequences", N},
            {"tokens_per_s", tps},
            {"latency_ms_median", 1e3 * quantile(r.step_s, 0.5)},
            {"latency_ms_p90", 1e3 * quantile(r.step_s, 0.9)},
            {"prefill_ms", 1e3 * r.prefill_s},
            {"speedup_vs_1_sequence", tps_1 > 0 ? tps / tps_1 : 1.0}};
  if (executor != "monolithic") {
    const double calls = double(r.after.layer_calls - r.before.layer_calls);
    j["layer_calls_per_step"] = calls / double(r.step_s.size());
    j["requests_per_layer_call"] = double(r.after.requests - r.before.requests) / std::max(calls, 1.0);
    j["wire_bytes_per_step"] = double(r.after.bytes_sent() + r.after.bytes_received() - r.before.bytes_sent() -
                                      r.before.bytes_received()) / double(r.step_s.size());
    if (calls != double(moe_layers) * double(r.step_s.size())) die("not one executor call per MoE layer per step");
  }
  return j;
}

int run(const Options& o) {
  if (o.worker_bin.empty()) die("--worker-bin is required when the default path does not exist");
  const std::string path = ensure_model(o);
  Result<std::unique_ptr<Model>> loaded = load_model(path);
  if (!loaded) die(loaded.status().message());
  const Model& m = **loaded;
  Result<std::vector<std::vector<std::string>>> slices = bench::ensure_slices(m, path, o.workers, o.data_dir);
  if (!slices) die(slices.status().message());
  {  // fault the mapping in: the timings should see RAM, not the disk
    const auto bytes = m.file().mapping().bytes();
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < bytes.size(); i += 4096) sink = sink + bytes[i];
  }
  std::vector<bench::WorkerProcess> procs;
  for (const auto& s : *slices) {
    Result<bench::WorkerProcess> w = bench::start_worker(o.worker_bin, o.worker_threads, s);
    if (!w) die(w.status().message());
    procs.push_back(*w);
  }
  ThreadPool pool(size_t(o.threads));
  LocalExpertExecutor local(m.expert_store(), &pool);
  const int max_n = *std::max_element(o.seqs.begin(), o.seqs.end());
  const int moe_layers = m.info().n_layer;
  const double load_before = load_average();

  // The reference: the monolithic tokens of every sequence, from the largest batch.
  const Run reference = continuous_decode(m, o, max_n, local, nullptr, pool);
  auto check = [&](const Run& r, int N, const std::string& what) {
    for (int i = 0; i < N; ++i)
      if (r.tokens[size_t(i)] != reference.tokens[size_t(i)])
        die(what + ", " + std::to_string(N) + " sequences: sequence " + std::to_string(i) +
            " generated other tokens than the monolithic run");
  };

  json rows = json::array();
  std::vector<std::string> table;
  double goal_ratio = -1;
  auto add = [&](const std::string& executor, int rtt, int N, const Run& r, double& tps_1) {
    json j = row(executor, rtt, N, r, tps_1, moe_layers);
    if (N == 1) tps_1 = j["tokens_per_s"].get<double>(), j["speedup_vs_1_sequence"] = 1.0;
    if (executor != "monolithic" && rtt == 20 && N == 64) goal_ratio = j["speedup_vs_1_sequence"].get<double>();
    char line[256];
    std::snprintf(line, sizeof line, "| %s | %d | %d | %.1f | %.1f | %.1f | %.1fx |", executor.c_str(), rtt, N,
                  j["tokens_per_s"].get<double>(), j["latency_ms_median"].get<double>(),
                  j["latency_ms_p90"].get<double>(), j["speedup_vs_1_sequence"].get<double>());
    table.push_back(line);
    std::fprintf(stderr, "batch_steps_bench: %s\n", line);
    rows.push_back(j);
  };

  double tps_1 = 0;
  for (int N : o.seqs) {
    const Run r = N == max_n ? reference : continuous_decode(m, o, N, local, nullptr, pool);
    check(r, N, "monolithic");
    add("monolithic", 0, N, r, tps_1);
  }
  const std::string sharded = std::to_string(o.workers) + " workers";
  for (int rtt : o.rtt_ms) {
    Result<bench::DelayedWorkers> delayed = bench::behind_delay(procs, rtt);
    if (!delayed) die(delayed.status().message());
    const backbone::ExpertMap& map = delayed->map;
    backbone::DispatchOptions dopt;
    dopt.timeout = std::chrono::milliseconds(o.timeout_ms);
    dopt.link.connect_timeout = std::chrono::seconds(60);
    Result<std::unique_ptr<backbone::RemoteExpertExecutor>> remote =
        backbone::remote_executor_for_model(m, map, &pool, dopt);
    if (!remote) die(remote.status().message());
    if ((*remote)->connected() != size_t(o.workers)) die("not every worker connected: " + (*remote)->stats().to_json());
    tps_1 = 0;
    for (int N : o.seqs) {
      const Run r = continuous_decode(m, o, N, **remote, remote->get(), pool);
      check(r, N, sharded + " at " + std::to_string(rtt) + " ms");
      if ((*remote)->stats().fallbacks() > 0) die("fallbacks during the benchmark: " + (*remote)->stats().to_json());
      add(sharded, rtt, N, r, tps_1);
    }
    remote->reset();  // links closed before the proxies go
  }
  bench::stop_workers(procs);

  json doc;
  doc["benchmark"] = "serve";
  doc["cpu"] = cpu_name();
  doc["model"] = path;
  doc["n_embd"] = m.info().n_embd;
  doc["moe_layers"] = moe_layers;
  doc["n_expert"] = m.info().n_expert;
  doc["n_expert_used"] = m.info().n_expert_used;
  doc["workers"] = o.workers;
  doc["worker_threads"] = o.worker_threads;
  doc["backbone_threads"] = pool.size();
  doc["prompt_tokens"] = o.prompt;
  doc["timed_decode_steps"] = o.decode;
  doc["load_average"] = {load_before, load_average()};
  doc["rows"] = rows;
  doc["tokens_identical"] = true;
  if (goal_ratio >= 0)
    doc["goal"] = {{"what", "at 20 ms RTT, 64 sequences give >= 32x the aggregate tok/s of one"},
                   {"ratio", goal_ratio},
                   {"met", goal_ratio >= 32.0}};
  std::printf("%s\n", doc.dump(2).c_str());
  std::fprintf(stderr, "| executor | RTT ms | sequences | tok/s | latency median ms | p90 ms | vs 1 seq |\n");
  for (const std::string& l : table) std::fprintf(stderr, "%s\n", l.c_str());
  return 0;
}

}  // namespace
}  // namespace essaim

int main(int argc, char** argv) {
  essaim::Options o;
  o.worker_bin = essaim::bench::default_worker_binary(argv[0]);
  CLI::App app{"essaim serving benchmark: continuous batched decode, monolithic vs workers behind an injected RTT"};
  app.add_option("--model", o.model, "GGUF file (default: a synth qwen3moe, written once)");
  app.add_option("--preset", o.preset, "Synth preset when no --model: tiny (default) or q35-122b");
  app.add_option("--layers", o.layers, "Layers of the synth model (default 8)")->check(CLI::Range(1, 48));
  app.add_option("--data-dir", o.data_dir, "Where the synth model and its slices are written once (default ./bench-data)");
  app.add_option("--workers", o.workers, "Worker processes (default 4)")->check(CLI::Range(1, 64));
  app.add_option("--worker-threads", o.worker_threads, "Threads per worker (default 1)")->check(CLI::Range(1, 256));
  app.add_option("--worker-bin", o.worker_bin, "essaim-worker binary (default: <build>/src/cli/essaim-worker)");
  app.add_option("--threads", o.threads, "Backbone threads (default 2)")->check(CLI::Range(1, 256));
  app.add_option("--seqs", o.seqs, "Concurrent sequences (default 1,4,16,64)")->delimiter(',')->check(CLI::Range(1, 1024));
  app.add_option("--rtt-ms", o.rtt_ms, "Injected round trips per request in ms (default 0,5,20)")
      ->delimiter(',')->check(CLI::Range(0, 10000));
  app.add_option("--prompt", o.prompt, "Prompt tokens per sequence (default 8)")->check(CLI::Range(1, 4096));
  app.add_option("--decode", o.decode, "Timed decode steps (default 8; one more warms up)")->check(CLI::Range(1, 4096));
  app.add_option("--timeout-ms", o.timeout_ms, "Worker deadline (default 60000: no fallback on a loaded machine)");
  CLI11_PARSE(app, argc, argv);
  return essaim::run(o);
}
