// The sigmoid-gated shared expert of qwen35moe's MoE layers (docs/reference.md 5.7), computed on the backbone:
// it is dense (every token uses it), so it is never dispatched through the ExpertExecutor and workers never
// see it — they hold routed experts only (docs/invariants.md "Two roles").
//
//   SharedExpert se{.gate_inp = f32_data(*gi), .gate = weight_matrix(*g), .up = weight_matrix(*u),
//                   .down = weight_matrix(*d)};
//   moe_block_forward(block, f, n, executor, pool, ffn);   // ffn = routed sum r, [n][E]
//   shared_expert_add(se, f, n, ffn, pool);                // ffn = r + γ·sh
//
// Per row f (the post_attention_norm output):
//   sh = W_down · q(silu(W_gate·f) ⊙ (W_up·f))      f quantised once for gate and up, the product once for down
//   γ  = σ(gate_inp · f)                            F32 · f32 dot, dot_f32's order
//   out[i] = out[i] + γ·sh[i]                        γ·sh rounded first, added AFTER the routed sum (10.8)
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/matmul.h"

namespace essaim {

struct SharedExpert {
  const float* gate_inp = nullptr;  // ffn_gate_inp_shexp [E], F32
  WeightMatrix gate;                // ffn_gate_shexp [E -> Fs]
  WeightMatrix up;                  // ffn_up_shexp   [E -> Fs]
  WeightMatrix down;                // ffn_down_shexp [Fs -> E]
};

// f: [n][E]; out: [n][E], holding the routed sum on entry.
void shared_expert_add(const SharedExpert& se, const float* f, int64_t n, float* out, ThreadPool* pool);

// shared_expert_add in two halves, for a caller that runs gate and up in another task set over f (the
// router's, through moe_block_forward's with_router):
//
//   SharedExpertRows sr;
//   const auto gu = shared_expert_gate_up(se, n, sr);                    // {gate -> sr.g, up -> sr.u}
//   moe_block_forward(block, f, n, executor, pool, ffn, nullptr, gu);    // router, gate and up: one set
//   shared_expert_finish(se, f, n, sr, ffn, pool);                       // same bits as shared_expert_add
struct SharedExpertRows {
  std::vector<float> g, u;  // [n][Fs] gate and up outputs
};
std::array<MatmulOut, 2> shared_expert_gate_up(const SharedExpert& se, int64_t n, SharedExpertRows& rows);
void shared_expert_finish(const SharedExpert& se, const float* f, int64_t n, SharedExpertRows& rows, float* out,
                          ThreadPool* pool);

}  // namespace essaim
