#include "model/moe_block.h"

#include <vector>

#include "moe/router.h"

namespace essaim {

Status moe_block_forward(const MoeBlock& b, const float* f, int64_t n, ExpertExecutor& executor,
                         ThreadPool* pool, float* out, MoeRouting* routing,
                         std::span<const MatmulOut> with_router) {
  const int32_t K = b.n_expert_used;
  const size_t E = size_t(b.n_embd);
  std::vector<int32_t> ids(size_t(n) * size_t(K));   // [n][K] slot order
  std::vector<float> w(size_t(n) * size_t(K));       // [n][K] renormalised
  std::vector<float> logits(size_t(n) * size_t(b.router.rows));  // [n][n_expert]
  std::vector<MatmulOut> products{{&b.router, logits.data()}};
  products.insert(products.end(), with_router.begin(), with_router.end());
  matmul_set(products, f, n, pool);
  route_logits(logits.data(), n, int32_t(b.router.rows), K, ids.data(), w.data());

  const uint64_t act_row = activation_row_bytes(b.expert_weight_type, b.n_embd);
  std::vector<uint8_t> act(size_t(n) * act_row);     // [n] rows in the experts' activation format
  quantize_activations(b.expert_weight_type, f, n, b.n_embd, act.data());

  std::vector<float> y(size_t(n) * size_t(K) * E);   // [n][K][E] unweighted expert outputs
  const ExpertBatch batch{.layer = b.layer, .n_rows = n, .k = K,
                          .act_type = type_traits(b.expert_weight_type).vec_dot_type, .act = act, .ids = ids};
  ESSAIM_RETURN_IF_ERROR(executor.compute(batch, y).with_context("layer " + std::to_string(b.layer) + " experts"));

  for (int64_t r = 0; r < n; ++r) {
    float* o = out + size_t(r) * E;
    const float* yr = y.data() + size_t(r) * size_t(K) * E;
    const float* wr = w.data() + size_t(r) * size_t(K);
    for (size_t i = 0; i < E; ++i) o[i] = yr[i] * wr[0];
    for (int32_t s = 1; s < K; ++s) {
      const float* ys = yr + size_t(s) * E;
      for (size_t i = 0; i < E; ++i) o[i] = o[i] + ys[i] * wr[s];
    }
  }
  if (routing) {
    routing->ids = std::move(ids);
    routing->weights = std::move(w);
  }
  return Status::ok();
}

}  // namespace essaim
