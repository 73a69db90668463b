// Causal grouped-query attention over a KV cache (docs/reference.md 4.3), batch-invariant by construction.
//
//   kv.store(pos, k_row, v_row);                       // every row of the batch first (rounded to f16)
//   attention({.q = q, .pos = pos, .n_q = T, .n_head = H, .scale = 1 / sqrtf(D), .kv = &kv, .out = o}, &pool);
//   attention_batch(per_sequence_args, &pool);         // a batched step: each sequence over its own cache
//
// For query row t, head h, KV head g = h / (H / Hkv) (contiguous groups):
//     score_j = (q_h · k_{g,j}) · scale      for j = 0 .. pos[t]   (dot_f32 order)
//     p       = softmax(score)                                       (numerics.h: f64 sum)
//     o_h     = Σ_j p_j · v_{g,j}            in ascending j, each product rounded then added, from 0
// K and V are always read back from the cache, including the batch's own rows, so a query's result depends
// only on its q row, its position and the cached K/V — never on how the prompt was split into batches or
// on the thread count. Precision: K/V rounded to the cache type, everything else f32 (llama.cpp's f16
// flash-attention path also rounds Q and the V accumulator to f16; this engine keeps them f32, within the
// spread llama.cpp itself shows between its prefill and decode paths).
#pragma once

#include <cstdint>
#include <span>

#include "core/thread_pool.h"
#include "model/cache.h"

namespace essaim {

struct AttentionArgs {
  const float* q = nullptr;    // [n_q][n_head * head_dim], after q-norm and RoPE
  const int32_t* pos = nullptr;  // [n_q]: query t attends to cache positions 0 .. pos[t] (pos[t] < kv->size())
  int64_t n_q = 0;
  int32_t n_head = 0;          // multiple of kv->n_kv_heads()
  float scale = 1.0f;          // 1 / sqrt(head_dim)
  const KvCache* kv = nullptr;
  float* out = nullptr;        // [n_q][n_head * head_dim]
};

void attention(const AttentionArgs& args, ThreadPool* pool);

// Several sequences of one batched step, each over its own cache: sequences[i].q/.pos/.out point at that
// sequence's rows of the batch. One parallel loop over the (query row, KV head) items of all sequences, so a
// decode step of many sequences (one row each) still spreads over the pool; each item computes exactly what
// attention() computes for it alone.
void attention_batch(std::span<const AttentionArgs> sequences, ThreadPool* pool);

}  // namespace essaim
