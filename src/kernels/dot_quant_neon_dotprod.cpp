// AArch64 dot-product-extension (SDOT, `vdotq_s32`) kernels, bit-identical to dot_scalar.cpp. Compiled
// with -march=armv8.2-a+dotprod; only called after kernel_traits.cpp found the CPU's asimddp bit.
//
// SDOT adds four neighbouring byte products into one i32, so for the K-quants both operands are first put
// in "lanes4" order: per 32-element sub-block, byte 4l + c is element 8c + l (l = 0..7, c = 0..3) — lane
// l's four elements side by side. One SDOT per 16 bytes then yields lanes 0..3 (or 4..7) of the sub-block,
// exactly the reference's Σ_c q[8c+l]·x[8c+l]. The activation rows are rewritten once per product
// (prepare_q8k_lanes4_neon); the weight bytes are permuted in registers with one TBL per 16 bytes (an
// expert stays a byte range of the file). Q8_0's block sum is one integer, so it needs no order at all.
// Q6_K has two elements per lane per 16-element sub-block (SDOT would waste half its width): the plain NEON
// kernel serves it, and the float formats have no integer part.
// Helpers are static and no core/ header with inline code is included (see blocks.h: weak symbols compiled
// for +dotprod must not reach baseline code); f16 scales are converted with the conversion instruction.
#include <arm_neon.h>

#include <cstdint>
#include <cstring>

#include "kernels/blocks.h"
#include "kernels/dot_kernels.h"
#include "kernels/dot_neon_q45k.h"

namespace essaim {
namespace {

// TBL indices of lanes4: output byte 4l + c takes input byte 8c + l.
alignas(16) const uint8_t kLanes4[32] = {0, 8,  16, 24, 1, 9,  17, 25, 2, 10, 18, 26, 3, 11, 19, 27,
                                         4, 12, 20, 28, 5, 13, 21, 29, 6, 14, 22, 30, 7, 15, 23, 31};

static inline void lanes4(uint8x16_t in0, uint8x16_t in1, uint8x16_t* out0, uint8x16_t* out1) {
  const uint8x16x2_t t = {{in0, in1}};
  *out0 = vqtbl2q_u8(t, vld1q_u8(kLanes4));
  *out1 = vqtbl2q_u8(t, vld1q_u8(kLanes4 + 16));
}

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

// SDOT: the 256 values in lanes4 order (q[2s], q[2s+1] = lanes 0..3 and 4..7 of sub-block s; the
// permutation is applied to the packed bytes, so one TBL pair serves both nibbles), and a sub-block's lane
// sums by one SDOT per 16 bytes against the prepared (lanes4) activations.
struct DotprodQ45k {
  template <bool kFiveBit, typename Block>
  static void decode(const Block& b, int8x16_t q[16]) {
    const uint8x16_t low4 = vdupq_n_u8(0x0F);
    uint8x16_t h0 = vdupq_n_u8(0), h1 = vdupq_n_u8(0);
    if constexpr (kFiveBit) lanes4(vld1q_u8(b.qh), vld1q_u8(b.qh + 16), &h0, &h1);
    for (int j = 0; j < 4; ++j) {
      uint8x16_t b0, b1;
      lanes4(vld1q_u8(b.qs + 32 * j), vld1q_u8(b.qs + 32 * j + 16), &b0, &b1);
      uint8x16_t v[4] = {vandq_u8(b0, low4), vandq_u8(b1, low4), vshrq_n_u8(b0, 4), vshrq_n_u8(b1, 4)};
      if constexpr (kFiveBit) neon_q5k_add_high_bits(v, h0, h1, j);
      for (int i = 0; i < 4; ++i) q[4 * j + i] = vreinterpretq_s8_u8(v[i]);
    }
  }
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

void prepare_q8k_lanes4_neon(const void* x, void* out, int64_t n) {
  const auto* in = static_cast<const BlockQ8K*>(x);
  auto* o = static_cast<BlockQ8K*>(out);
  for (int64_t k = 0; k < n / kQK_K; ++k) {
    std::memcpy(&o[k], &in[k], sizeof(BlockQ8K));
    for (int s = 0; s < 8; ++s) {
      uint8x16_t a, b;
      lanes4(vld1q_u8(reinterpret_cast<const uint8_t*>(in[k].qs) + 32 * s),
             vld1q_u8(reinterpret_cast<const uint8_t*>(in[k].qs) + 32 * s + 16), &a, &b);
      vst1q_u8(reinterpret_cast<uint8_t*>(o[k].qs) + 32 * s, a);
      vst1q_u8(reinterpret_cast<uint8_t*>(o[k].qs) + 32 * s + 16, b);
    }
  }
}

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
