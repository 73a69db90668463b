// AArch64 dot-product-extension (SDOT, `vdotq_s32`) kernels, bit-identical to dot_scalar.cpp. Compiled
// with -march=armv8.2-a+dotprod; only called after kernel_traits.cpp found the CPU's asimddp bit.
//
// SDOT adds four neighbouring byte products into one i32. The canonical K-quant orders (docs/kernels.md)
// fix only the f32 steps per row and super-block, and the integer A is exact in any grouping, so the
// bytes stay in memory order on both sides: two SDOT per 32-element sub-block (weights decoded to bytes,
// activations as quantised) give four partial sums of the sub-block, vmlaq_n_s32 applies its 6-bit scale,
// and the shared driver (dot_neon_q45k.h) reduces the rows and runs the f32 steps. Q8_0's block sum is one
// integer too. Q6_K has 16-element sub-blocks and signed values: the plain NEON kernel serves it, and the
// float formats have no integer part.
// Helpers are static and no core/ header with inline code is included (see blocks.h: weak symbols compiled
// for +dotprod must not reach baseline code); f16 scales are converted with the conversion instruction.
#include <arm_neon.h>

#include <cstdint>

#include "kernels/blocks.h"
#include "kernels/dot_kernels.h"
#include "kernels/dot_neon_q45k.h"

namespace essaim {
namespace {

template <int NX>
void q8_0_rows(int64_t n, const void* wv, const void* xv, size_t xs, float* y) {
  const auto* w = static_cast<const BlockQ8_0*>(wv);
  const BlockQ8_0* x[NX];
  for (int j = 0; j < NX; ++j) x[j] = reinterpret_cast<const BlockQ8_0*>(static_cast<const uint8_t*>(xv) + j * xs);
  float acc[NX] = {};
  for (int64_t k = 0; k < n / kQK8_0; ++k) {
    const int8x16_t w0 = vld1q_s8(w[k].qs), w1 = vld1q_s8(w[k].qs + 16);
    const float dw = neon_f16_value(w[k].d);
    for (int j = 0; j < NX; ++j) {
      int32x4_t s = vdotq_s32(vdupq_n_s32(0), w0, vld1q_s8(x[j][k].qs));
      s = vdotq_s32(s, w1, vld1q_s8(x[j][k].qs + 16));
      acc[j] = __builtin_fmaf(float(vaddvq_s32(s)), dw * neon_f16_value(x[j][k].d), acc[j]);
    }
  }
  for (int j = 0; j < NX; ++j) y[j] = acc[j];
}

// SDOT: a sub-block's sum by two SDOT of the weight bytes (natural order, neon_q45k_decode) against the
// activation bytes as quantised.
struct DotprodQ45k {
  static int32x4_t sums(const int8x16_t q[16], const BlockQ8K& x, const uint8_t sc[8]) {
    int32x4_t a = vdupq_n_s32(0);
    for (int s = 0; s < 8; ++s) {
      const int32x4_t d = vdotq_s32(vdotq_s32(vdupq_n_s32(0), q[2 * s], vld1q_s8(x.qs + 32 * s)), q[2 * s + 1],
                                    vld1q_s8(x.qs + 32 * s + 16));
      a = vmlaq_n_s32(a, d, int32_t(sc[s]));
    }
    return a;
  }
};

template <int NX>
void q4k_rows(int64_t n, const void* w, const void* x, size_t xs, float* y) {
  q45k_rows_neon<DotprodQ45k, false, BlockQ4K, NX>(n, w, x, xs, y);
}
template <int NX>
void q5k_rows(int64_t n, const void* w, const void* x, size_t xs, float* y) {
  q45k_rows_neon<DotprodQ45k, true, BlockQ5K, NX>(n, w, x, xs, y);
}

}  // namespace

void vec_dot_q8_0_q8_0_dotprod(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  ESSAIM_DISPATCH_NX(q8_0_rows)
}
void vec_dot_q4k_q8k_dotprod(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  ESSAIM_DISPATCH_NX(q4k_rows)
}
void vec_dot_q5k_q8k_dotprod(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  ESSAIM_DISPATCH_NX(q5k_rows)
}

}  // namespace essaim
