// A 16 x 16 dword transpose in AVX-512 registers, shared by the files compiled with the AVX-512 flags that
// turn sixteen weight rows into lanes (matmul_amx.cpp, matmul_rowlanes_avx512.cpp). static inline (blocks.h
// explains why); always_inline, so that the sixteen vectors stay in registers at every call.
#pragma once

#include <immintrin.h>

namespace essaim {

// In place: r[j] dword i becomes old r[i] dword j.
static inline __attribute__((always_inline)) void transpose16x16(__m512i r[16]) {
  __m512i a[16], b[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // b[4i + j], 128-bit part L: dword 4L + j of rows 4i..4i+3.
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    b[4 * i] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
    b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
  }
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const __m512i c0 = _mm512_shuffle_i32x4(b[j], b[4 + j], 0x88), c1 = _mm512_shuffle_i32x4(b[j], b[4 + j], 0xDD);
    const __m512i c2 = _mm512_shuffle_i32x4(b[8 + j], b[12 + j], 0x88);
    const __m512i c3 = _mm512_shuffle_i32x4(b[8 + j], b[12 + j], 0xDD);
    r[j] = _mm512_shuffle_i32x4(c0, c2, 0x88);
    r[8 + j] = _mm512_shuffle_i32x4(c0, c2, 0xDD);
    r[4 + j] = _mm512_shuffle_i32x4(c1, c3, 0x88);
    r[12 + j] = _mm512_shuffle_i32x4(c1, c3, 0xDD);
  }
}

}  // namespace essaim
