// The worker-side expert FFN at the Qwen3.5-122B expert shapes (3072 -> 1024 gate/up Q4_K, 1024 -> 3072 down
// Q4_K or Q6_K, as in a Q4_K_M file), timed on batches of rows per expert, and the two references it is read
// against, measured in the same run: the int8 multiply-accumulate peak (a register-only loop of the widest
// int8 dot instruction on every thread, per CPU-second) and the read bandwidth (speed/memory_bandwidth.h).
// Shared by expert_bench and fabric_bench (rows/s per worker at batch 512 beside the roofline).
//
//   const ExpertWeights ex = make_expert_weights(GgmlType::Q4_K, 16);
//   int next = 0;
//   json r = time_expert_batch(ex, 16, /*rows per expert=*/512, /*reps=*/3, &pool, next);   // r["rows_per_s"]
//   json peak = int8_peak(&pool);                                                            // int8_gops_per_s
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/thread_pool.h"
#include "core/ggml_type.h"
#include "moe/expert_ffn.h"

namespace essaim::bench {

inline constexpr int32_t kExpertEmbd = 3072, kExpertFf = 1024, kExpertsPerCall = 8;

// Int8 ops (2 per multiply-accumulate) per second: per CPU-second of one thread, and that times the threads.
nlohmann::json int8_peak(ThreadPool* pool);

struct ExpertWeights {
  std::vector<uint8_t> gate, up, down;
  ExpertLayer layer;
};
// n experts of seeded random blocks (finite scales).
ExpertWeights make_expert_weights(GgmlType down_type, int32_t n);

// `reps` timed calls (after one warm-up) of expert_ffn over m rows for each of 8 experts, each call on the next
// 8 of the n experts; medians of wall and CPU time: rows_per_s, gflop_per_s, gflop_per_cpu_s, weight_gb_per_s.
nlohmann::json time_expert_batch(const ExpertWeights& ex, int32_t n_experts, int64_t m, int reps, ThreadPool* pool,
                                 int& next_group);

}  // namespace essaim::bench
