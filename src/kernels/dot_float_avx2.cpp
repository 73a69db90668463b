// AVX2 + FMA + F16C dot products of the float formats (F32, F16, BF16), bit-identical to dot_scalar.cpp:
// sixteen f32 lanes as two ymm registers (lanes 0..7, 8..15), element i into lane i % 16 by FMA; the tail
// that does not fill 16 elements continues the same rule lane by lane; then reduce_lanes16.
// Compiled with -mavx2 -mfma -mf16c; only called after kernel_traits.cpp checked the CPU.
#include <immintrin.h>

#include <cstdint>

#include "kernels/dot_kernels.h"

namespace essaim {
namespace {

struct F32 {
  using T = float;
  static __m256 load8(const T* p) { return _mm256_loadu_ps(p); }
  static float one(const T* p) { return *p; }
};

struct F16 {
  using T = uint16_t;
  static __m256 load8(const T* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static float one(const T* p) { return _cvtsh_ss(*p); }
};

struct BF16 {
  using T = uint16_t;
  static __m256 load8(const T* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  static float one(const T* p) {
    const uint32_t bits = uint32_t(*p) << 16;
    return _mm_cvtss_f32(_mm_castsi128_ps(_mm_cvtsi32_si128(int32_t(bits))));
  }
};

template <typename Fmt, int NX>
void dot_rows(int64_t n, const void* wv, const void* xv, size_t x_stride, float* y) {
  using T = typename Fmt::T;
  const T* w = static_cast<const T*>(wv);
  const T* x[NX];
#pragma GCC unroll 8
  for (int j = 0; j < NX; ++j) x[j] = reinterpret_cast<const T*>(static_cast<const uint8_t*>(xv) + j * x_stride);
  __m256 lo[NX], hi[NX];
#pragma GCC unroll 8
  for (int j = 0; j < NX; ++j) lo[j] = hi[j] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 w0 = Fmt::load8(w + i), w1 = Fmt::load8(w + i + 8);
#pragma GCC unroll 8
    for (int j = 0; j < NX; ++j) {
      lo[j] = _mm256_fmadd_ps(w0, Fmt::load8(x[j] + i), lo[j]);
      hi[j] = _mm256_fmadd_ps(w1, Fmt::load8(x[j] + i + 8), hi[j]);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < NX; ++j) {
    alignas(32) float lane[16];
    _mm256_store_ps(lane, lo[j]);
    _mm256_store_ps(lane + 8, hi[j]);
    for (int64_t k = i; k < n; ++k) lane[k % 16] = __builtin_fmaf(Fmt::one(w + k), Fmt::one(x[j] + k), lane[k % 16]);
    y[j] = reduce_lanes16(lane);
  }
}

}  // namespace

void vec_dot_f32_f32_avx2(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  ESSAIM_DISPATCH_NX(dot_rows, F32)
}
void vec_dot_f16_f16_avx2(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  ESSAIM_DISPATCH_NX(dot_rows, F16)
}
void vec_dot_bf16_bf16_avx2(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  ESSAIM_DISPATCH_NX(dot_rows, BF16)
}

}  // namespace essaim
