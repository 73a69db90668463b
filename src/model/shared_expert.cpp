#include "model/shared_expert.h"

#include <vector>

#include "core/ggml_type.h"
#include "core/status.h"
#include "model/ops.h"
#include "moe/numerics.h"

namespace essaim {

void shared_expert_add(const SharedExpert& se, const float* f, int64_t n, float* out, ThreadPool* pool) {
  const int64_t E = se.gate.cols, Fs = se.gate.rows;
  std::vector<float> g(size_t(n * Fs)), u(size_t(n * Fs));  // [n][Fs]
  const MatmulOut gu_outs[] = {{&se.gate, g.data()}, {&se.up, u.data()}};
  matmul_set(gu_outs, f, n, pool);  // gate and up as one task set
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

}  // namespace essaim
