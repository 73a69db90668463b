// The x86 Q8_0·Q8_0 dot product and the 256-bit integer helpers it needs, shared by dot_quant_avx2.cpp and
// dot_quant_avx512.cpp. The two differ only in how one block's integer partial sums are formed (a Partials
// type: maddubs + madd on AVX2, vpdpbusd on AVX-512 VNNI); each file compiles this header under its own
// target flags, so everything here has internal linkage.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/blocks.h"

namespace essaim::x86 {
namespace {

inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

inline int32_t hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// [S_0 .. S_7]: the full sums of eight partial vectors (eight blocks, or eight rows).
inline __m256i hsum8_i32(const __m256i v[8]) {
  const __m256i h0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
  const __m256i h4567 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(h0123, h4567, 0x20),
                          _mm256_permute2x128_si256(h0123, h4567, 0x31));
}

// The reference is one f32 FMA chain in block order, so only the integer sums and the scale products are
// vectorised, eight blocks at a time; the chain then runs through them one by one. Activations come in
// the q8_0_group8 layout (prepare_q8_0_group8), whose eight scales are one load. Partials::of(|w|, w, x)
// is one block's Σ w_i·x_i as 8 partial i32 sums (x carrying w's sign).
template <typename Partials, int NX>
void dot_q8_0(int64_t n, const void* w, const void* x, size_t x_stride, float* y) {
  const auto* a = static_cast<const BlockQ8_0*>(w);
  const uint8_t* rows[NX];
  float acc[NX];
#pragma GCC unroll 8
  for (int j = 0; j < NX; ++j) {
    rows[j] = static_cast<const uint8_t*>(x) + size_t(j) * x_stride;
    acc[j] = 0.0f;
  }
  const int64_t nb = n / kQK8_0;
  int64_t k = 0;
  for (; k + 8 <= nb; k += 8) {
    __m256i wq[8], wabs[8];
    alignas(16) uint16_t dw16[8];
#pragma GCC unroll 8
    for (int q = 0; q < 8; ++q) {
      wq[q] = load256(a[k + q].qs);
      wabs[q] = _mm256_abs_epi8(wq[q]);
      dw16[q] = a[k + q].d;
    }
    const __m256 dw = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(dw16)));
#pragma GCC unroll 8
    for (int j = 0; j < NX; ++j) {
      const uint8_t* group = rows[j] + size_t(k) * sizeof(BlockQ8_0);  // [8 x f16 d][8 x 32 qs]
      __m256i s[8];
#pragma GCC unroll 8
      for (int q = 0; q < 8; ++q) s[q] = Partials::of(wabs[q], wq[q], load256(group + 16 + 32 * q));
      const __m256 dd = _mm256_mul_ps(dw, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(group))));
      alignas(32) float sumf[8], ddf[8];
      _mm256_store_ps(sumf, _mm256_cvtepi32_ps(hsum8_i32(s)));
      _mm256_store_ps(ddf, dd);
#pragma GCC unroll 8
      for (int q = 0; q < 8; ++q) acc[j] = __builtin_fmaf(sumf[q], ddf[q], acc[j]);
    }
  }
  for (; k < nb; ++k) {  // blocks past the last group of eight keep the plain layout
    const __m256i wq = load256(a[k].qs), wabs = _mm256_abs_epi8(wq);
    const float dw = _cvtsh_ss(a[k].d);
#pragma GCC unroll 8
    for (int j = 0; j < NX; ++j) {
      const auto& b = reinterpret_cast<const BlockQ8_0*>(rows[j])[k];
      const int32_t sumi = hsum_i32(Partials::of(wabs, wq, load256(b.qs)));
      acc[j] = __builtin_fmaf(float(sumi), dw * _cvtsh_ss(b.d), acc[j]);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < NX; ++j) y[j] = acc[j];
}

}  // namespace
}  // namespace essaim::x86
