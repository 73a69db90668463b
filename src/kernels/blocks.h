// Block layouts of the ggml formats essaim computes with, byte-compatible with GGUF (docs/reference.md 2.3, 2.4).
//
//   const BlockQ4K* b = reinterpret_cast<const BlockQ4K*>(row);      // row of ne[0] / 256 blocks
//   uint8_t sc, m;  q4k_scale_min(b->scales, 3, &sc, &m);              // sub-block 3's 6-bit scale and min
//   float d = f16_to_f32(b->d);
//
// Every struct is the exact on-disk layout (static_assert on its size); fields are little-endian like the
// machines we run on. Block pointers must be aligned to the struct's alignment (2 bytes for the f16-scaled
// blocks, 4 for Q8_K); GGUF's 32-byte tensor alignment and whole-block rows guarantee it for file data.
//
// The helpers are `static inline` on purpose: the SIMD kernel files include this header under -mavx2 /
// -mavx512*, and an ordinary inline function would become one weak symbol shared by every file, so the
// linker could hand the baseline code a copy compiled for AVX-512.
#pragma once

#include <cstdint>
#include <cstring>

namespace essaim {

inline constexpr int kQK8_0 = 32;  // elements per Q8_0 block
inline constexpr int kQK_K = 256;  // elements per K-quant super-block

// Q8_0: 32 signed bytes and one f16 scale. Value i = qs[i] * d.
struct BlockQ8_0 {
  uint16_t d;        // f16
  int8_t qs[kQK8_0];
};
static_assert(sizeof(BlockQ8_0) == 34);

// Q4_K: 8 sub-blocks of 32, 6-bit scales and mins packed in 12 bytes. Value = (d*sc)*q - (dmin*m).
struct BlockQ4K {
  uint16_t d;            // f16 super-scale of the sub-block scales
  uint16_t dmin;         // f16 super-scale of the sub-block mins
  uint8_t scales[12];    // packed sc[0..7], m[0..7] (see q4k_scale_min)
  uint8_t qs[kQK_K / 2]; // qs[32j + l]: element 64j + l in the low nibble, 64j + 32 + l in the high nibble
};
static_assert(sizeof(BlockQ4K) == 144);

// Q5_K: Q4_K plus a fifth bit per element: bit j of qh[l] is the high bit of element 32j + l.
struct BlockQ5K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ5K) == 176);

// Q6_K: 16 sub-blocks of 16 with signed 8-bit scales; d comes last. Value = d * scales[e/16] * (q - 32).
struct BlockQ6K {
  uint8_t ql[kQK_K / 2];     // low 4 bits
  uint8_t qh[kQK_K / 4];     // high 2 bits
  int8_t scales[kQK_K / 16];
  uint16_t d;                // f16
};
static_assert(sizeof(BlockQ6K) == 210);

// Q8_K (activations only): f32 scale, 256 signed bytes, and the sums of each group of 16.
struct BlockQ8K {
  float d;
  int8_t qs[kQK_K];
  int16_t bsums[kQK_K / 16];
};
static_assert(sizeof(BlockQ8K) == 292);

// Sub-block j's 6-bit scale and min from the 12 packed bytes of a Q4_K / Q5_K block (docs/reference.md 2.4).
static inline void q4k_scale_min(const uint8_t* s, int j, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = uint8_t((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4));
    *m = uint8_t((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

// All eight scales and mins at once, four bytes per 32-bit operation (the dot kernels unpack every block):
// byte j of *sc / *m is sc[j] / m[j]. Same values as q4k_scale_min; the tests check the two agree.
static inline void q4k_unpack_scales_u64(const uint8_t* s, uint64_t* sc, uint64_t* m) {
  uint32_t u[3];
  std::memcpy(u, s, 12);
  const uint32_t sc_lo = u[0] & 0x3F3F3F3Fu, m_lo = u[1] & 0x3F3F3F3Fu;
  const uint32_t sc_hi = (u[2] & 0x0F0F0F0Fu) | ((u[0] >> 2) & 0x30303030u);  // top 2 bits of S[j-4] -> 4..5
  const uint32_t m_hi = ((u[2] >> 4) & 0x0F0F0F0Fu) | ((u[1] >> 2) & 0x30303030u);
  *sc = uint64_t(sc_lo) | uint64_t(sc_hi) << 32;
  *m = uint64_t(m_lo) | uint64_t(m_hi) << 32;
}

static inline void q4k_unpack_scales(const uint8_t* s, uint8_t sc[8], uint8_t m[8]) {
  uint64_t sc64, m64;
  q4k_unpack_scales_u64(s, &sc64, &m64);
  std::memcpy(sc, &sc64, 8);
  std::memcpy(m, &m64, 8);
}

// Round to nearest, ties to even, by adding 1.5 * 2^23 and reading the mantissa: ggml's nearest_int, whose
// exact behaviour the reference quantisers depend on. Valid for |f| <= 2^22; larger inputs give the same
// (meaningless but deterministic) bits as ggml's, which callers clamp.
static inline int nearest_int(float f) {
  const float v = f + 12582912.0f;
  int32_t i;
  std::memcpy(&i, &v, 4);
  return (i & 0x007FFFFF) - 0x00400000;
}

}  // namespace essaim
