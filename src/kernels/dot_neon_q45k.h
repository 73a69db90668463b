// Internal to the AArch64 kernel files: the Q4_K / Q5_K super-block driver shared by the NEON
// (dot_quant_neon.cpp) and NEON + dotprod (dot_quant_neon_dotprod.cpp) kernels. The two differ only in how
// a sub-block's sum is formed (vmull_s8 / vmlal_s8, or SDOT; any grouping gives the same exact integer A);
// the weight decode, the min term, the reduction of all rows' A and M with one pairwise-add tree and the
// two f32 steps of the canonical order (docs/kernels.md) are the same code here.
//   struct MyKernel {  // the four partial sums of A = Σ_s sc[s]·Σ_i q·x for one row
//     static int32x4_t sums(const int8x16_t q[16], const BlockQ8K& x, const uint8_t sc[8]);
//   };
//   q45k_rows_neon<MyKernel, true, BlockQ5K, NX>(n, w, x, xs, y);
//
// Everything is `static inline` and no core/ header is included: the dotprod file is compiled with
// -march=armv8.2-a+dotprod, and a weak inline symbol built for it must not reach baseline code (blocks.h).
#pragma once

#include <arm_neon.h>

#include <cstddef>
#include <cstdint>

#include "kernels/blocks.h"
#include "kernels/dot_kernels.h"

namespace essaim {

// f16 -> f32 with the conversion instruction (exact, as f16_to_f32).
static inline float neon_f16_value(uint16_t h) {
  return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

// M = Σ_g bsums[g]·m[g/2] over the 16 groups of 16 (exact in i32), as four partial sums.
static inline int32x4_t neon_q45k_mins(const int16_t* bsums, const uint8_t m[8]) {
  const uint8x8_t mv = vld1_u8(m);
  const int16x8_t m_lo = vreinterpretq_s16_u16(vmovl_u8(vzip1_u8(mv, mv)));  // m0 m0 m1 m1 .. m3 m3
  const int16x8_t m_hi = vreinterpretq_s16_u16(vmovl_u8(vzip2_u8(mv, mv)));  // m4 m4 .. m7 m7
  int32x4_t s = vmull_s16(vget_low_s16(vld1q_s16(bsums)), vget_low_s16(m_lo));
  s = vmlal_high_s16(s, vld1q_s16(bsums), m_lo);
  s = vmlal_s16(s, vget_low_s16(vld1q_s16(bsums + 8)), vget_low_s16(m_hi));
  return vmlal_high_s16(s, vld1q_s16(bsums + 8), m_hi);
}

// [Σ v[0], Σ v[1], Σ v[2], Σ v[3]] (exact i32): the transpose-add tree of four rows' partial sums, which
// vpaddq is (rows past NX are zero and ignored).
static inline int32x4_t neon_hsum4_s32(const int32x4_t v[4]) {
  return vpaddq_s32(vpaddq_s32(v[0], v[1]), vpaddq_s32(v[2], v[3]));
}

// Q5_K's fifth bit: sub-blocks 2j and 2j+1 take bits 2j and 2j+1 of qh (h0: elements 0..15, h1: 16..31,
// in the same byte order as v) as +16. v = {2j low, 2j high, 2j+1 low, 2j+1 high halves}.
static inline void neon_q5k_add_high_bits(uint8x16_t v[4], uint8x16_t h0, uint8x16_t h1, int j) {
  const uint8x16_t sixteen = vdupq_n_u8(16);
  const uint8x16_t bit_lo = vdupq_n_u8(uint8_t(1u << (2 * j))), bit_hi = vdupq_n_u8(uint8_t(2u << (2 * j)));
  v[0] = vorrq_u8(v[0], vandq_u8(vtstq_u8(h0, bit_lo), sixteen));
  v[1] = vorrq_u8(v[1], vandq_u8(vtstq_u8(h1, bit_lo), sixteen));
  v[2] = vorrq_u8(v[2], vandq_u8(vtstq_u8(h0, bit_hi), sixteen));
  v[3] = vorrq_u8(v[3], vandq_u8(vtstq_u8(h1, bit_hi), sixteen));
}

// The 256 values of a Q4_K / Q5_K block decoded to bytes in natural order: q[2s], q[2s+1] = sub-block s,
// elements 0..15 and 16..31 (docs/reference.md 2.4: qs[32j + i] holds sub-block 2j in its low nibble,
// 2j+1 in its high one; Q5_K adds its fifth bit).
template <bool kFiveBit, typename Block>
static inline void neon_q45k_decode(const Block& b, int8x16_t q[16]) {
  const uint8x16_t low4 = vdupq_n_u8(0x0F);
  for (int j = 0; j < 4; ++j) {
    const uint8x16_t b0 = vld1q_u8(b.qs + 32 * j), b1 = vld1q_u8(b.qs + 32 * j + 16);
    uint8x16_t v[4] = {vandq_u8(b0, low4), vandq_u8(b1, low4), vshrq_n_u8(b0, 4), vshrq_n_u8(b1, 4)};
    if constexpr (kFiveBit) neon_q5k_add_high_bits(v, vld1q_u8(b.qh), vld1q_u8(b.qh + 16), j);
    for (int i = 0; i < 4; ++i) q[4 * j + i] = vreinterpretq_s8_u8(v[i]);
  }
}

// y[j] = dot(w, x_j) for NX <= 4 activation rows: per super-block the weights are decoded once, each row's
// exact A (Kernel::sums) and M (bsums) as partial vectors, the four rows' A and M summed by one pairwise
// tree each (row j in element j), then acc = fma(db, f32(A), acc) and acc = fma(-dmb, f32(M), acc) for all
// rows at once (vfmaq / vfmsq: one rounding each, as std::fma).
template <typename Kernel, bool kFiveBit, typename Block, int NX>
static inline void q45k_rows_neon(int64_t n, const void* wv, const void* xv, size_t xs, float* y) {
  static_assert(NX >= 1 && NX <= 4);
  const auto* w = static_cast<const Block*>(wv);
  const BlockQ8K* x[NX];
  for (int j = 0; j < NX; ++j) x[j] = reinterpret_cast<const BlockQ8K*>(static_cast<const uint8_t*>(xv) + j * xs);
  float32x4_t acc = vdupq_n_f32(0.0f);  // row j in element j
  for (int64_t k = 0; k < n / kQK_K; ++k) {
    uint8_t sc[8], m[8];
    q4k_unpack_scales(w[k].scales, sc, m);
    int8x16_t q[16];
    neon_q45k_decode<kFiveBit>(w[k], q);
    int32x4_t a_part[4], m_part[4];
    float yd[4];
    for (int j = 0; j < 4; ++j) {
      a_part[j] = m_part[j] = vdupq_n_s32(0);
      yd[j] = 0.0f;
    }
    for (int j = 0; j < NX; ++j) {
      const BlockQ8K& b = x[j][k];
      a_part[j] = Kernel::sums(q, b, sc);
      m_part[j] = neon_q45k_mins(b.bsums, m);
      yd[j] = b.d;
    }
    const float32x4_t ydv = vld1q_f32(yd);
    const float32x4_t db = vmulq_n_f32(ydv, neon_f16_value(w[k].d));
    const float32x4_t dmb = vmulq_n_f32(ydv, neon_f16_value(w[k].dmin));
    acc = vfmaq_f32(acc, db, vcvtq_f32_s32(neon_hsum4_s32(a_part)));   // fma(db, f32(A), acc)
    acc = vfmsq_f32(acc, dmb, vcvtq_f32_s32(neon_hsum4_s32(m_part)));  // fma(-dmb, f32(M), acc)
  }
  float out[4];
  vst1q_f32(out, acc);
  for (int j = 0; j < NX; ++j) y[j] = out[j];
}

}  // namespace essaim
