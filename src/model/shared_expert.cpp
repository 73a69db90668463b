#include "model/shared_expert.h"

#include <vector>

#include "core/ggml_type.h"
#include "core/status.h"
#include "model/ops.h"
#include "moe/numerics.h"

namespace essaim {

std::array<MatmulOut, 2> shared_expert_gate_up(const SharedExpert& se, int64_t n, SharedExpertRows& rows) {
  const size_t Fs = size_t(se.gate.rows);
  rows.g.resize(size_t(n) * Fs);
  rows.u.resize(size_t(n) * Fs);
  return {MatmulOut{&se.gate, rows.g.data()}, MatmulOut{&se.up, rows.u.data()}};
}

void shared_expert_finish(const SharedExpert& se, const float* f, int64_t n, SharedExpertRows& rows, float* out,
                          ThreadPool* pool) {
  const int64_t E = se.gate.cols;
  std::vector<float>& g = rows.g;
  const std::vector<float>& u = rows.u;
  for (size_t i = 0; i < g.size(); ++i) g[i] = silu(g[i]) * u[i];
  std::vector<float> sh(size_t(n * E));  // [n][E]
  matmul(se.down, g.data(), n, sh.data(), pool);
  for (int64_t r = 0; r < n; ++r) {
    const float gamma = sigmoid(dot_f32(se.gate_inp, f + r * E, E));
    float* o = out + r * E;
    const float* s = sh.data() + r * E;
    for (int64_t i = 0; i < E; ++i) o[i] = o[i] + gamma * s[i];
  }
}

void shared_expert_add(const SharedExpert& se, const float* f, int64_t n, float* out, ThreadPool* pool) {
  SharedExpertRows rows;
  const std::array<MatmulOut, 2> gu = shared_expert_gate_up(se, n, rows);
  matmul_set(gu, f, n, pool);  // gate and up as one task set
  shared_expert_finish(se, f, n, rows, out, pool);
}

}  // namespace essaim
