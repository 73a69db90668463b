// AVX2 dot products of the quantised formats against their activation blocks (Q8_0·Q8_0, Q4_K·Q8_K,
// Q5_K·Q8_K, Q6_K·Q8_K), bit-identical to dot_scalar.cpp.
//
// The integer parts are exact, so only their *grouping* has to follow the reference: K-quant lane l owns
// the elements e ≡ l (mod 8) of a super-block (docs/reference.md 2.7). One in-lane byte shuffle (pairs) puts
// elements i and i+8 of every 16 side by side, so maddubs' pair sums never mix lanes; i16 lane i of a
// 128-bit half is then lane i % 8. The weights are shuffled here, the activations once per row by
// prepare_q8k_pairs16_avx2 (docs/kernels.md, "prepared activations"). Two sub-blocks are interleaved with
// unpack{lo,hi}_epi16 so that madd applies both their 6-bit scales while still summing within one lane; a
// ymm of i32 ends up holding lanes 0..3 twice (unpacklo) or 4..7 twice (unpackhi), folded at the end of
// each super-block. The f32 steps are then the reference's, one vector FMA (Q4_K, Q5_K) or multiply + add
// (Q6_K) over the eight lanes. Activation bytes are assumed in [-127, 127], which every quantiser here
// produces (sign_epi8 cannot negate -128).
#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "kernels/blocks.h"
#include "kernels/dot_kernels.h"

namespace essaim {
namespace {

// Output byte 2i = input byte i, 2i+1 = input byte i+8, in each 128-bit half.
__m256i pairs(__m256i v) {
  const __m256i k = _mm256_setr_epi8(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15,  //
                                     0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
  return _mm256_shuffle_epi8(v, k);
}

__m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

int32_t hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// Two i16 scales as the (low, high) halves of one i32, the operand layout of madd.
int32_t scale_pair(int a, int b) {
  return int32_t(uint32_t(uint16_t(int16_t(a))) | (uint32_t(uint16_t(int16_t(b))) << 16));
}

// [S_0 .. S_7]: the full sums of eight partial vectors (eight blocks, or eight rows).
__m256i hsum8_i32(const __m256i v[8]) {
  const __m256i h0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
  const __m256i h4567 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(h0123, h4567, 0x20),
                          _mm256_permute2x128_si256(h0123, h4567, 0x31));
}

// [lanes 0..3 | lanes 0..3] + [lanes 4..7 | lanes 4..7] -> lanes 0..7.
__m256i fold_lane_halves(__m256i a, __m256i b) {
  return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

const BlockQ8K* q8k_row(const void* x, size_t stride, int j) {
  return reinterpret_cast<const BlockQ8K*>(static_cast<const uint8_t*>(x) + size_t(j) * stride);
}

}  // namespace

// The activation side of the pair shuffle, done once per activation row instead of once per weight row.
void prepare_q8k_pairs16_avx2(const void* x, void* out, int64_t n) {
  const auto* in = static_cast<const BlockQ8K*>(x);
  auto* o = static_cast<BlockQ8K*>(out);
  for (int64_t k = 0; k < n / kQK_K; ++k) {
    o[k] = in[k];
    for (int i = 0; i < kQK_K; i += 32)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o[k].qs + i), pairs(load256(in[k].qs + i)));
  }
}

// Q4_K / Q5_K: pairs16, then per 64 bytes (sub-blocks 2p | 2p+1) the two 32-byte halves interleaved by
// 16-bit words, as dot_q45k interleaves the matching weight bytes once per block (docs/kernels.md).
void prepare_q8k_q45k_avx2(const void* x, void* out, int64_t n) {
  const auto* in = static_cast<const BlockQ8K*>(x);
  auto* o = static_cast<BlockQ8K*>(out);
  for (int64_t k = 0; k < n / kQK_K; ++k) {
    o[k] = in[k];
    for (int i = 0; i < kQK_K; i += 64) {
      const __m256i a = pairs(load256(in[k].qs + i)), b = pairs(load256(in[k].qs + i + 32));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o[k].qs + i), _mm256_unpacklo_epi16(a, b));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o[k].qs + i + 32), _mm256_unpackhi_epi16(a, b));
    }
  }
}

namespace {

// ---- Q4_K / Q5_K ---------------------------------------------------------------------------------------

// [M_0 .. M_3] from the first nx of four rows' partial vectors (the others are zero); one row takes the
// cheaper single reduction, which is what decoding runs.
template <int NX>
__m128i hsum4_i32(const __m256i v[4]) {
  if constexpr (NX == 1) return _mm_cvtsi32_si128(hsum_i32(v[0]));
  const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
  return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

template <typename Block, int NX>
void dot_q45k(int64_t n, const void* w, const void* x, size_t x_stride, float* y) {
  constexpr bool kQ5 = std::is_same_v<Block, BlockQ5K>;
  const auto* blocks = static_cast<const Block*>(w);
  const __m256i low4 = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10);
  __m256 lanes[NX];
#pragma GCC unroll 8
  for (int j = 0; j < NX; ++j) lanes[j] = _mm256_setzero_ps();
  __m128 acc = _mm_setzero_ps();  // acc of row j in element j
  for (int64_t k = 0; k < n / kQK_K; ++k) {
    const Block* a = &blocks[k];
    uint64_t sc64, m64;
    q4k_unpack_scales_u64(a->scales, &sc64, &m64);
    // i32 element p of sc16 is the (sc[2p], sc[2p+1]) pair one madd needs.
    const __m256i sc16 = _mm256_castsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(sc64))));
    const __m128i m16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(m64)));
    const __m256i mins = _mm256_setr_m128i(_mm_unpacklo_epi16(m16, m16), _mm_unpackhi_epi16(m16, m16));
    __m256i hb = _mm256_setzero_si256();
    if constexpr (kQ5) hb = pairs(load256(a->qh));

    __m256i lo_lanes[NX], hi_lanes[NX];  // i32: lanes 0..3 twice / lanes 4..7 twice
#pragma GCC unroll 8
    for (int j = 0; j < NX; ++j) lo_lanes[j] = hi_lanes[j] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {  // sub-blocks 2p (low nibbles) and 2p+1 (high nibbles)
      const __m256i raw = pairs(load256(a->qs + 32 * p));
      __m256i q_lo = _mm256_and_si256(raw, low4);
      __m256i q_hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
      if constexpr (kQ5) {  // bit 2p / 2p+1 of qh, brought down to bits 0 / 1 by the running shift
        q_lo = _mm256_or_si256(q_lo, _mm256_and_si256(_mm256_slli_epi16(hb, 4), bit4));
        q_hi = _mm256_or_si256(q_hi, _mm256_and_si256(_mm256_slli_epi16(hb, 3), bit4));
        hb = _mm256_srli_epi16(hb, 2);
      }
      const __m256i scale = _mm256_permutevar8x32_epi32(sc16, _mm256_set1_epi32(p));
      // Weight byte pairs of sub-blocks 2p and 2p+1 interleaved by words once per block, so one maddubs per
      // activation row yields the (2p, 2p+1) word pairs of one lane that madd scales and sums.
      const __m256i w_lo = _mm256_unpacklo_epi16(q_lo, q_hi), w_hi = _mm256_unpackhi_epi16(q_lo, q_hi);
#pragma GCC unroll 8
      for (int j = 0; j < NX; ++j) {
        const int8_t* q8 = q8k_row(x, x_stride, j)[k].qs + 64 * p;  // q45k_avx2 layout
        lo_lanes[j] = _mm256_add_epi32(lo_lanes[j], _mm256_madd_epi16(_mm256_maddubs_epi16(w_lo, load256(q8)), scale));
        hi_lanes[j] =
            _mm256_add_epi32(hi_lanes[j], _mm256_madd_epi16(_mm256_maddubs_epi16(w_hi, load256(q8 + 32)), scale));
      }
    }
    // Min term of all rows at once: M_j in element j, then acc_j = fma(-dmin * d_j, M_j, acc_j).
    __m256i mpart[4] = {};
    alignas(16) float yd_rows[4] = {};
#pragma GCC unroll 8
    for (int j = 0; j < NX; ++j) {
      const BlockQ8K& b = q8k_row(x, x_stride, j)[k];
      mpart[j] = _mm256_madd_epi16(load256(b.bsums), mins);
      yd_rows[j] = b.d;
    }
    const __m128 yd = _mm_load_ps(yd_rows);
    const __m128 M = _mm_cvtepi32_ps(hsum4_i32<NX>(mpart));
    acc = _mm_fnmadd_ps(_mm_mul_ps(_mm_set1_ps(_cvtsh_ss(a->dmin)), yd), M, acc);
    const float d = _cvtsh_ss(a->d);
#pragma GCC unroll 8
    for (int j = 0; j < NX; ++j) {
      const __m256i A = fold_lane_halves(lo_lanes[j], hi_lanes[j]);
      lanes[j] = _mm256_fmadd_ps(_mm256_set1_ps(d * yd_rows[j]), _mm256_cvtepi32_ps(A), lanes[j]);
    }
  }
  alignas(16) float acc_rows[4];
  _mm_store_ps(acc_rows, acc);
#pragma GCC unroll 8
  for (int j = 0; j < NX; ++j) {
    alignas(32) float lane[8];
    _mm256_store_ps(lane, lanes[j]);
    y[j] = fold_lanes8(acc_rows[j], lane);
  }
}

// Five to eight activation rows (prefill, experts with many rows): the weight block is decoded once —
// the four sub-block pairs' interleaved nibble words (eight ymm) and their scales — and each row then runs
// its integer sums, lane fold and f32 step on its own, so only two integer accumulators are live at a
// time. The per-row operations are dot_q45k's, in the same order, so every row gets the reference's bits.
template <typename Block, int NX>
void dot_q45k_wide(int64_t n, const void* w, const void* x, size_t x_stride, float* y) {
  static_assert(NX >= 1 && NX <= 8);
  constexpr bool kQ5 = std::is_same_v<Block, BlockQ5K>;
  const auto* blocks = static_cast<const Block*>(w);
  const __m256i low4 = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10);
  __m256 lanes[NX];
#pragma GCC unroll 8
  for (int j = 0; j < NX; ++j) lanes[j] = _mm256_setzero_ps();
  __m256 acc = _mm256_setzero_ps();  // acc of row j in element j
  for (int64_t k = 0; k < n / kQK_K; ++k) {
    const Block* a = &blocks[k];
    uint64_t sc64, m64;
    q4k_unpack_scales_u64(a->scales, &sc64, &m64);
    const __m256i sc16 = _mm256_castsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(sc64))));
    const __m128i m16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(m64)));
    const __m256i mins = _mm256_setr_m128i(_mm_unpacklo_epi16(m16, m16), _mm_unpackhi_epi16(m16, m16));
    __m256i hb = _mm256_setzero_si256();
    if constexpr (kQ5) hb = pairs(load256(a->qh));
    __m256i w_lo[4], w_hi[4], scale[4];
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {  // as in dot_q45k
      const __m256i raw = pairs(load256(a->qs + 32 * p));
      __m256i q_lo = _mm256_and_si256(raw, low4);
      __m256i q_hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
      if constexpr (kQ5) {
        q_lo = _mm256_or_si256(q_lo, _mm256_and_si256(_mm256_slli_epi16(hb, 4), bit4));
        q_hi = _mm256_or_si256(q_hi, _mm256_and_si256(_mm256_slli_epi16(hb, 3), bit4));
        hb = _mm256_srli_epi16(hb, 2);
      }
      scale[p] = _mm256_permutevar8x32_epi32(sc16, _mm256_set1_epi32(p));
      w_lo[p] = _mm256_unpacklo_epi16(q_lo, q_hi);
      w_hi[p] = _mm256_unpackhi_epi16(q_lo, q_hi);
    }
    // Min term of all rows at once: M_j in element j, then acc_j = fma(-dmin * d_j, M_j, acc_j).
    __m256i mpart[8] = {};
    alignas(32) float yd_rows[8] = {};
#pragma GCC unroll 8
    for (int j = 0; j < NX; ++j) {
      const BlockQ8K& b = q8k_row(x, x_stride, j)[k];
      mpart[j] = _mm256_madd_epi16(load256(b.bsums), mins);
      yd_rows[j] = b.d;
    }
    const __m256 yd = _mm256_load_ps(yd_rows);
    const __m256 M = _mm256_cvtepi32_ps(hsum8_i32(mpart));
    acc = _mm256_fnmadd_ps(_mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(a->dmin)), yd), M, acc);
    const float d = _cvtsh_ss(a->d);
#pragma GCC unroll 8
    for (int j = 0; j < NX; ++j) {
      const int8_t* q8 = q8k_row(x, x_stride, j)[k].qs;  // q45k_avx2 layout
      __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
#pragma GCC unroll 4
      for (int p = 0; p < 4; ++p) {
        lo = _mm256_add_epi32(lo, _mm256_madd_epi16(_mm256_maddubs_epi16(w_lo[p], load256(q8 + 64 * p)), scale[p]));
        hi = _mm256_add_epi32(hi, _mm256_madd_epi16(_mm256_maddubs_epi16(w_hi[p], load256(q8 + 64 * p + 32)), scale[p]));
      }
      const __m256i A = fold_lane_halves(lo, hi);
      lanes[j] = _mm256_fmadd_ps(_mm256_set1_ps(d * yd_rows[j]), _mm256_cvtepi32_ps(A), lanes[j]);
    }
  }
  alignas(32) float acc_rows[8];
  _mm256_store_ps(acc_rows, acc);
#pragma GCC unroll 8
  for (int j = 0; j < NX; ++j) {
    alignas(32) float lane[8];
    _mm256_store_ps(lane, lanes[j]);
    y[j] = fold_lanes8(acc_rows[j], lane);
  }
}

// ---- Q6_K ----------------------------------------------------------------------------------------------

template <int NX>
void dot_q6k(int64_t n, const void* w, const void* x, size_t x_stride, float* y) {
  const auto* blocks = static_cast<const BlockQ6K*>(w);
  const __m256i low4 = _mm256_set1_epi8(0x0F), bias = _mm256_set1_epi8(32);
  __m256 lanes[NX];
#pragma GCC unroll 8
  for (int j = 0; j < NX; ++j) lanes[j] = _mm256_setzero_ps();
  for (int64_t k = 0; k < n / kQK_K; ++k) {
    const BlockQ6K& a = blocks[k];
    __m256i lo_lanes[NX], hi_lanes[NX];
#pragma GCC unroll 8
    for (int j = 0; j < NX; ++j) lo_lanes[j] = hi_lanes[j] = _mm256_setzero_si256();
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {  // elements 128h + 32c + l, c = 0..3
      const __m256i ql0 = pairs(load256(a.ql + 64 * h)), ql1 = pairs(load256(a.ql + 64 * h + 32));
      const __m256i qh = pairs(load256(a.qh + 32 * h));
      // 6-bit values of the four groups: low nibble (c = 0, 1) or high nibble (c = 2, 3) of ql, and bits
      // 2c..2c+1 of qh moved to bits 4..5 (masking first keeps the 16-bit shifts within each byte).
      const __m256i h01 = _mm256_and_si256(qh, _mm256_set1_epi8(0x03));
      const __m256i h23 = _mm256_and_si256(qh, _mm256_set1_epi8(0x0C));
      const __m256i h45 = _mm256_and_si256(qh, _mm256_set1_epi8(0x30));
      const __m256i h67 = _mm256_and_si256(qh, _mm256_set1_epi8(char(0xC0)));
      __m256i g[4];
      g[0] = _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_slli_epi16(h01, 4));
      g[1] = _mm256_or_si256(_mm256_and_si256(ql1, low4), _mm256_slli_epi16(h23, 2));
      g[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4), h45);
      g[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4), _mm256_srli_epi16(h67, 2));
      __m256i sgn[4], mag[4];  // q - 32 and |q - 32|: maddubs wants an unsigned operand
#pragma GCC unroll 8
      for (int c = 0; c < 4; ++c) {
        sgn[c] = _mm256_sub_epi8(g[c], bias);
        mag[c] = _mm256_abs_epi8(sgn[c]);
      }
      // Group c's low half is sub-block 8h+2c, its high half 8h+2c+1; groups c and c+1 share one madd.
      const int8_t* s = a.scales + 8 * h;
      const __m256i scale01 =
          _mm256_setr_m128i(_mm_set1_epi32(scale_pair(s[0], s[2])), _mm_set1_epi32(scale_pair(s[1], s[3])));
      const __m256i scale23 =
          _mm256_setr_m128i(_mm_set1_epi32(scale_pair(s[4], s[6])), _mm_set1_epi32(scale_pair(s[5], s[7])));
#pragma GCC unroll 8
      for (int j = 0; j < NX; ++j) {
        const int8_t* q8 = q8k_row(x, x_stride, j)[k].qs + 128 * h;  // pairs16 layout
        __m256i p[4];
#pragma GCC unroll 8
        for (int c = 0; c < 4; ++c) p[c] = _mm256_maddubs_epi16(mag[c], _mm256_sign_epi8(load256(q8 + 32 * c), sgn[c]));
        const __m256i lo01 = _mm256_madd_epi16(_mm256_unpacklo_epi16(p[0], p[1]), scale01);
        const __m256i hi01 = _mm256_madd_epi16(_mm256_unpackhi_epi16(p[0], p[1]), scale01);
        const __m256i lo23 = _mm256_madd_epi16(_mm256_unpacklo_epi16(p[2], p[3]), scale23);
        const __m256i hi23 = _mm256_madd_epi16(_mm256_unpackhi_epi16(p[2], p[3]), scale23);
        lo_lanes[j] = _mm256_add_epi32(lo_lanes[j], _mm256_add_epi32(lo01, lo23));
        hi_lanes[j] = _mm256_add_epi32(hi_lanes[j], _mm256_add_epi32(hi01, hi23));
      }
    }
    const float d = _cvtsh_ss(a.d);
#pragma GCC unroll 8
    for (int j = 0; j < NX; ++j) {
      const __m256i A = fold_lane_halves(lo_lanes[j], hi_lanes[j]);
      const __m256 dd = _mm256_set1_ps(d * q8k_row(x, x_stride, j)[k].d);
      lanes[j] = _mm256_add_ps(lanes[j], _mm256_mul_ps(dd, _mm256_cvtepi32_ps(A)));
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < NX; ++j) {
    alignas(32) float lane[8];
    _mm256_store_ps(lane, lanes[j]);
    y[j] = fold_lanes8(0.0f, lane);
  }
}

// ---- Q8_0 ----------------------------------------------------------------------------------------------

// Σ w_i·x_i of one 32-block as 8 partial i32 sums: |w| times x carrying w's sign (maddubs is unsigned x signed).
__m256i q8_0_partials(__m256i w_abs, __m256i w, __m256i x) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w_abs, _mm256_sign_epi8(x, w)), _mm256_set1_epi16(1));
}

// The reference is one f32 FMA chain in block order, so only the integer sums and the scale products are
// vectorised, eight blocks at a time; the chain then runs through them one by one. Activations come in
// the q8_0_group8 layout (prepare_q8_0_group8), whose eight scales are one load.
template <int NX>
void dot_q8_0(int64_t n, const void* w, const void* x, size_t x_stride, float* y) {
  const auto* a = static_cast<const BlockQ8_0*>(w);
  const uint8_t* rows[NX];
  float acc[NX];
#pragma GCC unroll 8
  for (int j = 0; j < NX; ++j) {
    rows[j] = static_cast<const uint8_t*>(x) + size_t(j) * x_stride;
    acc[j] = 0.0f;
  }
  const int64_t nb = n / kQK8_0;
  int64_t k = 0;
  for (; k + 8 <= nb; k += 8) {
    __m256i wq[8], wabs[8];
    alignas(16) uint16_t dw16[8];
#pragma GCC unroll 8
    for (int q = 0; q < 8; ++q) {
      wq[q] = load256(a[k + q].qs);
      wabs[q] = _mm256_abs_epi8(wq[q]);
      dw16[q] = a[k + q].d;
    }
    const __m256 dw = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(dw16)));
#pragma GCC unroll 8
    for (int j = 0; j < NX; ++j) {
      const uint8_t* group = rows[j] + size_t(k) * sizeof(BlockQ8_0);  // [8 x f16 d][8 x 32 qs]
      __m256i s[8];
#pragma GCC unroll 8
      for (int q = 0; q < 8; ++q) s[q] = q8_0_partials(wabs[q], wq[q], load256(group + 16 + 32 * q));
      const __m256 dd = _mm256_mul_ps(dw, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(group))));
      alignas(32) float sumf[8], ddf[8];
      _mm256_store_ps(sumf, _mm256_cvtepi32_ps(hsum8_i32(s)));
      _mm256_store_ps(ddf, dd);
#pragma GCC unroll 8
      for (int q = 0; q < 8; ++q) acc[j] = __builtin_fmaf(sumf[q], ddf[q], acc[j]);
    }
  }
  for (; k < nb; ++k) {  // blocks past the last group of eight keep the plain layout
    const __m256i wq = load256(a[k].qs), wabs = _mm256_abs_epi8(wq);
    const float dw = _cvtsh_ss(a[k].d);
#pragma GCC unroll 8
    for (int j = 0; j < NX; ++j) {
      const auto& b = reinterpret_cast<const BlockQ8_0*>(rows[j])[k];
      const int32_t sumi = hsum_i32(q8_0_partials(wabs, wq, load256(b.qs)));
      acc[j] = __builtin_fmaf(float(sumi), dw * _cvtsh_ss(b.d), acc[j]);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < NX; ++j) y[j] = acc[j];
}

// Five to eight rows only (fewer take dot_q45k), so only those forms are instantiated.
template <typename Block>
void dot_q45k_5to8(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  switch (nx) {
    case 5: dot_q45k_wide<Block, 5>(n, w, x, xs, y); break;
    case 6: dot_q45k_wide<Block, 6>(n, w, x, xs, y); break;
    case 7: dot_q45k_wide<Block, 7>(n, w, x, xs, y); break;
    default: dot_q45k_wide<Block, 8>(n, w, x, xs, y); break;
  }
}

}  // namespace

void vec_dot_q8_0_q8_0_avx2(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  ESSAIM_DISPATCH_NX(dot_q8_0)
}
// Up to four rows the register-resident form (all accumulators live); more rows the wide form.
void vec_dot_q4k_q8k_avx2(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  if (nx > 4) return dot_q45k_5to8<BlockQ4K>(n, w, x, xs, nx, y);
  ESSAIM_DISPATCH_NX(dot_q45k, BlockQ4K)
}
void vec_dot_q5k_q8k_avx2(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  if (nx > 4) return dot_q45k_5to8<BlockQ5K>(n, w, x, xs, nx, y);
  ESSAIM_DISPATCH_NX(dot_q45k, BlockQ5K)
}
void vec_dot_q6k_q8k_avx2(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  ESSAIM_DISPATCH_NX8(dot_q6k)
}

}  // namespace essaim
