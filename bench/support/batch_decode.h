// Batched decode steps as the serve scheduler runs them, shared by batch_steps_bench and sim_validate_bench:
// N sequences (the prompt of sequence i seeded by i) prefilled in one forward_batch, then greedy decode steps
// of all N at once (one row each), each step timed; the first decode step warms up and is not timed. Per-token
// latency is a step's time (every sequence gets one token per step); aggregate tok/s = N × steps / time.
//
//   ESSAIM_ASSIGN_OR_RETURN(std::string path, ensure_synth_model("bench-data", "tiny", 8, "my_bench"));
//   ESSAIM_ASSIGN_OR_RETURN(BatchRun r, batch_decode(model, {.prompt = 8, .decode = 16}, 16, experts, remote, pool));
//   double tok_s = r.tokens_per_s(16), p50 = median(r.step_s);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backbone/remote_executor.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "model/model.h"

namespace essaim::bench {

// <data_dir>/qwen3moe-<preset>-<layers>l-q4_k_m.gguf (preset "tiny" or "q35-122b"), written once (to .part,
// then renamed); `who` names the tool in the progress line on stderr.
Result<std::string> ensure_synth_model(const std::string& data_dir, const std::string& preset, uint32_t layers,
                                       const std::string& who);

struct BatchDecodeOptions {
  int prompt = 8;  // tokens per sequence
  int decode = 8;  // timed decode steps (one more warms up)
};

struct BatchRun {
  std::vector<std::vector<int32_t>> tokens;  // [N][decode + 1] generated
  std::vector<double> step_s;                // the timed decode steps
  double prefill_s = 0;
  backbone::DispatchStats before, after;     // around the decode steps (remote runs only)
  double tokens_per_s(int n) const;          // N × steps / their time
};

// `remote` (may be null) is `experts` when it is a remote executor, for its counters.
Result<BatchRun> batch_decode(const Model& m, const BatchDecodeOptions& o, int n, ExpertExecutor& experts,
                              const backbone::RemoteExpertExecutor* remote, ThreadPool& pool);

}  // namespace essaim::bench
