// Element-wise numerics shared by the expert FFN (moe/) and the backbone (model/), exactly as docs/reference.md
// 4.3 specifies them, so that every place computing a SiLU or a softmax rounds the same way.
//
//   float a = silu(g) * u;                       // SwiGLU
//   softmax(scores.data(), scores.size(), p.data());
//
// silu and sigmoid use libm's expf (std::exp on a float), never a vector approximation: the results are
// the same on every ISA, which the exactness invariant (docs/invariants.md 1) needs. llama.cpp's SIMD lanes use an
// approximate exp and differ from this by a few ulp (docs/reference.md 10.25); that is within the fixtures'
// tolerances.
#pragma once

#include <cmath>
#include <cstddef>

namespace essaim {

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// p = softmax(z) over n values (n ≥ 1; entries may be -inf, at least one must be finite):
// m = max z; e_i = expf(z_i - m); S = Σ e_i accumulated in f64 in index order; p_i = e_i * f32(1/S).
// z and p may alias.
inline void softmax(const float* z, size_t n, float* p) {
  float m = z[0];
  for (size_t i = 1; i < n; ++i) m = z[i] > m ? z[i] : m;
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const float e = std::exp(z[i] - m);
    p[i] = e;
    sum += double(e);
  }
  const float inv = float(1.0 / sum);
  for (size_t i = 0; i < n; ++i) p[i] = p[i] * inv;
}

}  // namespace essaim
