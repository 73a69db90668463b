// Internal to the AArch64 kernel files: the Q4_K / Q5_K super-block driver shared by the NEON
// (dot_quant_neon.cpp) and NEON + dotprod (dot_quant_neon_dotprod.cpp) kernels. The two differ only in how
// the weights are decoded and how a sub-block's eight lane sums are formed (vmull_s8 in natural order, or
// SDOT in lanes4 order); the min term, the f32 steps of the canonical order (docs/kernels.md) and the
// final fold are the same code here.
//
//   struct MyKernel {
//     template <bool kFiveBit, typename Block> static void decode(const Block& b, int8x16_t q[16]);
//     static void sums(const int8x16_t q[16], const BlockQ8K& x, const uint8_t sc[8], int32x4_t* lo, int32x4_t* hi);
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

// M = Σ_g bsums[g]·m[g/2] over the 16 groups of 16 (exact in i32).
static inline int32_t neon_q45k_mins(const int16_t* bsums, const uint8_t m[8]) {
  const uint8x8_t mv = vld1_u8(m);
  const int16x8_t m_lo = vreinterpretq_s16_u16(vmovl_u8(vzip1_u8(mv, mv)));  // m0 m0 m1 m1 .. m3 m3
  const int16x8_t m_hi = vreinterpretq_s16_u16(vmovl_u8(vzip2_u8(mv, mv)));  // m4 m4 .. m7 m7
  int32x4_t s = vmull_s16(vget_low_s16(vld1q_s16(bsums)), vget_low_s16(m_lo));
  s = vmlal_high_s16(s, vld1q_s16(bsums), m_lo);
  s = vmlal_s16(s, vget_low_s16(vld1q_s16(bsums + 8)), vget_low_s16(m_hi));
  s = vmlal_high_s16(s, vld1q_s16(bsums + 8), m_hi);
  return vaddvq_s32(s);
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

// y[j] = dot(w, x_j) for NX activation rows: per super-block the weights are decoded once, the exact
// integer A[l] (Kernel::sums) and M (bsums) per row, then lane[l] = fma(db, f32(A[l]), lane[l]) and
// acc = fma(-dmb, f32(M), acc); at the end fold_lanes8(acc, lane).
template <typename Kernel, bool kFiveBit, typename Block, int NX>
static inline void q45k_rows_neon(int64_t n, const void* wv, const void* xv, size_t xs, float* y) {
  const auto* w = static_cast<const Block*>(wv);
  const BlockQ8K* x[NX];
  for (int j = 0; j < NX; ++j) x[j] = reinterpret_cast<const BlockQ8K*>(static_cast<const uint8_t*>(xv) + j * xs);
  float32x4_t lane_lo[NX], lane_hi[NX];
  float acc[NX];
  for (int j = 0; j < NX; ++j) {
    lane_lo[j] = lane_hi[j] = vdupq_n_f32(0.0f);
    acc[j] = 0.0f;
  }
  for (int64_t k = 0; k < n / kQK_K; ++k) {
    uint8_t sc[8], m[8];
    q4k_unpack_scales(w[k].scales, sc, m);
    int8x16_t q[16];
    Kernel::template decode<kFiveBit>(w[k], q);
    const float dw = neon_f16_value(w[k].d), dminw = neon_f16_value(w[k].dmin);
    for (int j = 0; j < NX; ++j) {
      const BlockQ8K& b = x[j][k];
      int32x4_t a_lo, a_hi;
      Kernel::sums(q, b, sc, &a_lo, &a_hi);
      const int32_t M = neon_q45k_mins(b.bsums, m);
      const float db = dw * b.d, dmb = dminw * b.d;
      lane_lo[j] = vfmaq_n_f32(lane_lo[j], vcvtq_f32_s32(a_lo), db);  // fma(db, A[l], lane[l])
      lane_hi[j] = vfmaq_n_f32(lane_hi[j], vcvtq_f32_s32(a_hi), db);
      acc[j] = __builtin_fmaf(-dmb, float(M), acc[j]);
    }
  }
  for (int j = 0; j < NX; ++j) {
    float lane[8];
    vst1q_f32(lane, lane_lo[j]);
    vst1q_f32(lane + 4, lane_hi[j]);
    y[j] = fold_lanes8(acc[j], lane);
  }
}

}  // namespace essaim
