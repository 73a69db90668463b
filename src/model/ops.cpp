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
// kQ queries a[q] against kRows rows of b at once: each b-load feeds every query and each a-load every row
// (attention's query heads of one KV head meet the same keys). Each (query, row) dot keeps dot_f32's lanes,
// tail and fold.
template <int kTag, int kQ, int kRows>
__attribute__((always_inline)) static inline void dot_rows_body(const float* const* a, const float* b, int64_t stride,
                                                                int64_t n, float* const* out, int64_t r0) {
  const float* aq[kQ];  // local copies: the compiler need not reload them after each store
  v8f acc[kQ][kRows];
#pragma GCC unroll 8
  for (int q = 0; q < kQ; ++q) {
    aq[q] = a[q];
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) acc[q][r] = v8f{0, 0, 0, 0, 0, 0, 0, 0};
  }
  b += r0 * stride;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    v8f va[kQ];
#pragma GCC unroll 8
    for (int q = 0; q < kQ; ++q) __builtin_memcpy(&va[q], aq[q] + i, sizeof(v8f));
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      v8f vb;
      __builtin_memcpy(&vb, b + r * stride + i, sizeof(vb));
#pragma GCC unroll 8
      for (int q = 0; q < kQ; ++q) acc[q][r] = acc[q][r] + va[q] * vb;
    }
  }
  if constexpr (kRows % 4 == 0) {
    if (i == n) {  // no tail: the folds four rows at a time
#pragma GCC unroll 8
      for (int q = 0; q < kQ; ++q)
        for (int r = 0; r < kRows; r += 4) fold4(acc[q] + r, out[q] + r0 + r);
      return;
    }
  }
  for (int q = 0; q < kQ; ++q)
    for (int r = 0; r < kRows; ++r) {
      float lane[8];
      __builtin_memcpy(lane, &acc[q][r], sizeof(lane));
      const float* br = b + r * stride;
      for (int64_t k = i, l = 0; k < n; ++k, ++l) lane[l] = lane[l] + aq[q][k] * br[k];
      out[q][r0 + r] = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    }
}

// All n_b rows: eight at a time for one query, four for two, two for four (the accumulators that fit in
// registers).
template <int kTag, int kQ>
__attribute__((always_inline)) static inline void dot_rows_all(const float* const* a, const float* b, int64_t stride,
                                                               int64_t n_b, int64_t n, float* const* out) {
  int64_t r = 0;
  if constexpr (kQ == 1)
    for (; r + 8 <= n_b; r += 8) dot_rows_body<kTag, kQ, 8>(a, b, stride, n, out, r);
  if constexpr (kQ <= 2)
    for (; r + 4 <= n_b; r += 4) dot_rows_body<kTag, kQ, 4>(a, b, stride, n, out, r);
  if constexpr (kQ == 4)
    for (; r + 2 <= n_b; r += 2) dot_rows_body<kTag, kQ, 2>(a, b, stride, n, out, r);
  for (; r < n_b; ++r) dot_rows_body<kTag, kQ, 1>(a, b, stride, n, out, r);
}

// kQ outputs y[q] in registers, chunk by chunk, over the same rows (each x-load feeds every output); every
// element takes y + s_r · x_r for r ascending, as axpy_f32.
template <int kTag, int kQ, int kVecs>
__attribute__((always_inline)) static inline void axpy_rows_chunk(const float* const* s, const float* x, int64_t stride,
                                                                  int64_t n_x, float* const* y, int64_t i0) {
  const float* sq[kQ];  // local copies: the compiler need not reload them after each store
  v8f acc[kQ][kVecs];
#pragma GCC unroll 8
  for (int q = 0; q < kQ; ++q) {
    sq[q] = s[q];
    __builtin_memcpy(acc[q], y[q] + i0, sizeof(acc[q]));
  }
  x += i0;
  for (int64_t r = 0; r < n_x; ++r) {
#pragma GCC unroll 8
    for (int c = 0; c < kVecs; ++c) {
      v8f vx;
      __builtin_memcpy(&vx, x + r * stride + 8 * c, sizeof(vx));
#pragma GCC unroll 8
      for (int q = 0; q < kQ; ++q) acc[q][c] = acc[q][c] + sq[q][r] * vx;  // s_r broadcast to the lanes
    }
  }
#pragma GCC unroll 8
  for (int q = 0; q < kQ; ++q) __builtin_memcpy(y[q] + i0, acc[q], sizeof(acc[q]));
}

// All n elements: 64 at a time for one output, 32 for two, 16 for four, then 8, then one by one.
template <int kTag, int kQ>
__attribute__((always_inline)) static inline void axpy_rows_all(const float* const* s, const float* x, int64_t stride,
                                                                int64_t n_x, float* const* y, int64_t n) {
  if (n_x <= 0) return;  // no rows: y stays (and x may be null)
  constexpr int kWide = kQ == 1 ? 8 : 8 / kQ;
  int64_t i = 0;
  for (; i + 8 * kWide <= n; i += 8 * kWide) axpy_rows_chunk<kTag, kQ, kWide>(s, x, stride, n_x, y, i);
  for (; i + 8 <= n; i += 8) axpy_rows_chunk<kTag, kQ, 1>(s, x, stride, n_x, y, i);
  for (; i < n; ++i)
    for (int q = 0; q < kQ; ++q) {
      float v = y[q][i];
      for (int64_t r = 0; r < n_x; ++r) v = v + s[q][r] * x[r * stride + i];
      y[q][i] = v;
    }
}

namespace {
// The AVX2 clones of the forms attention calls (kQ = 1, 2, 4 queries or outputs), and the choice between
// them and the baseline forms, made once from the CPU.
#if defined(__x86_64__)
template <int kQ>
__attribute__((target("avx2"))) void dot_rows_avx2(const float* const* a, const float* b, int64_t stride, int64_t n_b,
                                                   int64_t n, float* const* out) {
  dot_rows_all<1, kQ>(a, b, stride, n_b, n, out);
}
template <int kQ>
__attribute__((target("avx2"))) void axpy_rows_avx2(const float* const* s, const float* x, int64_t stride, int64_t n_x,
                                                    float* const* y, int64_t n) {
  axpy_rows_all<1, kQ>(s, x, stride, n_x, y, n);
}
bool cpu_has_avx2() {
  __builtin_cpu_init();  // this runs from a static initializer, possibly before libgcc's own
  return __builtin_cpu_supports("avx2");
}
const bool kHaveAvx2 = cpu_has_avx2();
#endif

template <int kQ>
void dot_rows(const float* const* a, const float* b, int64_t stride, int64_t n_b, int64_t n, float* const* out) {
#if defined(__x86_64__)
  if (kHaveAvx2) return dot_rows_avx2<kQ>(a, b, stride, n_b, n, out);
#endif
  dot_rows_all<0, kQ>(a, b, stride, n_b, n, out);
}
template <int kQ>
void axpy_rows(const float* const* s, const float* x, int64_t stride, int64_t n_x, float* const* y, int64_t n) {
#if defined(__x86_64__)
  if (kHaveAvx2) return axpy_rows_avx2<kQ>(s, x, stride, n_x, y, n);
#endif
  axpy_rows_all<0, kQ>(s, x, stride, n_x, y, n);
}
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
  const float* const as[1] = {a};
  float* const outs[1] = {out};
  dot_rows<1>(as, b, stride, n_b, n, outs);
}

void axpy_f32_rows(const float* s, const float* x, int64_t stride, int64_t n_x, float* y, int64_t n) {
  const float* const ss[1] = {s};
  float* const ys[1] = {y};
  axpy_rows<1>(ss, x, stride, n_x, ys, n);
}

void dot_f32_rows2(const float* a0, const float* a1, const float* b, int64_t stride, int64_t n_b, int64_t n,
                   float* out0, float* out1) {
  const float* const as[2] = {a0, a1};
  float* const outs[2] = {out0, out1};
  dot_rows<2>(as, b, stride, n_b, n, outs);
}

void axpy_f32_rows2(const float* s0, const float* s1, const float* x, int64_t stride, int64_t n_x, float* y0,
                    float* y1, int64_t n) {
  const float* const ss[2] = {s0, s1};
  float* const ys[2] = {y0, y1};
  axpy_rows<2>(ss, x, stride, n_x, ys, n);
}

void dot_f32_rows4(const float* const a[4], const float* b, int64_t stride, int64_t n_b, int64_t n, float* const out[4]) {
  dot_rows<4>(a, b, stride, n_b, n, out);
}

void axpy_f32_rows4(const float* const s[4], const float* x, int64_t stride, int64_t n_x, float* const y[4], int64_t n) {
  axpy_rows<4>(s, x, stride, n_x, y, n);
}

void add_f32(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = y[i] + x[i];
}

}  // namespace essaim
