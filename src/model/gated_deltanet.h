// The Gated DeltaNet linear-attention layer of qwen35moe (docs/reference.md 5.6), one call for a run of tokens
// of one sequence, carrying the sequence's conv window and delta-rule state from call to call.
//
//   GdnShape s{.n_embd = E, .conv_kernel = 4, .n_k_heads = 16, .n_v_heads = 64, .head_dim = 128, .eps = 1e-6f};
//   std::vector<float> conv(s.conv_state_size()), state(s.recurrent_state_size());  // zero: a new sequence
//   gated_deltanet_forward(s, weights, a /* [T][E] */, T,
//                          {.conv_in = conv.data(), .state_in = state.data(),
//                           .conv_out = conv.data(), .state_out = state.data()}, y /* [T][E] */, &pool);
//
// Per token, in order (the math of 5.6, llama.cpp's fused CPU kernel):
//   mix = W_qkv·a   z = W_gate·a   β = σ(W_beta·a)   g = softplus(W_alpha·a + dt_bias) · ssm_a
//   u   = silu(causal depthwise conv of mix over the last Kc inputs)            -- [q | k | v]
//   q_j, k_j = L2norm(u's key heads)                 value head h reads key head j = h mod Hk (tiled)
//   S_h ← exp(g_h)·S_h;  δ = (v_h − S_hᵀk_j)·β_h;  S_h ← S_h + k_j δᵀ;  o_h = (S_hᵀq_j) / sqrt(Dv)
//   y   = W_out · concat_h (RMSNorm(o_h, ssm_norm) ⊙ silu(z_h))
//
// How a run is computed: the four input projections, the gated norm and the output projection are batched
// matmuls over all T tokens (batch-invariant kernels); the conv reads a window of raw inputs that is the
// same whichever call a token arrives in; the recurrence runs token by token in order for every state
// column (columns of S_h are independent: column c only ever meets v_h[c], δ_c and its own values), with a
// column's Dk values kept hot across the whole run. So a prompt in one call, in chunks, or one token at a
// time gives bit-identical outputs and states: prefill == decode exactly, and the thread count changes
// nothing. State layout (llama.cpp's): S_h value-major, [Hv][Dv][Dk], so each column is contiguous.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/thread_pool.h"
#include "kernels/matmul.h"

namespace essaim {

struct GdnShape {
  int32_t n_embd = 0;       // E
  int32_t conv_kernel = 0;  // Kc
  int32_t n_k_heads = 0;    // Hk: query/key heads
  int32_t n_v_heads = 0;    // Hv: value heads, a multiple of Hk
  int32_t head_dim = 0;     // Dk = Dv
  float eps = 0.0f;         // RMSNorm eps, also the L2-norm floor

  int64_t key_dim() const { return int64_t(n_k_heads) * head_dim; }
  int64_t value_dim() const { return int64_t(n_v_heads) * head_dim; }
  int64_t conv_channels() const { return 2 * key_dim() + value_dim(); }
  size_t conv_state_size() const { return size_t(conv_kernel - 1) * size_t(conv_channels()); }
  size_t recurrent_state_size() const { return size_t(value_dim()) * size_t(head_dim); }
};

struct GdnWeights {
  WeightMatrix qkv;                // attn_qkv  [E -> conv_channels]
  WeightMatrix gate;               // attn_gate [E -> value_dim] (z)
  WeightMatrix beta;               // ssm_beta  [E -> Hv]
  WeightMatrix alpha;              // ssm_alpha [E -> Hv]
  const float* conv1d = nullptr;   // ssm_conv1d [conv_channels][Kc], tap 0 = oldest input
  const float* dt_bias = nullptr;  // ssm_dt.bias [Hv]
  const float* a = nullptr;        // ssm_a [Hv] = −exp(A_log)
  const float* norm = nullptr;     // ssm_norm [Dv]
  WeightMatrix out;                // ssm_out [value_dim -> E]
};

// The sequence's state before the run and where the advanced state goes. *_in and *_out may be the same
// buffers (advance in place) or different ones (keep the old state, e.g. until a whole forward succeeds).
struct GdnStateIo {
  const float* conv_in = nullptr;   // [Kc-1][conv_channels]: raw mix rows of the previous Kc-1 tokens
  const float* state_in = nullptr;  // [Hv][Dv][Dk]
  float* conv_out = nullptr;
  float* state_out = nullptr;
  // Optional, for speculative verification (a sequence cut back to any prefix of the run): the conv window
  // and the state after each of the run's rows, [T][Kc-1][conv_channels] and [T][Hv][Dv][Dk]. Row t's
  // entries are exactly the conv_out/state_out a run ending at that row would give.
  float* conv_rows = nullptr;
  float* state_rows = nullptr;
};

// y: [T][E]. a: [T][E] (the attn_norm output). T ≥ 1.
void gated_deltanet_forward(const GdnShape& shape, const GdnWeights& w, const float* a, int64_t T,
                            const GdnStateIo& io, float* y, ThreadPool* pool);

// One sequence's rows [row0, row0 + n_rows) of a batched step and its own state.
struct GdnSequence {
  int64_t row0 = 0;
  int64_t n_rows = 0;  // ≥ 1
  GdnStateIo io;
};

// A batched step of several sequences: the input projections, the gated norm and the output projection
// run over all N rows at once (one matmul each); the conv window and the delta rule run per sequence on
// its own rows and state (one parallel loop over all sequences' work items). Each sequence's rows and
// state come out exactly as gated_deltanet_forward on it alone. a, y: [N][E]; sequences cover 0..N.
void gated_deltanet_forward_batch(const GdnShape& shape, const GdnWeights& w, const float* a, int64_t N,
                                  std::span<const GdnSequence> sequences, float* y, ThreadPool* pool);

// The layer between its input and output projections, for a batched step: from the raw projections of
// all N rows — mix [N][C] (q | k | v before the conv), z [N][Hv][Dv], beta and decay [N][Hv] before their
// gates (turned into β and the decay in place) — the gated-normed read-out o [N][Hv][Dv], advancing each
// sequence's conv window and state. gated_deltanet_forward_batch is the projections, this, and ssm_out;
// bench/recurrent_bench times this alone.
void gated_deltanet_recurrence(const GdnShape& shape, const GdnWeights& w, int64_t N,
                               std::span<const GdnSequence> sequences, const float* mix, const float* z, float* beta,
                               float* decay, float* o, ThreadPool* pool);

}  // namespace essaim
