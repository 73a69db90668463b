// Benchmark helpers shared by dispatch_bench and relay_bench: the 122B-shaped synth model written once into
// the data directory, and a prefill followed by greedy decode steps timed one by one, with the dispatch
// counters and CPU time around the decode steps only.
//
//   ESSAIM_ASSIGN_OR_RETURN(std::string path, ensure_q35_122b_model("bench-data", 2, "dispatch_bench"));
//   ESSAIM_ASSIGN_OR_RETURN(DecodeRun r, decode_steps(model, prompt, 16, experts, remote, pool, procs));
//   double ms = 1e3 * median(r.token_s);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backbone/remote_executor.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "median.h"
#include "model/model.h"
#include "worker_processes.h"

namespace essaim::bench {

double load_average();  // the 1-minute load average (/proc/loadavg), 0 when unreadable
std::string cpu_name();  // /proc/cpuinfo's first "model name", "unknown" when unreadable

// <data_dir>/qwen3moe-q35-122b-<layers>l-q4_k_m.gguf, written (to .part, then renamed) when missing; `who`
// names the tool in the progress line on stderr.
Result<std::string> ensure_q35_122b_model(const std::string& data_dir, uint32_t layers, const std::string& who);

struct DecodeRun {
  std::vector<double> token_s;   // per decoded token
  std::vector<int32_t> tokens;
  backbone::DispatchStats before, after;  // around the decode steps only (prefill excluded)
  double backbone_cpu_s = 0, workers_cpu_s = 0;  // over the decode steps
};

// Prefill, then n greedy steps timed one by one. `remote` (may be null) is the executor when sharded; `procs`
// are the processes whose CPU time counts as the workers'.
Result<DecodeRun> decode_steps(const Model& m, const std::vector<int32_t>& prompt, int n, ExpertExecutor& experts,
                               const backbone::RemoteExpertExecutor* remote, ThreadPool& pool,
                               const std::vector<WorkerProcess>& procs);

}  // namespace essaim::bench
