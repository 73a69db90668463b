// Concurrent requests through the serve scheduler (serve/scheduler.h), for the many-node harness: every
// request submitted at once to one Scheduler over any ExpertExecutor, each one's tokens and latency (submit
// to final event) collected, the whole run bounded by a deadline. Shared by tests and benchmarks.
//
//   std::vector<serve::SequenceRequest> reqs = greedy_requests(model, 8, 12, 24, /*seed=*/3);
//   ESSAIM_ASSIGN_OR_RETURN(ServedRun r, serve_concurrently(model, executor, &pool, reqs, {.parallel = 8}, 30s,
//                                                           [&](uint64_t tokens) { chaos.progress(tokens); }));
//   r.requests[i].tokens == the same request's tokens alone (batch invariance); r.requests[i].latency_s
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "moe/executor.h"
#include "serve/scheduler.h"

namespace essaim::bench {

// n greedy requests (temperature 0, no end-of-generation id, so each generates exactly max_tokens), prompt i
// of prompt_tokens seeded ids in the vocabulary.
std::vector<serve::SequenceRequest> greedy_requests(const Model& m, int n, int prompt_tokens, int max_tokens,
                                                    uint64_t seed);

struct ServedRequest {
  std::vector<int32_t> tokens;
  double latency_s = 0;            // submit → final event
  double first_token_s = 0;        // submit → first token
  serve::FinishReason reason = serve::FinishReason::NONE;
  std::string error;
};

struct ServedRun {
  std::vector<ServedRequest> requests;  // in request order
  double wall_s = 0;                    // first submit → last final event
  uint64_t generated = 0;               // tokens, all requests
  serve::SchedulerStats scheduler;      // at the end (steps, rows per step)
};

// Submits every request to a Scheduler at once and waits for all of them; `on_tokens` (may be null) is told
// the running total of generated tokens from the scheduler thread after each event. Returns an error when a
// request was refused, or when they were not all done by `give_up` (the rest are cancelled).
Result<ServedRun> serve_concurrently(const Model& m, ExpertExecutor* experts, ThreadPool* pool,
                                     const std::vector<serve::SequenceRequest>& requests,
                                     serve::SchedulerOptions options, std::chrono::milliseconds give_up,
                                     const std::function<void(uint64_t)>& on_tokens = {});

}  // namespace essaim::bench
