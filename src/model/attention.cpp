#include "model/attention.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/status.h"
#include "model/ops.h"
#include "moe/numerics.h"

namespace essaim {
namespace {

// Positions converted from the cache per step: bounds the f32 scratch whatever the context length.
constexpr int32_t kBlock = 64;

// One (query row t, KV head g) item: the group's G query heads share each converted K/V block.
// block: [kBlock][D] scratch; scores: resized to [G][n].
void attend_row_group(const AttentionArgs& a, int64_t t, int32_t g, std::vector<float>& block,
                      std::vector<float>& scores) {
  const KvCache& kv = *a.kv;
  const int32_t D = kv.head_dim();
  const int32_t G = a.n_head / kv.n_kv_heads();  // query heads per KV head
  const size_t row = size_t(a.n_head) * size_t(D);
  const int32_t n = a.pos[t] + 1;
  ESSAIM_CHECK(n >= 1 && n <= kv.size());
  const float* q = a.q + size_t(t) * row + size_t(g) * size_t(G) * size_t(D);  // [G][D]
  float* o = a.out + size_t(t) * row + size_t(g) * size_t(G) * size_t(D);      // [G][D]
  scores.resize(size_t(G) * size_t(n));

  for (int32_t j0 = 0; j0 < n; j0 += kBlock) {
    const int32_t j1 = std::min(n, j0 + kBlock);
    kv.load_k(g, j0, j1, block.data());
    for (int32_t hh = 0; hh < G; ++hh)
      for (int32_t j = j0; j < j1; ++j)
        scores[size_t(hh) * size_t(n) + size_t(j)] =
            dot_f32(q + size_t(hh) * size_t(D), block.data() + size_t(j - j0) * size_t(D), D) * a.scale;
  }
  for (int32_t hh = 0; hh < G; ++hh) {
    float* s = scores.data() + size_t(hh) * size_t(n);
    softmax(s, size_t(n), s);
  }
  std::memset(o, 0, size_t(G) * size_t(D) * sizeof(float));
  for (int32_t j0 = 0; j0 < n; j0 += kBlock) {
    const int32_t j1 = std::min(n, j0 + kBlock);
    kv.load_v(g, j0, j1, block.data());
    for (int32_t hh = 0; hh < G; ++hh)
      for (int32_t j = j0; j < j1; ++j)
        axpy_f32(scores[size_t(hh) * size_t(n) + size_t(j)], block.data() + size_t(j - j0) * size_t(D),
                 o + size_t(hh) * size_t(D), D);
  }
}

}  // namespace

void attention(const AttentionArgs& a, ThreadPool* pool) { attention_batch(std::span(&a, 1), pool); }

void attention_batch(std::span<const AttentionArgs> seqs, ThreadPool* pool) {
  // first[i]: index of sequence i's first work item; items of sequence i are (row, KV head) pairs.
  std::vector<size_t> first(seqs.size() + 1, 0);  // [n_seq + 1]
  int32_t D = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const AttentionArgs& a = seqs[i];
    ESSAIM_CHECK(a.kv != nullptr && a.n_head % a.kv->n_kv_heads() == 0);
    ESSAIM_CHECK(D == 0 || D == a.kv->head_dim());
    D = a.kv->head_dim();
    first[i + 1] = first[i] + size_t(a.n_q) * size_t(a.kv->n_kv_heads());
  }
  parallel_for(pool, first.back(), [&](size_t begin, size_t end) {
    std::vector<float> block(size_t(kBlock) * size_t(D));  // [kBlock][D] K or V rows as f32
    std::vector<float> scores;                             // [G][n]
    size_t i = size_t(std::upper_bound(first.begin(), first.end(), begin) - first.begin()) - 1;
    for (size_t item = begin; item < end; ++item) {
      while (item >= first[i + 1]) ++i;
      const AttentionArgs& a = seqs[i];
      const size_t local = item - first[i], Hkv = size_t(a.kv->n_kv_heads());
      attend_row_group(a, int64_t(local / Hkv), int32_t(local % Hkv), block, scores);
    }
  });
}

}  // namespace essaim
