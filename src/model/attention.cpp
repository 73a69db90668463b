#include "model/attention.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "core/status.h"
#include "model/ops.h"
#include "moe/numerics.h"

namespace essaim {
namespace {

// Positions converted from the cache per step: bounds the f32 scratch whatever the context length.
constexpr int32_t kBlock = 64;
// Query rows of one sequence that share each converted K/V block (the f16 -> f32 table lookups were ~5 %
// of a 512-token prefill when every row converted the whole cache again), as long as their scores fit in
// kScoreFloats; long contexts fall back to fewer rows per item, down to one.
constexpr int64_t kRowTile = 8;
constexpr size_t kScoreFloats = size_t(1) << 20;

int64_t rows_per_item(const AttentionArgs& a) {
  int32_t n_max = 1;
  for (int64_t t = 0; t < a.n_q; ++t) n_max = std::max(n_max, a.pos[t] + 1);
  const size_t G = size_t(a.n_head / a.kv->n_kv_heads());
  return std::clamp<int64_t>(int64_t(kScoreFloats / (G * size_t(n_max))), 1, kRowTile);
}

// One (query rows [t0, t1), KV head g) item: the group's G query heads of every row share each converted
// K/V block. Each (row, head) is computed exactly as alone — scores over j = 0 .. pos[t], softmax, then
// o += p_j · v_j in ascending j — so the grouping of rows changes no bit.
// block: [kBlock][D] scratch; scores: resized to [t1 - t0][G][n_max].
void attend_rows_group(const AttentionArgs& a, int64_t t0, int64_t t1, int32_t g, std::vector<float>& block,
                       std::vector<float>& scores) {
  const KvCache& kv = *a.kv;
  const int32_t D = kv.head_dim();
  const int32_t G = a.n_head / kv.n_kv_heads();  // query heads per KV head
  const size_t row = size_t(a.n_head) * size_t(D);
  int32_t n_max = 0;
  for (int64_t t = t0; t < t1; ++t) {
    ESSAIM_CHECK(a.pos[t] + 1 >= 1 && a.pos[t] + 1 <= kv.size());
    n_max = std::max(n_max, a.pos[t] + 1);
  }
  scores.resize(size_t(t1 - t0) * size_t(G) * size_t(n_max));
  auto scores_of = [&](int64_t t, int32_t hh) {
    return scores.data() + (size_t(t - t0) * size_t(G) + size_t(hh)) * size_t(n_max);
  };
  auto head_offset = [&](int64_t t) { return size_t(t) * row + size_t(g) * size_t(G) * size_t(D); };

  for (int32_t j0 = 0; j0 < n_max; j0 += kBlock) {
    const int32_t j1 = std::min(n_max, j0 + kBlock);
    kv.load_k(g, j0, j1, block.data());
    for (int64_t t = t0; t < t1; ++t) {
      const int32_t je = std::min(j1, a.pos[t] + 1);
      const float* q = a.q + head_offset(t);  // [G][D]
      if (je <= j0) continue;
      // Heads four at a time, then two, each key row loaded once for all; an odd last head alone.
      int32_t hh = 0;
      for (; hh + 4 <= G; hh += 4) {
        const float* qs[4];
        float* ss[4];
        for (int i = 0; i < 4; ++i) {
          qs[i] = q + size_t(hh + i) * size_t(D);
          ss[i] = scores_of(t, hh + i) + j0;
        }
        dot_f32_rows4(qs, block.data(), D, je - j0, D, ss);
      }
      for (; hh + 2 <= G; hh += 2)
        dot_f32_rows2(q + size_t(hh) * size_t(D), q + size_t(hh + 1) * size_t(D), block.data(), D, je - j0, D,
                      scores_of(t, hh) + j0, scores_of(t, hh + 1) + j0);
      if (hh < G) dot_f32_rows(q + size_t(hh) * size_t(D), block.data(), D, je - j0, D, scores_of(t, hh) + j0);
      const float scale = a.scale;  // a local: the stores below cannot change it, so the loop can vectorise
      for (hh = 0; hh < G; ++hh) {
        float* s = scores_of(t, hh);
        for (int32_t j = j0; j < je; ++j) s[j] = s[j] * scale;
      }
    }
  }
  for (int64_t t = t0; t < t1; ++t) {
    for (int32_t hh = 0; hh < G; ++hh) softmax(scores_of(t, hh), size_t(a.pos[t] + 1), scores_of(t, hh));
    std::memset(a.out + head_offset(t), 0, size_t(G) * size_t(D) * sizeof(float));
  }
  for (int32_t j0 = 0; j0 < n_max; j0 += kBlock) {
    const int32_t j1 = std::min(n_max, j0 + kBlock);
    kv.load_v(g, j0, j1, block.data());
    for (int64_t t = t0; t < t1; ++t) {
      const int32_t je = std::min(j1, a.pos[t] + 1);
      float* o = a.out + head_offset(t);  // [G][D]
      if (je <= j0) continue;
      int32_t hh = 0;
      for (; hh + 4 <= G; hh += 4) {
        const float* ps[4];
        float* os[4];
        for (int i = 0; i < 4; ++i) {
          ps[i] = scores_of(t, hh + i) + j0;
          os[i] = o + size_t(hh + i) * size_t(D);
        }
        axpy_f32_rows4(ps, block.data(), D, je - j0, os, D);
      }
      for (; hh + 2 <= G; hh += 2)
        axpy_f32_rows2(scores_of(t, hh) + j0, scores_of(t, hh + 1) + j0, block.data(), D, je - j0,
                       o + size_t(hh) * size_t(D), o + size_t(hh + 1) * size_t(D), D);
      if (hh < G) axpy_f32_rows(scores_of(t, hh) + j0, block.data(), D, je - j0, o + size_t(hh) * size_t(D), D);
    }
  }
}

}  // namespace

void attention(const AttentionArgs& a, ThreadPool* pool) { attention_batch(std::span(&a, 1), pool); }

void attention_batch(std::span<const AttentionArgs> seqs, ThreadPool* pool) {
  // Work items: (sequence, tile of its query rows, KV head). first[i]: index of sequence i's first item.
  std::vector<size_t> first(seqs.size() + 1, 0);  // [n_seq + 1]
  std::vector<int64_t> tile(seqs.size());         // query rows per item of sequence i
  int32_t D = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const AttentionArgs& a = seqs[i];
    ESSAIM_CHECK(a.kv != nullptr && a.n_head % a.kv->n_kv_heads() == 0);
    ESSAIM_CHECK(D == 0 || D == a.kv->head_dim());
    D = a.kv->head_dim();
    tile[i] = rows_per_item(a);
    first[i + 1] = first[i] + size_t((a.n_q + tile[i] - 1) / tile[i]) * size_t(a.kv->n_kv_heads());
  }
  // Items are taken from a shared counter, last first: causal rows late in a prompt attend to more
  // positions, so handing them out first balances the threads. Which thread runs an item changes no bit.
  const size_t n_items = first.back();
  std::atomic<size_t> next{0};
  const size_t n_workers = pool != nullptr ? std::min(pool->size(), std::max<size_t>(n_items, 1)) : 1;
  parallel_for(pool, n_workers, [&](size_t, size_t) {
    std::vector<float> block(size_t(kBlock) * size_t(D));  // [kBlock][D] K or V rows as f32
    std::vector<float> scores;                             // [rows][G][n]
    for (size_t k = next.fetch_add(1, std::memory_order_relaxed); k < n_items;
         k = next.fetch_add(1, std::memory_order_relaxed)) {
      const size_t item = n_items - 1 - k;
      const size_t i = size_t(std::upper_bound(first.begin(), first.end(), item) - first.begin()) - 1;
      const AttentionArgs& a = seqs[i];
      const size_t local = item - first[i], Hkv = size_t(a.kv->n_kv_heads());
      const int64_t t0 = int64_t(local / Hkv) * tile[i];
      attend_rows_group(a, t0, std::min(a.n_q, t0 + tile[i]), int32_t(local % Hkv), block, scores);
    }
  });
}

}  // namespace essaim
