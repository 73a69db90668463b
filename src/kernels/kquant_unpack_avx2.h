// The bit assembly of the AVX2 K-quant layouts, shared by the files compiled for AVX2 only (dot_quant_avx2.cpp,
// matmul_lanes_avx2.cpp), so the dot kernels and the lanes decode weights the same way.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace essaim {

// Q4_K / Q5_K: the eight 6-bit scales (bytes 0..7) and the eight 6-bit mins (bytes 8..15) of a super-block
// from its 12 packed bytes (docs/reference.md 2.5; what q4k_unpack_scales_u64 computes in scalar code):
// with u0, u1, u2 the three little-endian dwords, scales 0..3 = u0 & 0x3F, mins 0..3 = u1 & 0x3F,
// scales 4..7 = (u2 & 0x0F) | ((u0 >> 2) & 0x30), mins 4..7 = ((u2 >> 4) & 0x0F) | ((u1 >> 2) & 0x30),
// bytewise. Reads 16 bytes from scales12 (the last four belong to the block's next field).
static inline __m128i q4k_scales_mins(const uint8_t* scales12) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales12));  // [u0 u1 u2 -]
  const __m128i low = _mm_and_si128(v, _mm_set1_epi8(0x3F));                     // [sc 0..3, m 0..3]
  // [u2, u2 >> 4] & 0x0F | [u0 >> 2, u1 >> 2] & 0x30 (bits 4..5 of each byte): [sc 4..7, m 4..7]
  const __m128i u22 = _mm_srlv_epi32(_mm_shuffle_epi32(v, 0xAA), _mm_setr_epi32(0, 4, 0, 0));
  const __m128i high = _mm_or_si128(_mm_and_si128(u22, _mm_set1_epi8(0x0F)),
                                    _mm_and_si128(_mm_srli_epi32(v, 2), _mm_set1_epi8(0x30)));
  return _mm_unpacklo_epi32(low, high);  // [sc 0..3, sc 4..7, m 0..3, m 4..7]
}

// q4k_scales_mins of two super-blocks at once: lane 0 [sc 0..7, m 0..7] of the block at a12, lane 1 of b12.
static inline __m256i q4k_scales_mins2(const uint8_t* a12, const uint8_t* b12) {
  const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a12))),
                                            _mm_loadu_si128(reinterpret_cast<const __m128i*>(b12)), 1);
  const __m256i low = _mm256_and_si256(v, _mm256_set1_epi8(0x3F));
  const __m256i u22 = _mm256_srlv_epi32(_mm256_shuffle_epi32(v, 0xAA), _mm256_setr_epi32(0, 4, 0, 0, 0, 4, 0, 0));
  const __m256i high = _mm256_or_si256(_mm256_and_si256(u22, _mm256_set1_epi8(0x0F)),
                                       _mm256_and_si256(_mm256_srli_epi32(v, 2), _mm256_set1_epi8(0x30)));
  return _mm256_unpacklo_epi32(low, high);
}

// Q4_K / Q5_K: the low and high nibbles of 32 bytes of qs (sub-blocks 2p and 2p+1 of pair p), as bytes.
static inline void q4k_nibbles(const uint8_t* qs32, __m256i* lo, __m256i* hi) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs32));
  asm("" : "+x"(raw));  // one load, not one per use (as in q6k_half_values)
  *lo = _mm256_and_si256(raw, low4);
  *hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
}

// The prepared Q4_K / Q5_K order of a pair (prepare_q8k_q45k_avx2): the two sub-blocks' values interleaved
// by 16-bit words, so a dword's low word is sub-block 2p's and its high word 2p+1's.
static inline void q45k_interleave(__m256i lo, __m256i hi, __m256i* w_lo, __m256i* w_hi) {
  *w_lo = _mm256_unpacklo_epi16(lo, hi);
  *w_hi = _mm256_unpackhi_epi16(lo, hi);
}

// Q6_K half h (elements 128h .. 128h + 127) as its unsigned 6-bit values (0..63, the reference's q + 32) in
// element order: g[c] holds elements 128h + 32c + i, the low nibble (c = 0, 1) or high nibble (c = 2, 3)
// of ql[64h + 32(c % 2) + i] with bits 2c..2c+1 of qh[32h + i] above them. The qh bits are shifted to bits
// 4..5 of their byte and then masked (a 16-bit shift moves other bits across the byte boundary only into
// bits the mask drops), so two constants serve all four groups. Each 16-byte half of g[c] is one sub-block
// of 16: 8h + 2c, then 8h + 2c + 1.
static inline void q6k_half_values(const uint8_t* ql, const uint8_t* qh, int h, __m256i g[4]) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), bits45 = _mm256_set1_epi8(0x30);
  auto load = [](const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); };
  __m256i ql0 = load(ql + 64 * h), ql1 = load(ql + 64 * h + 32), bits = load(qh + 32 * h);
  // Each loaded once: without this GCC 12 folds every use into its own memory operand (eight loads instead
  // of three per half), and the one-row Q6_K kernel ran 5 % slower, bound by its loads.
  asm("" : "+x"(ql0), "+x"(ql1), "+x"(bits));
  g[0] = _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_and_si256(_mm256_slli_epi16(bits, 4), bits45));
  g[1] = _mm256_or_si256(_mm256_and_si256(ql1, low4), _mm256_and_si256(_mm256_slli_epi16(bits, 2), bits45));
  g[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4), _mm256_and_si256(bits, bits45));
  g[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                         _mm256_and_si256(_mm256_srli_epi16(bits, 2), bits45));
}

}  // namespace essaim
