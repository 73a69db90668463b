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

}  // namespace

void attention(const AttentionArgs& a, ThreadPool* pool) {
  const KvCache& kv = *a.kv;
  const int32_t Hkv = kv.n_kv_heads(), D = kv.head_dim();
  ESSAIM_CHECK(a.n_head % Hkv == 0);
  const int32_t G = a.n_head / Hkv;  // query heads per KV head
  const size_t row = size_t(a.n_head) * size_t(D);

  // One work item per (query row, KV head): the group's G query heads share each converted K/V block.
  parallel_for(pool, size_t(a.n_q) * size_t(Hkv), [&](size_t begin, size_t end) {
    std::vector<float> block(size_t(kBlock) * size_t(D));  // [kBlock][D] K or V rows as f32
    std::vector<float> scores;                             // [G][n]
    for (size_t item = begin; item < end; ++item) {
      const int64_t t = int64_t(item / size_t(Hkv));
      const int32_t g = int32_t(item % size_t(Hkv));
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
  });
}

}  // namespace essaim
