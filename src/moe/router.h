// The MoE router (docs/reference.md 4.3): softmax over the router logits, top-k on the probabilities, weights
// renormalised over the selected experts. It runs once per row on the backbone and is authoritative:
// its ids decide which experts compute, its weights are applied by the backbone's combine.
//
//   route(router_w, f /* [n][E] */, n, k, ids /* [n][k] */, weights /* [n][k] */, &pool);
//
// Slot order: slot 0 holds the most probable expert. Ties (equal probabilities after exp rounding, even
// when the logits differed) are broken by the lower expert index first — llama.cpp's sort is unstable, so
// any fixed rule is within its behaviour; this one is deterministic and documented.
// Weights: w_k = p[ids_k] / max(f32(Σ_k p[ids_k]), 2^-14), the sum accumulated in f64 in slot order, the
// division in f32.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"
#include "kernels/matmul.h"

namespace essaim {

// Smallest renormalisation denominator (llama.cpp clamps the sum of the selected probabilities).
inline constexpr float kRouterMinWeightSum = 6.103515625e-5f;  // 2^-14

// One row: probabilities [n_experts] -> ids [k] in slot order, renormalised weights [k]. 1 ≤ k ≤ n_experts.
void route_select(const float* probs, int32_t n_experts, int32_t k, int32_t* ids, float* weights);

// n_rows rows: logits = router · f (router: [n_embd] -> [n_experts], usually F32), softmax, select.
// f: [n_rows][router.cols]; ids, weights: [n_rows][k]. probs_out, when given, receives [n_rows][n_experts]
// (the coordinator's expert-demand statistics use them later).
// The same from logits already computed ([n_rows][n_experts], turned into the probabilities in place), for
// callers that run the router product in a task set with other products of f (moe_block_forward).
void route_logits(float* logits, int64_t n_rows, int32_t n_experts, int32_t k, int32_t* ids, float* weights);

void route(const WeightMatrix& router, const float* f, int64_t n_rows, int32_t k, int32_t* ids, float* weights,
           ThreadPool* pool, float* probs_out = nullptr);

}  // namespace essaim
