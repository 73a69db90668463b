#include "model/ops.h"

#include <cmath>

namespace essaim {
namespace {

// GCC/Clang vector extension: element-wise IEEE operations the compiler lowers to whatever SIMD the target
// has (or scalar code). With -ffp-contract=off a multiply followed by an add is never fused, so the lanes
// round exactly like the scalar description in dot_f32's contract.
typedef float v8f __attribute__((vector_size(32)));

}  // namespace

void rms_norm(const float* x, const float* w, int64_t n, float eps, float* y) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += double(x[i] * x[i]);
  const float mean = float(sum / double(n));
  const float r = 1.0f / std::sqrt(mean + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] * r) * w[i];
}

void rms_norm_rows(const float* x, const float* w, int64_t n_rows, int64_t n, float eps, float* y,
                   ThreadPool* pool) {
  parallel_for(n_rows * n >= kParallelFloats ? pool : nullptr, size_t(n_rows), [&](size_t b, size_t e) {
    for (size_t r = b; r < e; ++r) rms_norm(x + r * size_t(n), w, n, eps, y + r * size_t(n));
  });
}

void rope_cos_sin(int32_t pos, int32_t n_rot, float base, float* cs) {
  const int32_t half = n_rot / 2;
  const float theta_scale = std::pow(base, -2.0f / float(n_rot));
  float theta = float(pos);
  for (int32_t i = 0; i < half; ++i) {
    cs[i] = std::cos(theta);
    cs[half + i] = std::sin(theta);
    theta = theta * theta_scale;
  }
}

void rope_neox(float* x, int32_t n_rot, const float* cs) {
  const int32_t half = n_rot / 2;
  for (int32_t i = 0; i < half; ++i) {
    const float c = cs[i], s = cs[half + i];
    const float a = x[i], b = x[i + half];
    x[i] = a * c - b * s;
    x[i + half] = a * s + b * c;
  }
}

// dot_f32_rows and axpy_f32_rows are the inner loops of attention (dot_f32 is its one-row case). The model
// library is compiled for baseline x86-64, where a v8f operation is two SSE instructions; the same source
// compiled for AVX2 does each in one. Both clones perform the same IEEE operations on the same lanes in the
// same order (multiply, then add: -ffp-contract=off holds for every clone, and "avx2" alone enables no
// FMA), so they return the same bits; the choice is made once from the CPU.
// kRows dots at once, the a-load shared: each row's lanes, tail and fold as dot_f32's contract says.
template <int kTag, int kRows>
__attribute__((always_inline)) static inline void dot_f32_rows_body(const float* a, const float* b, int64_t stride,
                                                                    int64_t n, float* out) {
  v8f acc[kRows];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) acc[r] = v8f{0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    v8f va;
    __builtin_memcpy(&va, a + i, sizeof(va));
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      v8f vb;
      __builtin_memcpy(&vb, b + r * stride + i, sizeof(vb));
      acc[r] = acc[r] + va * vb;
    }
  }
  for (int r = 0; r < kRows; ++r) {
    float lane[8];
    __builtin_memcpy(lane, &acc[r], sizeof(lane));
    const float* br = b + r * stride;
    for (int64_t k = i, l = 0; k < n; ++k, ++l) lane[l] = lane[l] + a[k] * br[k];
    out[r] = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  }
}

template <int kTag>
__attribute__((always_inline)) static inline void dot_f32_rows_all(const float* a, const float* b, int64_t stride,
                                                                   int64_t n_b, int64_t n, float* out) {
  int64_t r = 0;
  for (; r + 8 <= n_b; r += 8) dot_f32_rows_body<kTag, 8>(a, b + r * stride, stride, n, out + r);
  for (; r + 4 <= n_b; r += 4) dot_f32_rows_body<kTag, 4>(a, b + r * stride, stride, n, out + r);
  for (; r < n_b; ++r) dot_f32_rows_body<kTag, 1>(a, b + r * stride, stride, n, out + r);
}

// y in registers, chunk by chunk; every element takes y + s_r · x_r for r ascending, as axpy_f32.
template <int kTag, int kVecs>
__attribute__((always_inline)) static inline void axpy_f32_rows_chunk(const float* s, const float* x, int64_t stride,
                                                                      int64_t n_x, float* y) {
  v8f acc[kVecs];
  __builtin_memcpy(acc, y, sizeof(acc));
  for (int64_t r = 0; r < n_x; ++r) {
    const v8f vs = {s[r], s[r], s[r], s[r], s[r], s[r], s[r], s[r]};
#pragma GCC unroll 8
    for (int c = 0; c < kVecs; ++c) {
      v8f vx;
      __builtin_memcpy(&vx, x + r * stride + 8 * c, sizeof(vx));
      acc[c] = acc[c] + vs * vx;
    }
  }
  __builtin_memcpy(y, acc, sizeof(acc));
}

template <int kTag>
__attribute__((always_inline)) static inline void axpy_f32_rows_all(const float* s, const float* x, int64_t stride,
                                                                    int64_t n_x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) axpy_f32_rows_chunk<kTag, 8>(s, x + i, stride, n_x, y + i);
  for (; i + 8 <= n; i += 8) axpy_f32_rows_chunk<kTag, 1>(s, x + i, stride, n_x, y + i);
  for (; i < n; ++i) {
    float v = y[i];
    for (int64_t r = 0; r < n_x; ++r) v = v + s[r] * x[r * stride + i];
    y[i] = v;
  }
}

namespace {
#if defined(__x86_64__)
__attribute__((target("avx2"))) void dot_f32_rows_avx2(const float* a, const float* b, int64_t stride, int64_t n_b,
                                                       int64_t n, float* out) {
  dot_f32_rows_all<1>(a, b, stride, n_b, n, out);
}
__attribute__((target("avx2"))) void axpy_f32_rows_avx2(const float* s, const float* x, int64_t stride, int64_t n_x,
                                                        float* y, int64_t n) {
  axpy_f32_rows_all<1>(s, x, stride, n_x, y, n);
}
bool cpu_has_avx2() {
  __builtin_cpu_init();  // this runs from a static initializer, possibly before libgcc's own
  return __builtin_cpu_supports("avx2");
}
const bool kHaveAvx2 = cpu_has_avx2();
#else
const bool kHaveAvx2 = false;
void dot_f32_rows_avx2(const float* a, const float* b, int64_t stride, int64_t n_b, int64_t n, float* out) {
  dot_f32_rows_all<0>(a, b, stride, n_b, n, out);
}
void axpy_f32_rows_avx2(const float* s, const float* x, int64_t stride, int64_t n_x, float* y, int64_t n) {
  axpy_f32_rows_all<0>(s, x, stride, n_x, y, n);
}
#endif
}  // namespace

float dot_f32(const float* a, const float* b, int64_t n) {
  float out;
  dot_f32_rows(a, b, 0, 1, n, &out);
  return out;
}

// The definition axpy_f32_rows is tested against (attention calls the blocked form).
void axpy_f32(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = y[i] + a * x[i];
}

void dot_f32_rows(const float* a, const float* b, int64_t stride, int64_t n_b, int64_t n, float* out) {
  if (kHaveAvx2)
    dot_f32_rows_avx2(a, b, stride, n_b, n, out);
  else
    dot_f32_rows_all<0>(a, b, stride, n_b, n, out);
}

void axpy_f32_rows(const float* s, const float* x, int64_t stride, int64_t n_x, float* y, int64_t n) {
  if (kHaveAvx2)
    axpy_f32_rows_avx2(s, x, stride, n_x, y, n);
  else
    axpy_f32_rows_all<0>(s, x, stride, n_x, y, n);
}

void add_f32(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = y[i] + x[i];
}

}  // namespace essaim
