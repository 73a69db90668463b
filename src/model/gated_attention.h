// The gated full-attention layer of qwen35moe (docs/reference.md 5.5) and its IMRoPE (interleaved multi-section
// rotary embedding), for a run of tokens of one sequence over that sequence's KV cache.
//
//   GatedAttentionShape s{.n_head = 32, .n_head_kv = 2, .head_dim = 256, .n_rot = 64, .rope_base = 1e7f,
//                         .rope_sections = {11, 11, 10, 0}, .eps = 1e-6f};
//   gated_attention_forward(s, weights, a /* [T][E] */, T, pos /* [T] */, kv, y /* [T][E] */, &pool);
//
//   qg = W_q·a  → per head h: q_h = qg[2Dh, 2Dh+D), gate_h = qg[2Dh+D, 2Dh+2D)   (interleaved per head)
//   k = W_k·a, v = W_v·a;  q_h, k_g RMSNorm'd per head;  IMRoPE on the first n_rot dims of q_h and k_g
//   store k, v (rounded to the cache type);  o = causal GQA attention, scale 1/sqrt(D)   (attention.h)
//   y = W_o · (o ⊙ σ(gate))
//
// Batch-invariant like qwen3moe's attention: every step is per row or reads K/V back from the cache.
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "core/thread_pool.h"
#include "kernels/matmul.h"
#include "model/cache.h"

namespace essaim {

struct GatedAttentionShape {
  int32_t n_head = 0;     // H
  int32_t n_head_kv = 0;  // Hkv
  int32_t head_dim = 0;   // D
  int32_t n_rot = 0;      // rotated leading dimensions of each head (even, ≤ D)
  float rope_base = 10000.0f;
  std::array<int32_t, 4> rope_sections{};  // [t, h, w, e], sum > 0
  float eps = 0.0f;       // q/k RMSNorm eps
};

struct GatedAttentionWeights {
  WeightMatrix q;                 // attn_q [E -> 2·H·D], q and gate interleaved per head
  WeightMatrix k;                 // attn_k [E -> Hkv·D]
  WeightMatrix v;                 // attn_v [E -> Hkv·D]
  const float* q_norm = nullptr;  // [D]
  const float* k_norm = nullptr;  // [D]
  WeightMatrix out;               // attn_output [H·D -> E]
};

// IMRoPE angles of one token with position components pos = (p_t, p_h, p_w, p_e) (docs/reference.md 5.5):
// pair i (< n_rot/2) takes the component chosen by σ = i mod (s0+s1+s2+s3):
//   σ%3 == 1 and σ < 3·s1 → p_h;  σ%3 == 2 and σ < 3·s2 → p_w;  σ%3 == 0 and σ < 3·s0 → p_t;  else p_e,
// with angle θ_c,i from the iterative f32 sequence θ_c,0 = f32(p_c), θ_c,i+1 = θ_c,i · powf(base, −2/n_rot).
// cs gets [n_rot/2 cos | n_rot/2 sin], the layout rope_neox (ops.h) applies. For text (p_t = p_h = p_w = pos,
// p_e = 0) and sections that send every pair to t/h/w, this equals rope_cos_sin(pos) bit for bit.
void imrope_cos_sin(const std::array<int32_t, 4>& pos, int32_t n_rot, float base,
                    const std::array<int32_t, 4>& sections, float* cs);

// Text positions: (pos, pos, pos, 0), as llama.cpp sets them for text tokens.
inline std::array<int32_t, 4> imrope_text_position(int32_t pos) { return {pos, pos, pos, 0}; }

// y: [T][E]. a: [T][E] (the attn_norm output). pos[t] = kv.size() + t on entry (dense positions).
void gated_attention_forward(const GatedAttentionShape& s, const GatedAttentionWeights& w, const float* a,
                             int64_t T, const int32_t* pos, KvCache& kv, float* y, ThreadPool* pool);

// One sequence's rows [row0, row0 + n_rows) of a batched step, attending over its own cache.
struct GatedAttentionSequence {
  int64_t row0 = 0;
  int64_t n_rows = 0;
  KvCache* kv = nullptr;
};

// A batched step of several sequences: the projections, norms, gate and W_o run over all N rows at once
// (one matmul each), RoPE and the cache writes per row at its own position, attention per sequence over its
// own cache (attention_batch). Row r's output equals gated_attention_forward on its sequence alone.
// a, y: [N][E]; pos: [N], each sequence's rows at kv->size() + 0, 1, … on entry; sequences cover 0..N.
void gated_attention_forward_batch(const GatedAttentionShape& s, const GatedAttentionWeights& w, const float* a,
                                   int64_t N, const int32_t* pos, std::span<const GatedAttentionSequence> sequences,
                                   float* y, ThreadPool* pool);

}  // namespace essaim
