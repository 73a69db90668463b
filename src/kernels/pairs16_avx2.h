// The pairs16 byte order of the AVX2 Q6_K layout, shared by the files compiled for AVX2 only
// (dot_quant_avx2.cpp, matmul_lanes_avx2.cpp): output byte 2i = input byte i, 2i+1 = input byte i+8, in
// each 128-bit half. Any byte order shared by both operands gives the same integer sums.
#pragma once

#include <immintrin.h>

namespace essaim {

static inline __m256i pairs16(__m256i v) {
  const __m256i k = _mm256_setr_epi8(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15,  //
                                     0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
  return _mm256_shuffle_epi8(v, k);
}

}  // namespace essaim
