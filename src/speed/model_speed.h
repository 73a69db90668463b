// llama-bench-like speed of a loaded model: prompt processing (`pp<N>`: N tokens in one forward into an
// empty cache) and text generation (`tg<N>`: N one-token forwards from an empty cache), each repeated and
// reported as tokens/s per repetition (mean ± standard deviation, and the median), after one warm-up.
// Random token ids (seeded), greedy is not needed: the work of a token does not depend on its value except
// through routing, which random ids exercise like text does.
//
//   LocalExpertExecutor experts(model.expert_store(), &pool);
//   ESSAIM_ASSIGN_OR_RETURN(std::vector<SpeedResult> rows,
//                           measure_model_speed(model, experts, &pool, {.n_prompt = 512, .n_gen = 64}));
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "moe/executor.h"

namespace essaim {

struct SpeedOptions {
  int n_prompt = 512;  // 0: no pp test
  int n_gen = 64;      // 0: no tg test
  int reps = 3;
  uint32_t seed = 1;
};

struct SpeedResult {
  std::string name;  // "pp512", "tg64"
  int n_prompt = 0;
  int n_gen = 0;
  std::vector<double> seconds;  // per repetition
  double avg_ts = 0, stddev_ts = 0, median_ts = 0;  // tokens/s over the repetitions
};

// Faults every page of the model's mapping in, so that timings see RAM and not the disk.
void touch_model_pages(const Model& m);

Result<std::vector<SpeedResult>> measure_model_speed(const Model& m, ExpertExecutor& experts, ThreadPool* pool,
                                                     const SpeedOptions& o);

}  // namespace essaim
