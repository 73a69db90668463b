#include "moe/router.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "core/status.h"
#include "moe/numerics.h"

namespace essaim {

void route_select(const float* probs, int32_t n_experts, int32_t k, int32_t* ids, float* weights) {
  ESSAIM_CHECK(k >= 1 && k <= n_experts);
  std::vector<int32_t> order(static_cast<size_t>(n_experts));
  std::iota(order.begin(), order.end(), 0);
  // A strict total order (indices are distinct), so the selection is deterministic: higher probability
  // first, then the lower expert index.
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return probs[a] > probs[b] || (probs[a] == probs[b] && a < b);
  });
  double sum = 0.0;
  for (int32_t s = 0; s < k; ++s) {
    ids[s] = order[size_t(s)];
    weights[s] = probs[order[size_t(s)]];
    sum += double(weights[s]);
  }
  const float denom = std::max(float(sum), kRouterMinWeightSum);
  for (int32_t s = 0; s < k; ++s) weights[s] = weights[s] / denom;
}

void route_logits(float* logits, int64_t n_rows, int32_t n_experts, int32_t k, int32_t* ids, float* weights) {
  for (int64_t r = 0; r < n_rows; ++r) {
    float* p = logits + size_t(r) * size_t(n_experts);
    softmax(p, size_t(n_experts), p);
    route_select(p, n_experts, k, ids + r * k, weights + r * k);
  }
}

void route(const WeightMatrix& router, const float* f, int64_t n_rows, int32_t k, int32_t* ids, float* weights,
           ThreadPool* pool, float* probs_out) {
  const int32_t n_experts = int32_t(router.rows);
  std::vector<float> probs(size_t(n_rows) * size_t(n_experts));  // [n_rows][n_experts]
  matmul(router, f, n_rows, probs.data(), pool);
  route_logits(probs.data(), n_rows, n_experts, k, ids, weights);
  if (probs_out) std::copy(probs.begin(), probs.end(), probs_out);
}

}  // namespace essaim
