// The Q4_K / Q5_K weight arrangement of the AVX-512 kernels (dot_q45k_avx512.cpp) and the AMX tiles
// (matmul_amx.cpp): one definition, so that weights and the prepared activations
// (prepare_q8k_q45k_avx512: group i of sub-block s at bytes 32i + 4s) agree in both. Include only from
// files compiled with the AVX-512 flags; everything is static inline (blocks.h explains why).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "kernels/blocks.h"

namespace essaim {

// Constants of the weight arrangement, built once per call.
struct Q45kIndex {
  __m512i perm[4];   // W_p dword e: qs dword 8·(s/2) + i of [qs 0..63 | qs 64..127], s = e % 8, i = 2p + e/8
  __m512i shift;     // 4·(s % 2): sub-block 2g in the low nibble, 2g + 1 in the high one
  __m512i qh_rot;    // Q5_K: rotate bit s of each byte to bit 4: (4 - s) mod 32
  __m512i halves;    // Q4_K: words (low word of dword s, of dword s + 8) of row a, then of row b
  __m512i nibble;    // Q4_K one row: 0x0F bytes for even s, 0xF0 for odd s
  __m512i even16;    // Q4_K one row: 4 for even s, 0 for odd s
  __m512i a_shift;   // Q4_K one row: 4 in the A half, 0 in the M half
};

static inline Q45kIndex q45k_index() {
  Q45kIndex r;
  alignas(64) int32_t perm[16], shift[16], rot[16], nibble[16], even16[16], a_shift[16];
  alignas(64) int16_t halves[32];
  for (int p = 0; p < 4; ++p) {
    for (int e = 0; e < 16; ++e) perm[e] = 8 * ((e % 8) / 2) + 2 * p + e / 8;
    r.perm[p] = _mm512_load_si512(perm);
  }
  for (int e = 0; e < 16; ++e) {
    shift[e] = 4 * ((e % 8) % 2);
    rot[e] = (4 - e % 8) & 31;
    nibble[e] = e % 2 ? int32_t(0xF0F0F0F0u) : 0x0F0F0F0F;
    even16[e] = e % 2 ? 0 : 4;
    a_shift[e] = e < 8 ? 4 : 0;
  }
  for (int w = 0; w < 32; ++w) halves[w] = int16_t(32 * (w / 16) + 2 * ((w % 16) / 2 + 8 * (w % 2)));
  r.shift = _mm512_load_si512(shift);
  r.qh_rot = _mm512_load_si512(rot);
  r.halves = _mm512_load_si512(halves);
  r.nibble = _mm512_load_si512(nibble);
  r.even16 = _mm512_load_si512(even16);
  r.a_shift = _mm512_load_si512(a_shift);
  return r;
}

// One weight super-block in the q45k_avx512 arrangement (w[p] pairs with activation bytes 64p..64p+63),
// its scales as [sc | sc] dwords and its mins as [m[g/2] (g = 0..15) | the same] words.
struct Q45kWeights {
  __m512i w[4];
  __m512i sc;     // Q4_K: word e: sc[(e % 16) / 2]; Q5_K: dword e: sc[e % 8]
  __m512i mins2;  // word e: m[(e % 16) / 2]
};

// kWords: the scales as vpmaddwd words (Q4_K with several rows, see scaled_pair), else as dwords.
// kTimes16 (Q4_K, dword scales only): the odd sub-blocks' nibbles stay in the high half of their byte
// (16·q <= 240 is still an unsigned byte, one vpsrlvd less per W), so their S come out 16 times larger; the
// even sub-blocks' scales are taken 16 times larger to match and the sum, exactly 16·A
// (|16·A| <= 16·8·63·32·15·128 < 2^31), is shifted back exactly (one_row_group).
template <typename Block, bool kWords, bool kTimes16 = false>
static inline Q45kWeights q45k_arrange(const Block& a, const Q45kIndex& ix) {
  constexpr bool kQ5 = std::is_same_v<Block, BlockQ5K>;
  static_assert(!kTimes16 || (!kQ5 && !kWords));
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  uint64_t sc64, m64;
  q4k_unpack_scales_u64(a.scales, &sc64, &m64);
  Q45kWeights r;
  if constexpr (!kWords) {
    r.sc = _mm512_cvtepu8_epi32(_mm_set1_epi64x(int64_t(sc64)));
    if constexpr (kTimes16) r.sc = _mm512_sllv_epi32(r.sc, ix.even16);
  } else {
    const __m128i s8 = _mm_cvtsi64_si128(int64_t(sc64));
    r.sc = _mm512_cvtepu8_epi16(_mm256_broadcastsi128_si256(_mm_unpacklo_epi8(s8, s8)));
  }
  const __m128i m8 = _mm_cvtsi64_si128(int64_t(m64));
  r.mins2 = _mm512_cvtepu8_epi16(_mm256_broadcastsi128_si256(_mm_unpacklo_epi8(m8, m8)));
  const __m512i q0 = _mm512_loadu_si512(a.qs), q1 = _mm512_loadu_si512(a.qs + 64);
  __m512i qh;
  if constexpr (kQ5) qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.qh)));  // qh dword i in dwords i and 8 + i
#pragma GCC unroll 4
  for (int p = 0; p < 4; ++p) {
    const __m512i g = _mm512_permutex2var_epi32(q0, ix.perm[p], q1);
    if constexpr (kTimes16)
      r.w[p] = _mm512_and_si512(g, ix.nibble);
    else
      r.w[p] = _mm512_and_si512(_mm512_srlv_epi32(g, ix.shift), low4);
    if constexpr (kQ5) {
      // qh dword i holds the fifth bits of elements 4i..4i+3 of every sub-block s at bit s of each byte;
      // perm[p] mod 8 is exactly i and qh fills both halves, so the same index selects it.
      const __m512i h = _mm512_permutexvar_epi32(ix.perm[p], qh);
      r.w[p] = _mm512_ternarylogic_epi32(r.w[p], _mm512_rolv_epi32(h, ix.qh_rot), _mm512_set1_epi8(0x10), 0xF8);
    }
  }
  return r;
}

}  // namespace essaim
