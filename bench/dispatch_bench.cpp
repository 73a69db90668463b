// Dispatch benchmark: decode tokens/s of the 122B-shaped synth model, monolithic vs sharded over loopback
// TCP to N `essaim-worker` processes (each holding 1/N of every layer's experts), the overhead in %, and the
// bytes on the wire per decoded token per MoE layer. Prints one JSON document; timings are medians of
// per-token times over every timed repetition, the two variants alternating (order rotated per rep).
//
//   build-dispatch/bench/dispatch_bench                                   # 2-layer q35-122b, 4 workers
//   build-dispatch/bench/dispatch_bench --workers 4 --decode 16 --reps 3 --data-dir /tmp/essaim-bench
//   build-dispatch/bench/dispatch_bench --model some.gguf                 # any MoE file
//
// The model is `essaim synth --arch qwen3moe --preset q35-122b --layers 2 --types q4_k_m` (written once into
// --data-dir, same name as model_bench uses), its slices are written once into --data-dir too (named by the
// model's identity, so a changed model gets new slices). The sharded run must
// produce the same tokens as the monolithic one with no fallback, or the benchmark fails: a fast wrong
// answer is not a result. On one machine the workers compete with the backbone for the same cores and
// memory bandwidth, so the overhead measured here is protocol + scheduling + copies, not network latency.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backbone/remote_executor.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "decode_steps.h"
#include "synth/synth.h"
#include "worker_processes.h"

namespace essaim {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string model;
  std::string data_dir = "bench-data";
  std::string worker_bin;
  uint32_t layers = 2;
  int workers = 4;
  int worker_threads = 1;
  int prompt = 8;
  int decode = 16;
  int reps = 3;
  int threads = 0;
  int timeout_ms = 30000;
};

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "dispatch_bench: %s\n", what.c_str());
  std::exit(1);
}

std::string ensure_model(const Options& o) {
  if (!o.model.empty()) return o.model;
  Result<std::string> path = bench::ensure_q35_122b_model(o.data_dir, o.layers, "dispatch_bench");
  if (!path) die(path.status().message());
  return *path;
}

using bench::WorkerProcess;
using Process = WorkerProcess;
using bench::self_cpu_seconds;
using bench::workers_cpu_seconds;

using bench::DecodeRun;
using bench::load_average;
using bench::median;

DecodeRun decode(const Model& m, const std::vector<int32_t>& prompt, int n, ExpertExecutor& experts,
                 const backbone::RemoteExpertExecutor* remote, ThreadPool& pool, const std::vector<Process>& procs) {
  Result<DecodeRun> r = bench::decode_steps(m, prompt, n, experts, remote, pool, procs);
  if (!r) die(r.status().message());
  return std::move(*r);
}

int run(Options o) {
  if (o.worker_bin.empty()) die("--worker-bin is required when the default path does not exist");
  const std::string path = ensure_model(o);
  Result<std::unique_ptr<Model>> loaded = load_model(path);
  if (!loaded) die(loaded.status().message());
  const Model& m = **loaded;
  Result<std::vector<std::vector<std::string>>> sliced = bench::ensure_slices(m, path, o.workers, o.data_dir);
  if (!sliced) die(sliced.status().message());
  const auto& slices = *sliced;
  {  // fault the mapping in: the timings should see RAM, not the disk
    const auto bytes = m.file().mapping().bytes();
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < bytes.size(); i += 4096) sink = sink + bytes[i];
  }

  std::vector<Process> procs;
  backbone::ExpertMap map;
  for (const auto& s : slices) {
    Result<WorkerProcess> w = bench::start_worker(o.worker_bin, o.worker_threads, s);
    if (!w) die(w.status().message());
    procs.push_back(*w);
    map.workers.push_back({.address = procs.back().address, .label = {}, .holdings = std::nullopt});
  }
  ThreadPool pool(size_t(o.threads > 0 ? o.threads : 0));
  LocalExpertExecutor local(m.expert_store(), &pool);
  backbone::DispatchOptions dopt;
  dopt.timeout = std::chrono::milliseconds(o.timeout_ms);
  dopt.link.connect_timeout = std::chrono::seconds(60);
  Result<std::unique_ptr<backbone::RemoteExpertExecutor>> remote = backbone::remote_executor_for_model(m, map, &pool, dopt);
  if (!remote) die(remote.status().message());
  if ((*remote)->connected() != size_t(o.workers)) die("not every worker connected: " + (*remote)->stats().to_json());

  std::mt19937 rng(1);
  std::vector<int32_t> prompt(size_t(o.prompt));
  for (int32_t& t : prompt) t = int32_t(rng() % uint32_t(m.info().n_vocab));

  std::vector<double> mono_s, swarm_s;
  std::vector<double> mono_cpu, swarm_cpu, swarm_backbone_cpu;  // CPU seconds per token, one per rep
  std::vector<int32_t> mono_tokens;
  uint64_t bytes_sent = 0, bytes_received = 0, requests = 0, layer_calls = 0;
  const double load_before = load_average();
  for (int r = 0; r < o.reps + 1; ++r) {  // the first repetition warms up and is not counted
    for (int v = 0; v < 2; ++v) {
      const bool sharded = (v + r) % 2 == 1;
      DecodeRun d = sharded ? decode(m, prompt, o.decode, **remote, remote->get(), pool, procs)
                            : decode(m, prompt, o.decode, local, nullptr, pool, procs);
      if (!sharded) {
        if (!mono_tokens.empty() && mono_tokens != d.tokens) die("the monolithic runs disagree");
        mono_tokens = d.tokens;
      } else {
        if (!mono_tokens.empty() && d.tokens != mono_tokens) die("the sharded tokens differ from the monolithic ones");
        if ((*remote)->stats().fallbacks() > 0) die("fallbacks during the benchmark: " + (*remote)->stats().to_json());
      }
      if (r == 0) continue;
      (sharded ? swarm_s : mono_s).insert((sharded ? swarm_s : mono_s).end(), d.token_s.begin(), d.token_s.end());
      (sharded ? swarm_cpu : mono_cpu).push_back((d.backbone_cpu_s + d.workers_cpu_s) / o.decode);
      if (sharded) swarm_backbone_cpu.push_back(d.backbone_cpu_s / o.decode);
      if (sharded) {
        bytes_sent += d.after.bytes_sent() - d.before.bytes_sent();
        bytes_received += d.after.bytes_received() - d.before.bytes_received();
        requests += d.after.requests - d.before.requests;
        layer_calls += d.after.layer_calls - d.before.layer_calls;
      }
    }
  }
  // One executor call per MoE layer per decoded token: per token per layer = per call.
  const double calls = double(std::max<uint64_t>(layer_calls, 1));
  const double moe_layers = double(layer_calls) / (double(o.reps) * o.decode);
  const double sent = double(bytes_sent) / calls, recv = double(bytes_received) / calls;

  const double mono_tps = 1.0 / median(mono_s), swarm_tps = 1.0 / median(swarm_s);
  json doc;
  doc["benchmark"] = "dispatch";
  doc["model"] = path;
  doc["n_embd"] = m.info().n_embd;
  doc["n_expert"] = m.info().n_expert;
  doc["n_expert_used"] = m.info().n_expert_used;
  doc["moe_layers"] = moe_layers;
  doc["workers"] = o.workers;
  doc["worker_threads"] = o.worker_threads;
  doc["backbone_threads"] = pool.size();
  doc["prompt_tokens"] = o.prompt;
  doc["decode_tokens_per_rep"] = o.decode;
  doc["reps"] = o.reps;
  doc["load_average"] = {load_before, load_average()};
  doc["monolithic_decode_tokens_per_s"] = mono_tps;
  doc["sharded_decode_tokens_per_s"] = swarm_tps;
  doc["monolithic_ms_per_token"] = 1e3 / mono_tps;
  doc["sharded_ms_per_token"] = 1e3 / swarm_tps;
  doc["overhead_percent"] = (mono_tps / swarm_tps - 1.0) * 100.0;
  doc["cpu_ms_per_token"] = {{"monolithic", 1e3 * median(mono_cpu)},
                             {"sharded_total", 1e3 * median(swarm_cpu)},
                             {"sharded_backbone", 1e3 * median(swarm_backbone_cpu)},
                             {"sharded_workers", 1e3 * (median(swarm_cpu) - median(swarm_backbone_cpu))}};
  doc["cpu_overhead_percent"] = (median(swarm_cpu) / median(mono_cpu) - 1.0) * 100.0;
  doc["wire_bytes_per_token_per_layer"] = {{"sent", sent}, {"received", recv}, {"total", sent + recv}};
  doc["requests_per_token_per_layer"] = double(requests) / calls;
  doc["tokens_identical"] = true;
  doc["dispatch"] = json::parse((*remote)->stats().to_json());
  std::printf("%s\n", doc.dump(2).c_str());
  std::fprintf(stderr,
               "dispatch_bench: monolithic %.2f tok/s, sharded over %d workers %.2f tok/s (time %+.1f%%); CPU per token "
               "%.1f vs %.1f ms (%+.1f%%); %.0f B/token/layer\n",
               mono_tps, o.workers, swarm_tps, (mono_tps / swarm_tps - 1.0) * 100.0, 1e3 * median(mono_cpu),
               1e3 * median(swarm_cpu), (median(swarm_cpu) / median(mono_cpu) - 1.0) * 100.0, sent + recv);

  remote->reset();  // closes the links before the workers go
  bench::stop_workers(procs);
  return 0;
}

}  // namespace
}  // namespace essaim

int main(int argc, char** argv) {
  essaim::Options o;
  o.worker_bin = essaim::bench::default_worker_binary(argv[0]);
  CLI::App app{"essaim dispatch benchmark: decode tok/s monolithic vs sharded over loopback workers"};
  app.add_option("--model", o.model, "GGUF file (default: the 122B-shaped synth model, written once)");
  app.add_option("--data-dir", o.data_dir, "Where the synth model and its slices are written once (default ./bench-data)");
  app.add_option("--layers", o.layers, "Layers of the synth model (default 2)")->check(CLI::Range(1, 48));
  app.add_option("--workers", o.workers, "Worker processes (default 4)")->check(CLI::Range(1, 64));
  app.add_option("--worker-threads", o.worker_threads, "Threads per worker (default 1)")->check(CLI::Range(1, 256));
  app.add_option("--worker-bin", o.worker_bin, "essaim-worker binary (default: <build>/src/cli/essaim-worker)");
  app.add_option("--prompt", o.prompt, "Prompt tokens (default 8)")->check(CLI::Range(1, 4096));
  app.add_option("--decode", o.decode, "Decoded tokens per repetition (default 16)")->check(CLI::Range(1, 4096));
  app.add_option("--reps", o.reps, "Timed repetitions (default 3; one more warms up)")->check(CLI::Range(1, 100));
  app.add_option("--threads", o.threads, "Backbone threads (default: all cores)");
  app.add_option("--timeout-ms", o.timeout_ms, "Worker deadline (default 30000: no fallback on a loaded machine)");
  CLI11_PARSE(app, argc, argv);
  return essaim::run(o);
}
