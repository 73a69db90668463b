#include "model/ops.h"

#include <cmath>

namespace essaim {
namespace {

// GCC/Clang vector extension: element-wise IEEE operations the compiler lowers to whatever SIMD the target
// has (or scalar code). With -ffp-contract=off a multiply followed by an add is never fused, so the lanes
// round exactly like the scalar description in dot_f32's contract.
typedef float v8f __attribute__((vector_size(32)));

// The fold ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)) of four accumulators at once, as vector adds of the same
// pairs (what a tree of horizontal adds does): out[r] is acc[r]'s fold, bit for bit the scalar one.
inline void fold4(const v8f acc[4], float* out) {
  const v8f h01 = __builtin_shufflevector(acc[0], acc[1], 0, 2, 8, 10, 4, 6, 12, 14) +
                  __builtin_shufflevector(acc[0], acc[1], 1, 3, 9, 11, 5, 7, 13, 15);
  const v8f h23 = __builtin_shufflevector(acc[2], acc[3], 0, 2, 8, 10, 4, 6, 12, 14) +
                  __builtin_shufflevector(acc[2], acc[3], 1, 3, 9, 11, 5, 7, 13, 15);
  // Lane r: acc[r]'s (l0+l1)+(l2+l3); lane 4 + r: its (l4+l5)+(l6+l7).
  const v8f h = __builtin_shufflevector(h01, h23, 0, 2, 8, 10, 4, 6, 12, 14) +
                __builtin_shufflevector(h01, h23, 1, 3, 9, 11, 5, 7, 13, 15);
  for (int r = 0; r < 4; ++r) out[r] = h[r] + h[4 + r];
}

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
  if constexpr (kRows % 4 == 0) {
    if (i == n) {
      for (int r = 0; r < kRows; r += 4) fold4(acc + r, out + r);
      return;
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

// Two queries against the same kRows rows: each b-load feeds both (attention's query heads of one KV head
// share every key). Each of the 2·kRows dots runs exactly as dot_f32_rows_body's.
template <int kTag, int kRows>
__attribute__((always_inline)) static inline void dot_f32_rows2_body(const float* a0, const float* a1, const float* b,
                                                                     int64_t stride, int64_t n, float* out0,
                                                                     float* out1) {
  v8f acc0[kRows], acc1[kRows];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) acc0[r] = acc1[r] = v8f{0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    v8f va0, va1;
    __builtin_memcpy(&va0, a0 + i, sizeof(va0));
    __builtin_memcpy(&va1, a1 + i, sizeof(va1));
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      v8f vb;
      __builtin_memcpy(&vb, b + r * stride + i, sizeof(vb));
      acc0[r] = acc0[r] + va0 * vb;
      acc1[r] = acc1[r] + va1 * vb;
    }
  }
  if constexpr (kRows % 4 == 0) {
    if (i == n) {  // no tail: the folds four rows at a time
      for (int r = 0; r < kRows; r += 4) {
        fold4(acc0 + r, out0 + r);
        fold4(acc1 + r, out1 + r);
      }
      return;
    }
  }
  for (int r = 0; r < kRows; ++r) {
    float l0[8], l1[8];
    __builtin_memcpy(l0, &acc0[r], sizeof(l0));
    __builtin_memcpy(l1, &acc1[r], sizeof(l1));
    const float* br = b + r * stride;
    for (int64_t k = i, l = 0; k < n; ++k, ++l) {
      l0[l] = l0[l] + a0[k] * br[k];
      l1[l] = l1[l] + a1[k] * br[k];
    }
    out0[r] = ((l0[0] + l0[1]) + (l0[2] + l0[3])) + ((l0[4] + l0[5]) + (l0[6] + l0[7]));
    out1[r] = ((l1[0] + l1[1]) + (l1[2] + l1[3])) + ((l1[4] + l1[5]) + (l1[6] + l1[7]));
  }
}

template <int kTag>
__attribute__((always_inline)) static inline void dot_f32_rows2_all(const float* a0, const float* a1, const float* b,
                                                                    int64_t stride, int64_t n_b, int64_t n, float* out0,
                                                                    float* out1) {
  int64_t r = 0;
  for (; r + 4 <= n_b; r += 4) dot_f32_rows2_body<kTag, 4>(a0, a1, b + r * stride, stride, n, out0 + r, out1 + r);
  for (; r < n_b; ++r) dot_f32_rows2_body<kTag, 1>(a0, a1, b + r * stride, stride, n, out0 + r, out1 + r);
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

// Two outputs over the same rows (each x-load feeds both), chunk by chunk; every element of y0 and y1 as
// axpy_f32_rows_chunk's.
template <int kTag, int kVecs>
__attribute__((always_inline)) static inline void axpy_f32_rows2_chunk(const float* s0, const float* s1, const float* x,
                                                                       int64_t stride, int64_t n_x, float* y0,
                                                                       float* y1) {
  v8f acc0[kVecs], acc1[kVecs];
  __builtin_memcpy(acc0, y0, sizeof(acc0));
  __builtin_memcpy(acc1, y1, sizeof(acc1));
  for (int64_t r = 0; r < n_x; ++r) {
    const v8f vs0 = {s0[r], s0[r], s0[r], s0[r], s0[r], s0[r], s0[r], s0[r]};
    const v8f vs1 = {s1[r], s1[r], s1[r], s1[r], s1[r], s1[r], s1[r], s1[r]};
#pragma GCC unroll 8
    for (int c = 0; c < kVecs; ++c) {
      v8f vx;
      __builtin_memcpy(&vx, x + r * stride + 8 * c, sizeof(vx));
      acc0[c] = acc0[c] + vs0 * vx;
      acc1[c] = acc1[c] + vs1 * vx;
    }
  }
  __builtin_memcpy(y0, acc0, sizeof(acc0));
  __builtin_memcpy(y1, acc1, sizeof(acc1));
}

template <int kTag>
__attribute__((always_inline)) static inline void axpy_f32_rows2_all(const float* s0, const float* s1, const float* x,
                                                                     int64_t stride, int64_t n_x, float* y0, float* y1,
                                                                     int64_t n) {
  if (n_x <= 0) return;  // no rows: y0 and y1 stay (and x may be null)
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) axpy_f32_rows2_chunk<kTag, 4>(s0, s1, x + i, stride, n_x, y0 + i, y1 + i);
  for (; i + 8 <= n; i += 8) axpy_f32_rows2_chunk<kTag, 1>(s0, s1, x + i, stride, n_x, y0 + i, y1 + i);
  for (; i < n; ++i) {
    float v0 = y0[i], v1 = y1[i];
    for (int64_t r = 0; r < n_x; ++r) {
      v0 = v0 + s0[r] * x[r * stride + i];
      v1 = v1 + s1[r] * x[r * stride + i];
    }
    y0[i] = v0;
    y1[i] = v1;
  }
}

template <int kTag>
__attribute__((always_inline)) static inline void axpy_f32_rows_all(const float* s, const float* x, int64_t stride,
                                                                    int64_t n_x, float* y, int64_t n) {
  if (n_x <= 0) return;  // no rows: y stays (and x may be null)
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
__attribute__((target("avx2"))) void dot_f32_rows2_avx2(const float* a0, const float* a1, const float* b, int64_t stride,
                                                        int64_t n_b, int64_t n, float* out0, float* out1) {
  dot_f32_rows2_all<1>(a0, a1, b, stride, n_b, n, out0, out1);
}
__attribute__((target("avx2"))) void axpy_f32_rows2_avx2(const float* s0, const float* s1, const float* x, int64_t stride,
                                                         int64_t n_x, float* y0, float* y1, int64_t n) {
  axpy_f32_rows2_all<1>(s0, s1, x, stride, n_x, y0, y1, n);
}
bool cpu_has_avx2() {
  __builtin_cpu_init();  // this runs from a static initializer, possibly before libgcc's own
  return __builtin_cpu_supports("avx2");
}
const bool kHaveAvx2 = cpu_has_avx2();
#else
const bool kHaveAvx2 = false;
void dot_f32_rows2_avx2(const float* a0, const float* a1, const float* b, int64_t stride, int64_t n_b, int64_t n,
                        float* out0, float* out1) {
  dot_f32_rows2_all<0>(a0, a1, b, stride, n_b, n, out0, out1);
}
void axpy_f32_rows2_avx2(const float* s0, const float* s1, const float* x, int64_t stride, int64_t n_x, float* y0,
                         float* y1, int64_t n) {
  axpy_f32_rows2_all<0>(s0, s1, x, stride, n_x, y0, y1, n);
}
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

void dot_f32_rows2(const float* a0, const float* a1, const float* b, int64_t stride, int64_t n_b, int64_t n,
                   float* out0, float* out1) {
  if (kHaveAvx2)
    dot_f32_rows2_avx2(a0, a1, b, stride, n_b, n, out0, out1);
  else
    dot_f32_rows2_all<0>(a0, a1, b, stride, n_b, n, out0, out1);
}

void axpy_f32_rows2(const float* s0, const float* s1, const float* x, int64_t stride, int64_t n_x, float* y0,
                    float* y1, int64_t n) {
  if (kHaveAvx2)
    axpy_f32_rows2_avx2(s0, s1, x, stride, n_x, y0, y1, n);
  else
    axpy_f32_rows2_all<0>(s0, s1, x, stride, n_x, y0, y1, n);
}

void add_f32(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = y[i] + x[i];
}

}  // namespace essaim
