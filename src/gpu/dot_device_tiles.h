// The fast device dot products: one weight row against up to kTileRows activation rows at once, the
// weight blocks decoded once per tile, and for Q4_K / Q5_K / Q8_0 the integer sums done with dp4a (four
// byte products added in one instruction). Like dot_device.h, every function compiles for the device and
// for the host (where __dp4a and __byte_perm are emulated bit for bit), so tests/gpu/gpu_dot_host_test.cpp
// checks these very functions against the scalar reference on any machine.
//
//   prepare_q8k_lanes4(xq_row, prepared_row, 3072);               // once per activation row (Q4_K, Q5_K)
//   float y[4];
//   dot_q45k_tile<BlockQ4K>(3072, w_row, prepared, x_stride, 4, y);  // y[j] = dot(w_row, row j)
//
// Why the result is the scalar reference's, bit for bit (docs/kernels.md): the order fixes only the f32
// steps — per row and super-block acc = fma(db, f32(A), acc), then acc = fma(-dmb, f32(M), acc) (Q6_K: one
// step) — while the integers A and M are exact in any grouping. dp4a adds four byte products, so any byte
// order works as long as weights and activations share it; the activations are in "lanes4" order (per
// sub-block, byte 4l + c is element 8c + l: prepare_q8k_lanes4, once per row) and the weights are put in
// the same order in registers (a 4x4 byte transpose with __byte_perm). The eight dp4a of a sub-block
// chain into one sum S, scaled by the sub-block's 6-bit scale into one A per row and super-block. Each
// row of a tile has its own accumulator, updated exactly as a one-row call would, so the tile size
// changes no bit. Q8_0's block sum is one integer too, so dp4a runs on the bytes in memory order. Q6_K
// keeps scalar integer products (16-element sub-blocks) and shares the 6-bit decode across the tile.
#pragma once

#include <cstdint>

#include "gpu/dot_device.h"

namespace essaim::gpu {

inline constexpr int kTileRows = 4;

// --- byte-level primitives: the device instructions, emulated on the host -------------------------------
ESSAIM_HD int32_t dp4a_s8(uint32_t a, uint32_t b, int32_t c) {
#if defined(__CUDA_ARCH__)
  return __dp4a(int(a), int(b), c);
#else
  for (int i = 0; i < 4; ++i) c += int32_t(int8_t(uint8_t(a >> (8 * i)))) * int32_t(int8_t(uint8_t(b >> (8 * i))));
  return c;
#endif
}

// Byte i of the result is byte (selector nibble i & 7) of the 8 bytes {x, y} (x = bytes 0-3). Selectors
// used here never set a nibble's top bit (the sign-replicating mode).
ESSAIM_HD uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(x, y, s);
#else
  const uint64_t v = uint64_t(x) | (uint64_t(y) << 32);
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= uint32_t((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
  return r;
#endif
}

// Four bytes at p (2-byte aligned, as every f16-scaled block field is): two 16-bit loads.
ESSAIM_HD uint32_t load_u32_a2(const uint8_t* p) {
  const auto* h = reinterpret_cast<const uint16_t*>(p);
  return uint32_t(h[0]) | (uint32_t(h[1]) << 16);
}

// 4x4 byte transpose: out[b] byte c = in[c] byte b.
ESSAIM_HD void transpose4x4(uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3, uint32_t out[4]) {
  const uint32_t t0 = byte_perm(r0, r1, 0x5140), t1 = byte_perm(r0, r1, 0x7362);
  const uint32_t t2 = byte_perm(r2, r3, 0x5140), t3 = byte_perm(r2, r3, 0x7362);
  out[0] = byte_perm(t0, t2, 0x5410);
  out[1] = byte_perm(t0, t2, 0x7632);
  out[2] = byte_perm(t1, t3, 0x5410);
  out[3] = byte_perm(t1, t3, 0x7632);
}

// Sub-block values in memory order (v[w] = elements 4w..4w+3) -> lanes4 words (word l = elements 8c + l).
ESSAIM_HD void to_lanes4(const uint32_t v[8], uint32_t lanes[8]) {
  transpose4x4(v[0], v[2], v[4], v[6], lanes);      // lanes 0-3: bytes of words 0, 2, 4, 6
  transpose4x4(v[1], v[3], v[5], v[7], lanes + 4);  // lanes 4-7: bytes of words 1, 3, 5, 7
}

// One Q8_K row of n elements into lanes4 order: d and bsums copied, qs[32s + 4l + c] = qs[32s + 8c + l].
ESSAIM_HD void prepare_q8k_lanes4(const void* x, void* out, int64_t n) {
  const auto* in = static_cast<const BlockQ8K*>(x);
  auto* o = static_cast<BlockQ8K*>(out);
  for (int64_t k = 0; k < n / kQK_K; ++k) {
    o[k].d = in[k].d;
    for (int g = 0; g < kQK_K / 16; ++g) o[k].bsums[g] = in[k].bsums[g];
    for (int s = 0; s < 8; ++s)
      for (int l = 0; l < 8; ++l)
        for (int c = 0; c < 4; ++c) o[k].qs[32 * s + 4 * l + c] = in[k].qs[32 * s + 8 * c + l];
  }
}

// --- Q4_K / Q5_K · Q8_K (lanes4 rows) -------------------------------------------------------------------
template <typename Block> struct Q45kBits;
template <> struct Q45kBits<BlockQ4K> {
  static constexpr bool kFifthBit = false;
  ESSAIM_HD static const uint8_t* qh(const BlockQ4K&) { return nullptr; }
};
template <> struct Q45kBits<BlockQ5K> {
  static constexpr bool kFifthBit = true;
  ESSAIM_HD static const uint8_t* qh(const BlockQ5K& b) { return b.qh; }
};

// y[j] = dot(w, x + j * x_stride) for j < nx <= kTileRows; x rows are Q8_K in lanes4 order.
template <typename Block>
ESSAIM_HD void dot_q45k_tile(int64_t n, const void* w, const void* x, uint64_t x_stride, int nx, float* y) {
  const auto* a = static_cast<const Block*>(w);
  const auto* xb = static_cast<const uint8_t*>(x);
  float acc[kTileRows];
  for (int j = 0; j < kTileRows; ++j) acc[j] = 0.0f;
  for (int64_t k = 0; k < n / kQK_K; ++k) {
    const Block& blk = a[k];
    uint8_t sc[8], m[8];
    for (int s = 0; s < 8; ++s) scale_min_k4(blk.scales, s, &sc[s], &m[s]);
    int32_t A[kTileRows];
    for (int j = 0; j < kTileRows; ++j) A[j] = 0;
    uint32_t hw[8] = {};  // Q5_K: qh as words, bit s of byte i = fifth bit of element 32s + i
    if constexpr (Q45kBits<Block>::kFifthBit)
      for (int i = 0; i < 8; ++i) hw[i] = load_u32_a2(Q45kBits<Block>::qh(blk) + 4 * i);
    for (int pair = 0; pair < 4; ++pair) {  // sub-blocks 2*pair (low nibbles) and 2*pair + 1 (high)
      uint32_t raw[8];
      for (int i = 0; i < 8; ++i) raw[i] = load_u32_a2(blk.qs + 32 * pair + 4 * i);
      for (int half = 0; half < 2; ++half) {
        const int s = 2 * pair + half;
        uint32_t v[8], lw[8];
        for (int i = 0; i < 8; ++i) {
          v[i] = (raw[i] >> (4 * half)) & 0x0F0F0F0Fu;
          if constexpr (Q45kBits<Block>::kFifthBit) v[i] |= ((hw[i] >> s) & 0x01010101u) << 4;
        }
        to_lanes4(v, lw);
        for (int j = 0; j < kTileRows; ++j) {
          if (j >= nx) break;
          const auto* yb = reinterpret_cast<const BlockQ8K*>(xb + uint64_t(j) * x_stride) + k;
          const uint8_t* ys = reinterpret_cast<const uint8_t*>(yb->qs) + 32 * s;
          int32_t S = 0;  // the sub-block's Σ q·y, |S| <= 32·31·128
          for (int l = 0; l < 8; ++l) S = dp4a_s8(lw[l], load_u32_a2(ys + 4 * l), S);
          A[j] += int32_t(sc[s]) * S;
        }
      }
    }
    for (int j = 0; j < kTileRows; ++j) {
      if (j >= nx) break;
      const auto* yb = reinterpret_cast<const BlockQ8K*>(xb + uint64_t(j) * x_stride) + k;
      int32_t M = 0;
      for (int g = 0; g < 16; ++g) M += int32_t(yb->bsums[g]) * int32_t(m[g / 2]);
      const float db = mul_rn(half_to_f32(blk.d), yb->d);
      const float dmb = mul_rn(half_to_f32(blk.dmin), yb->d);
      acc[j] = fma_rn(db, float(A[j]), acc[j]);
      acc[j] = fma_rn(-dmb, float(M), acc[j]);
    }
  }
  for (int j = 0; j < kTileRows; ++j) {
    if (j >= nx) break;
    y[j] = acc[j];
  }
}

// --- Q6_K · Q8_K (plain rows) ---------------------------------------------------------------------------
ESSAIM_HD void dot_q6k_tile(int64_t n, const void* w, const void* x, uint64_t x_stride, int nx, float* y) {
  const auto* a = static_cast<const BlockQ6K*>(w);
  const auto* xb = static_cast<const uint8_t*>(x);
  float acc[kTileRows];
  for (int j = 0; j < kTileRows; ++j) acc[j] = 0.0f;
  for (int64_t k = 0; k < n / kQK_K; ++k) {
    const BlockQ6K& blk = a[k];
    int32_t A[kTileRows];
    for (int j = 0; j < kTileRows; ++j) A[j] = 0;
    for (int s = 0; s < 16; ++s) {
      int32_t q[16];
      for (int i = 0; i < 16; ++i) q[i] = q6k_value(blk, s, i);
      const int32_t scale = blk.scales[s];
      for (int j = 0; j < kTileRows; ++j) {
        if (j >= nx) break;
        const int8_t* ys = (reinterpret_cast<const BlockQ8K*>(xb + uint64_t(j) * x_stride) + k)->qs + 16 * s;
        int32_t S = 0;
        for (int i = 0; i < 16; ++i) S += q[i] * ys[i];
        A[j] += scale * S;
      }
    }
    for (int j = 0; j < kTileRows; ++j) {
      if (j >= nx) break;
      const auto* yb = reinterpret_cast<const BlockQ8K*>(xb + uint64_t(j) * x_stride) + k;
      acc[j] = fma_rn(mul_rn(half_to_f32(blk.d), yb->d), float(A[j]), acc[j]);
    }
  }
  for (int j = 0; j < kTileRows; ++j) {
    if (j >= nx) break;
    y[j] = acc[j];
  }
}

// --- Q8_0 · Q8_0 ------------------------------------------------------------------------------------------
ESSAIM_HD void dot_q8_0_tile(int64_t n, const void* w, const void* x, uint64_t x_stride, int nx, float* y) {
  const auto* a = static_cast<const BlockQ8_0*>(w);
  const auto* xb = static_cast<const uint8_t*>(x);
  float acc[kTileRows] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t k = 0; k < n / kQK8_0; ++k) {
    uint32_t qw[8];
    const auto* wq = reinterpret_cast<const uint8_t*>(a[k].qs);
    for (int i = 0; i < 8; ++i) qw[i] = load_u32_a2(wq + 4 * i);
    const float dw = half_to_f32(a[k].d);
    for (int j = 0; j < kTileRows; ++j) {
      if (j >= nx) break;
      const BlockQ8_0& b = reinterpret_cast<const BlockQ8_0*>(xb + uint64_t(j) * x_stride)[k];
      const auto* xq = reinterpret_cast<const uint8_t*>(b.qs);
      int32_t sumi = 0;
      for (int i = 0; i < 8; ++i) sumi = dp4a_s8(qw[i], load_u32_a2(xq + 4 * i), sumi);
      acc[j] = fma_rn(float(sumi), mul_rn(dw, half_to_f32(b.d)), acc[j]);
    }
  }
  for (int j = 0; j < kTileRows; ++j) {
    if (j >= nx) break;
    y[j] = acc[j];
  }
}

// --- float formats: the 16-lane reference loop per row (no shared decode to gain) -----------------------
ESSAIM_HD void dot_f32_tile(int64_t n, const void* w, const void* x, uint64_t x_stride, int nx, float* y) {
  for (int j = 0; j < nx; ++j) y[j] = dot_f32(n, w, static_cast<const uint8_t*>(x) + uint64_t(j) * x_stride);
}
ESSAIM_HD void dot_f16_tile(int64_t n, const void* w, const void* x, uint64_t x_stride, int nx, float* y) {
  for (int j = 0; j < nx; ++j) y[j] = dot_f16(n, w, static_cast<const uint8_t*>(x) + uint64_t(j) * x_stride);
}
ESSAIM_HD void dot_bf16_tile(int64_t n, const void* w, const void* x, uint64_t x_stride, int nx, float* y) {
  for (int j = 0; j < nx; ++j) y[j] = dot_bf16(n, w, static_cast<const uint8_t*>(x) + uint64_t(j) * x_stride);
}

}  // namespace essaim::gpu
