// AVX-512 dot products of the float formats (F32, F16, BF16), bit-identical to dot_scalar.cpp: the sixteen
// canonical f32 lanes are exactly one zmm register, element i into lane i % 16 by FMA. The partial last
// chunk is a masked load and a masked FMA, which leaves the lanes it does not reach untouched, i.e. the
// scalar tail rule. Compiled with -mavx512f -mavx512bw -mavx512vl (+ AVX2/FMA/F16C).
#include <immintrin.h>

#include <cstdint>

#include "kernels/dot_kernels.h"

namespace essaim {
namespace {

struct F32 {
  using T = float;
  static __m512 load16(const T* p) { return _mm512_loadu_ps(p); }
  static __m512 load_masked(const T* p, __mmask16 k) { return _mm512_maskz_loadu_ps(k, p); }
};

struct F16 {
  using T = uint16_t;
  static __m512 load16(const T* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static __m512 load_masked(const T* p, __mmask16 k) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, p)); }
};

struct BF16 {
  using T = uint16_t;
  static __m512 widen(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
  static __m512 load16(const T* p) { return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static __m512 load_masked(const T* p, __mmask16 k) { return widen(_mm256_maskz_loadu_epi16(k, p)); }
};

template <typename Fmt, int NX>
void dot_rows(int64_t n, const void* wv, const void* xv, size_t x_stride, float* y) {
  using T = typename Fmt::T;
  const T* w = static_cast<const T*>(wv);
  const T* x[NX];
#pragma GCC unroll 8
  for (int j = 0; j < NX; ++j) x[j] = reinterpret_cast<const T*>(static_cast<const uint8_t*>(xv) + j * x_stride);
  __m512 acc[NX];
#pragma GCC unroll 8
  for (int j = 0; j < NX; ++j) acc[j] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 wv16 = Fmt::load16(w + i);
#pragma GCC unroll 8
    for (int j = 0; j < NX; ++j) acc[j] = _mm512_fmadd_ps(wv16, Fmt::load16(x[j] + i), acc[j]);
  }
  if (i < n) {
    const __mmask16 k = __mmask16((1u << (n - i)) - 1);
    const __m512 wv16 = Fmt::load_masked(w + i, k);
#pragma GCC unroll 8
    for (int j = 0; j < NX; ++j) acc[j] = _mm512_mask3_fmadd_ps(wv16, Fmt::load_masked(x[j] + i, k), acc[j], k);
  }
#pragma GCC unroll 8
  for (int j = 0; j < NX; ++j) {
    alignas(64) float lane[16];
    _mm512_store_ps(lane, acc[j]);
    y[j] = reduce_lanes16(lane);
  }
}

}  // namespace

void vec_dot_f32_f32_avx512(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  ESSAIM_DISPATCH_NX(dot_rows, F32)
}
void vec_dot_f16_f16_avx512(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  ESSAIM_DISPATCH_NX(dot_rows, F16)
}
void vec_dot_bf16_bf16_avx512(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  ESSAIM_DISPATCH_NX(dot_rows, BF16)
}

}  // namespace essaim
