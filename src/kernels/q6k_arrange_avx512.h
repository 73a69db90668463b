// The Q6_K "by group" arrangement of the AVX-512 kernels (dot_q6k_avx512.cpp) and the AMX tiles
// (matmul_amx.cpp): one definition, so that weights and prepared activations agree in both. Include only
// from files compiled with the AVX-512 flags; everything is static inline (blocks.h explains why).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/blocks.h"

namespace essaim {

// The by-group order of 256 bytes held in element order as e[0..3] (64 bytes each): a 4×4 dword transpose
// in each 128-bit lane L, out[i] dword 4L + m = e[m] dword 4L + i. Lane L of e[m] is sub-block 4m + L, so
// dword p = 4L + m of every out[i] belongs to sub-block 4m + L = 4(p % 4) + p / 4.
static inline void by_group(const __m512i e[4], __m512i out[4]) {
  const __m512i t0 = _mm512_unpacklo_epi32(e[0], e[1]), t1 = _mm512_unpackhi_epi32(e[0], e[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(e[2], e[3]), t3 = _mm512_unpackhi_epi32(e[2], e[3]);
  out[0] = _mm512_unpacklo_epi64(t0, t2);
  out[1] = _mm512_unpackhi_epi64(t0, t2);
  out[2] = _mm512_unpacklo_epi64(t1, t3);
  out[3] = _mm512_unpackhi_epi64(t1, t3);
}

// One Q6_K super-block ready for every row: w[i] the unsigned 6-bit values by group, scales the sixteen
// sc[s(p)] as i32 in dword p.
struct Q6kWeights {
  __m512i w[4], scales;
};

// Values 128h .. 128h + 127 (h = 0, 1) of a Q6_K block in element order, as the unsigned 6-bit values (0..63):
// e[0] elements 128h .. 128h + 63, e[1] the next 64.
static inline void q6k_values128(const BlockQ6K& a, int h, __m512i e[2]) {
  const __m512i low4 = _mm512_set1_epi8(0x0F), bits45 = _mm512_set1_epi8(0x30);
  // ql byte l: element 128h + l in the low nibble, 128h + 64 + l in the high one; qh byte l % 32 holds
  // bits 4, 5 of elements 128h + 32c + l % 32 at bits 2c, 2c + 1. 32-bit rotations bring qh bits 2c, 2c+1
  // of each byte to bits 4, 5 of the same byte, for the lower (group c) and upper (group c+1) half of the
  // vector; the mask drops what other bits move in.
  __m512i ql = _mm512_loadu_si512(a.ql + 64 * h);
  __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.qh + 32 * h)));
  asm("" : "+v"(ql), "+v"(qh));  // each loaded once for both halves (GCC 12 would load them per use)
  const __m512i rot01 = _mm512_inserti64x4(_mm512_set1_epi32(4), _mm256_set1_epi32(2), 1);
  const __m512i rot23 = _mm512_inserti64x4(_mm512_set1_epi32(0), _mm256_set1_epi32(30), 1);
  e[0] = _mm512_or_si512(_mm512_and_si512(ql, low4), _mm512_and_si512(_mm512_rolv_epi32(qh, rot01), bits45));
  e[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4),
                         _mm512_and_si512(_mm512_rolv_epi32(qh, rot23), bits45));
}

// Values 64m .. 64m + 63 (m = 0..3) alone (the row lanes take one m of sixteen rows at a time).
static inline __m512i q6k_values64(const BlockQ6K& a, int m) {
  __m512i e[2];
  q6k_values128(a, m / 2, e);
  return e[m % 2];
}

static inline Q6kWeights q6k_weights(const BlockQ6K& a) {
  __m512i e[4];  // the 6-bit values in element order, 64 per vector
  q6k_values128(a, 0, e);
  q6k_values128(a, 1, e + 2);
  Q6kWeights r;
  by_group(e, r.w);
  const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a.scales));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);  // s(p)
  r.scales = _mm512_permutexvar_epi32(order, _mm512_cvtepi8_epi32(sc8));
  return r;
}

}  // namespace essaim
