// NEON dot products of the quantised formats against their activation formats (Q8_0·Q8_0, Q4_K/Q5_K/Q6_K
// ·Q8_K), bit-identical to dot_scalar.cpp. Baseline AArch64; the dot-product-extension variants are in
// dot_quant_neon_dotprod.cpp.
//
// The canonical K-quant orders (docs/kernels.md) fix only the f32 steps per row and super-block; the
// integers A (and M) are exact in any grouping. Here vmull_s8 / vmlal_s8 multiply eight bytes into eight
// i16 products; the four 8-element groups of a 32-element sub-block (two of a 16-element Q6_K one) are
// added element-wise (at most 4·31·128 = 15 872 in magnitude), vmlal_n_s16 applies the sub-block scale
// into i32 partial sums, and a row's partial vector is summed with the other rows' by one pairwise-add
// tree; the f32 steps then run for four rows at once.
#include <arm_neon.h>

#include <cstdint>

#include "core/fp16.h"
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
    const float dw = f16_to_f32(w[k].d);
    for (int j = 0; j < NX; ++j) {
      const int8x16_t x0 = vld1q_s8(x[j][k].qs), x1 = vld1q_s8(x[j][k].qs + 16);
      int16x8_t p0 = vmull_s8(vget_low_s8(w0), vget_low_s8(x0));
      int16x8_t p1 = vmull_high_s8(w0, x0);
      int16x8_t p2 = vmull_s8(vget_low_s8(w1), vget_low_s8(x1));
      int16x8_t p3 = vmull_high_s8(w1, x1);
      int32x4_t s = vpaddlq_s16(p0);
      s = vpadalq_s16(s, p1);
      s = vpadalq_s16(s, p2);
      s = vpadalq_s16(s, p3);
      const int32_t sumi = vaddvq_s32(s);
      acc[j] = __builtin_fmaf(float(sumi), dw * f16_to_f32(x[j][k].d), acc[j]);
    }
  }
  for (int j = 0; j < NX; ++j) y[j] = acc[j];
}

// Partial sums of one 32-element sub-block: q holds elements 0..15 and 16..31 (values < 32), x the same of
// the activation. Returns i16 element l = Σ_c q[8c+l]·x[8c+l] (their total is the sub-block's Σ q·x).
static inline int16x8_t lanes32(int8x16_t q0, int8x16_t q1, int8x16_t x0, int8x16_t x1) {
  int16x8_t p = vmull_s8(vget_low_s8(q0), vget_low_s8(x0));
  p = vmlal_high_s8(p, q0, x0);
  p = vmlal_s8(p, vget_low_s8(q1), vget_low_s8(x1));
  return vmlal_high_s8(p, q1, x1);
}

// Plain NEON: a sub-block's sum by vmull_s8 / vmlal_s8 of its four 8-element groups (the weights decoded
// to bytes in natural order by neon_q45k_decode).
struct NeonQ45k {
  static int32x4_t sums(const int8x16_t q[16], const BlockQ8K& x, const uint8_t sc[8]) {
    int32x4_t a_lo = vdupq_n_s32(0), a_hi = vdupq_n_s32(0);
    for (int s = 0; s < 8; ++s) {
      const int16x8_t p = lanes32(q[2 * s], q[2 * s + 1], vld1q_s8(x.qs + 32 * s), vld1q_s8(x.qs + 32 * s + 16));
      a_lo = vmlal_n_s16(a_lo, vget_low_s16(p), int16_t(sc[s]));
      a_hi = vmlal_high_n_s16(a_hi, p, int16_t(sc[s]));
    }
    return vaddq_s32(a_lo, a_hi);
  }
};

template <int NX>
void q4k_rows(int64_t n, const void* w, const void* x, size_t xs, float* y) {
  q45k_rows_neon<NeonQ45k, false, BlockQ4K, NX>(n, w, x, xs, y);
}
template <int NX>
void q5k_rows(int64_t n, const void* w, const void* x, size_t xs, float* y) {
  q45k_rows_neon<NeonQ45k, true, BlockQ5K, NX>(n, w, x, xs, y);
}

// Sub-block s (16 elements) of a Q6_K block as signed values: the low nibble of ql (high nibble for
// c >= 2) and bits 2c..2c+1 of qh, minus 32, with h = s/8, c = (s%8)/2, o = 16(s%2) (as Q6kRun in
// dot_scalar.cpp).
static inline int8x16_t q6k_sub(const BlockQ6K& b, int s) {
  const int h = s / 8, c = (s % 8) / 2, o = 16 * (s % 2);
  const uint8x16_t ql = vld1q_u8(b.ql + 64 * h + 32 * (c & 1) + o);
  const uint8x16_t qh = vld1q_u8(b.qh + 32 * h + o);
  const uint8x16_t lo = c >= 2 ? vshrq_n_u8(ql, 4) : vandq_u8(ql, vdupq_n_u8(0x0F));
  const uint8x16_t hi = vshlq_n_u8(vandq_u8(vshlq_u8(qh, vdupq_n_s8(int8_t(-2 * c))), vdupq_n_u8(3)), 4);
  return vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo, hi)), vdupq_n_s8(32));
}

// Per row and super-block A = Σ_s scales[s]·Σ_i (q - 32)·x as i32 partials (two elements per i16 product
// element, ≤ 2·32·128), the rows' A by one pairwise tree, then acc = fma(d·y.d, f32(A), acc) for four rows.
template <int NX>
void q6k_rows(int64_t n, const void* wv, const void* xv, size_t xs, float* y) {
  static_assert(NX >= 1 && NX <= 4);
  const auto* w = static_cast<const BlockQ6K*>(wv);
  const BlockQ8K* x[NX];
  for (int j = 0; j < NX; ++j) x[j] = reinterpret_cast<const BlockQ8K*>(static_cast<const uint8_t*>(xv) + j * xs);
  float32x4_t acc = vdupq_n_f32(0.0f);  // row j in element j
  for (int64_t k = 0; k < n / kQK_K; ++k) {
    int8x16_t q[16];
    for (int s = 0; s < 16; ++s) q[s] = q6k_sub(w[k], s);
    int32x4_t a_part[4];
    float yd[4];
    for (int j = 0; j < 4; ++j) {
      a_part[j] = vdupq_n_s32(0);
      yd[j] = 0.0f;
    }
    for (int j = 0; j < NX; ++j) {
      const BlockQ8K& b = x[j][k];
      int32x4_t a_lo = vdupq_n_s32(0), a_hi = vdupq_n_s32(0);
      for (int s = 0; s < 16; ++s) {
        const int8x16_t xv16 = vld1q_s8(b.qs + 16 * s);
        const int16x8_t p = vmlal_high_s8(vmull_s8(vget_low_s8(q[s]), vget_low_s8(xv16)), q[s], xv16);
        a_lo = vmlal_n_s16(a_lo, vget_low_s16(p), int16_t(w[k].scales[s]));
        a_hi = vmlal_high_n_s16(a_hi, p, int16_t(w[k].scales[s]));
      }
      a_part[j] = vaddq_s32(a_lo, a_hi);
      yd[j] = b.d;
    }
    const float32x4_t d = vmulq_n_f32(vld1q_f32(yd), f16_to_f32(w[k].d));
    acc = vfmaq_f32(acc, d, vcvtq_f32_s32(neon_hsum4_s32(a_part)));
  }
  float out[4];
  vst1q_f32(out, acc);
  for (int j = 0; j < NX; ++j) y[j] = out[j];
}

}  // namespace

void vec_dot_q8_0_q8_0_neon(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  ESSAIM_DISPATCH_NX(q8_0_rows)
}
void vec_dot_q4k_q8k_neon(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  ESSAIM_DISPATCH_NX(q4k_rows)
}
void vec_dot_q5k_q8k_neon(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  ESSAIM_DISPATCH_NX(q5k_rows)
}
void vec_dot_q6k_q8k_neon(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  ESSAIM_DISPATCH_NX(q6k_rows)
}

}  // namespace essaim
