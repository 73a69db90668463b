// AVX-512 (F, BW, VL, VNNI) dot products of the quantised formats, bit-identical to dot_scalar.cpp.
//
// Q8_0 lives here: vpdpbusd on whole blocks, whose reference sum is one integer. The K-quants have their
// own files: Q4_K/Q5_K in dot_q45k_avx512.cpp, Q6_K in dot_q6k_avx512.cpp.
#include <immintrin.h>

#include <cstdint>

#include "kernels/blocks.h"
#include "kernels/dot_kernels.h"
#include "kernels/dot_q8_0_x86.h"

namespace essaim {
namespace {

// One block's Σ w_i·x_i as 8 partial i32 sums, by vpdpbusd on |w| and x carrying w's sign.
struct Q8_0PartialsVnni {
  static __m256i of(__m256i w_abs, __m256i w, __m256i x) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w_abs, _mm256_sign_epi8(x, w));
  }
};

}  // namespace

void vec_dot_q8_0_q8_0_avx512(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  using x86::dot_q8_0;
  ESSAIM_DISPATCH_NX(dot_q8_0, Q8_0PartialsVnni)
}

}  // namespace essaim
