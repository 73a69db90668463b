// AVX2 dot products of the quantised formats against their activation blocks (Q8_0·Q8_0, Q4_K·Q8_K,
// Q5_K·Q8_K, Q6_K·Q8_K), bit-identical to dot_scalar.cpp.
//
// The canonical K-quant orders (docs/kernels.md) fix only the f32 steps — per row and super-block
// acc = fma(db, f32(A), acc), then acc = fma(-dmb, f32(M), acc) (Q6_K: acc = fma(d·y.d, f32(A), acc)) —
// while the integers A and M are exact in any grouping. So the kernels form per-sub-block sums with
// maddubs, scale them with madd into one i32 accumulator per row and super-block, sum all rows' accumulators
// (and min terms) with one horizontal-add tree, and run the f32 steps for all rows of the call at once
// (row j in element j). Q8_0 activation bytes are assumed in [-127, 127] (sign_epi8 cannot negate -128),
// which every quantiser here produces.
#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "kernels/blocks.h"
#include "kernels/kquant_unpack_avx2.h"
#include "kernels/dot_kernels.h"
#include "kernels/dot_q8_0_x86.h"

namespace essaim {
namespace {

using x86::hsum8_i32;
using x86::hsum_i32;
using x86::load256;

const BlockQ8K* q8k_row(const void* x, size_t stride, int j) {
  return reinterpret_cast<const BlockQ8K*>(static_cast<const uint8_t*>(x) + size_t(j) * stride);
}

}  // namespace

// Q6_K: the quantised values as they are, and bsums recomputed from qs: dot_q6k's −32 offset is
// Σ_s sc[s]·bsums[s], so recomputing makes its result the reference's (which reads only qs) for any Q8_K
// bytes, not only quantiser output.
void prepare_q8k_q6k_avx2(const void* x, void* out, int64_t n) {
  const auto* in = static_cast<const BlockQ8K*>(x);
  auto* o = static_cast<BlockQ8K*>(out);
  for (int64_t k = 0; k < n / kQK_K; ++k) {
    o[k] = in[k];
    for (int g = 0; g < kQK_K / 16; ++g) {
      int32_t sum = 0;
      for (int i = 0; i < 16; ++i) sum += in[k].qs[16 * g + i];
      o[k].bsums[g] = int16_t(sum);  // |sum| <= 16·128
    }
  }
}

// Q4_K / Q5_K: per 64 bytes (sub-blocks 2p | 2p+1) the two 32-byte halves interleaved by 16-bit words, as
// dot_q45k interleaves the matching weight bytes once per block (docs/kernels.md), so that one madd applies
// the two sub-blocks' scales.
void prepare_q8k_q45k_avx2(const void* x, void* out, int64_t n) {
  const auto* in = static_cast<const BlockQ8K*>(x);
  auto* o = static_cast<BlockQ8K*>(out);
  for (int64_t k = 0; k < n / kQK_K; ++k) {
    o[k] = in[k];
    for (int i = 0; i < kQK_K; i += 64) {
      const __m256i a = load256(in[k].qs + i), b = load256(in[k].qs + i + 32);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o[k].qs + i), _mm256_unpacklo_epi16(a, b));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o[k].qs + i + 32), _mm256_unpackhi_epi16(a, b));
    }
  }
}

namespace {

// ---- horizontal sums of several rows ---------------------------------------------------------------------

// Four rows' partial vectors p[0..3] -> one vector whose element j (of either 128-bit half) is row j's sum
// over that half. Partial trees of the same rows add element-wise, so a kernel may accumulate them.
__m256i tree4(__m256i p0, __m256i p1, __m256i p2, __m256i p3) {
  return _mm256_hadd_epi32(_mm256_hadd_epi32(p0, p1), _mm256_hadd_epi32(p2, p3));
}
// tree4 of rows 0..3 -> [S_0 .. S_3].
__m128i fold_tree4(__m256i t) { return _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1)); }
// tree4 of rows 0..3 and of rows 4..7 -> [S_0 .. S_7].
__m256i fold_tree8(__m256i t0123, __m256i t4567) {
  return _mm256_add_epi32(_mm256_permute2x128_si256(t0123, t4567, 0x20), _mm256_permute2x128_si256(t0123, t4567, 0x31));
}

// [Σ a, Σ b, Σ a, Σ b] of two partial vectors (one row's A and M).
__m128i hsum2_i32(__m256i a, __m256i b) {
  const __m256i h = _mm256_hadd_epi32(a, b);
  const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
  return _mm_hadd_epi32(s, s);
}

// ---- Q4_K / Q5_K ---------------------------------------------------------------------------------------

// One super-block's weights, decoded: per sub-block pair p the interleaved nibble words w_lo / w_hi of
// sub-blocks 2p and 2p+1 (matching the q45k_avx2 activations), the madd scale pair (sc[2p], sc[2p+1])
// broadcast, and the 16 mins as (m[g/2]) words against bsums.
template <bool kQ5>
struct Q45kDecoder {
  __m256i sc16, mins, hb;
  template <typename Block>
  explicit Q45kDecoder(const Block* a) {
    // Bytes 0..7 the scales, 8..15 the mins, in both 128-bit halves; each widened to words by one shuffle.
    const __m256i sm = _mm256_broadcastsi128_si256(q4k_scales_mins(a->scales));
    // i32 element p of each 128-bit half of sc16 is the (sc[2p], sc[2p+1]) pair one madd needs.
    constexpr char z = char(0x80);  // a zero byte
    sc16 = _mm256_shuffle_epi8(sm, _mm256_setr_epi8(0, z, 1, z, 2, z, 3, z, 4, z, 5, z, 6, z, 7, z,  //
                                                    0, z, 1, z, 2, z, 3, z, 4, z, 5, z, 6, z, 7, z));
    // Word 2s and 2s+1 of mins are m[s] (against bsums 2s and 2s+1).
    mins = _mm256_shuffle_epi8(sm, _mm256_setr_epi8(8, z, 8, z, 9, z, 9, z, 10, z, 10, z, 11, z, 11, z,  //
                                                    12, z, 12, z, 13, z, 13, z, 14, z, 14, z, 15, z, 15, z));
    if constexpr (kQ5) hb = load256(a->qh);
  }
  // The scale pairs decoded elsewhere (dot_q45k_w4 decodes two rows' at once); no mins.
  template <typename Block>
  Q45kDecoder(const Block* a, __m256i sc_pairs) : sc16(sc_pairs), mins(_mm256_setzero_si256()) {
    if constexpr (kQ5) hb = load256(a->qh);
  }
  // Pair p (call in increasing p: Q5_K's high bits are brought down by a running shift).
  template <typename Block>
  void pair(const Block* a, int p, __m256i* w_lo, __m256i* w_hi, __m256i* scale) {
    __m256i q_lo, q_hi;
    q4k_nibbles(a->qs + 32 * p, &q_lo, &q_hi);
    if constexpr (kQ5) {  // bit 2p / 2p+1 of qh, brought down to bits 0 / 1 by the running shift
      const __m256i bit4 = _mm256_set1_epi8(0x10);
      q_lo = _mm256_or_si256(q_lo, _mm256_and_si256(_mm256_slli_epi16(hb, 4), bit4));
      q_hi = _mm256_or_si256(q_hi, _mm256_and_si256(_mm256_slli_epi16(hb, 3), bit4));
      hb = _mm256_srli_epi16(hb, 2);
    }
    // An in-lane dword broadcast (the callers unroll p, so the immediate is known).
    switch (p) {
      case 0: *scale = _mm256_shuffle_epi32(sc16, 0x00); break;
      case 1: *scale = _mm256_shuffle_epi32(sc16, 0x55); break;
      case 2: *scale = _mm256_shuffle_epi32(sc16, 0xAA); break;
      default: *scale = _mm256_shuffle_epi32(sc16, 0xFF); break;
    }
    q45k_interleave(q_lo, q_hi, w_lo, w_hi);
  }
};

// Σ over one sub-block pair of a row: two maddubs (each word two products of one sub-block, |·| ≤ 2·31·128)
// added as words — even words are sub-block 2p, odd words 2p+1 in both halves, and the sum stays within
// ±15 872 — then one madd by (sc[2p], sc[2p+1]): 8 i32 partials of sc[2p]·S_2p + sc[2p+1]·S_2p+1.
__m256i q45k_pair_sum(__m256i w_lo, __m256i w_hi, __m256i scale, const int8_t* q8) {
  const __m256i p16 = _mm256_add_epi16(_mm256_maddubs_epi16(w_lo, load256(q8)), _mm256_maddubs_epi16(w_hi, load256(q8 + 32)));
  return _mm256_madd_epi16(p16, scale);
}

// Up to four rows: the weight pairs are decoded one at a time and every row's accumulator stays live.
template <typename Block, int NX>
void dot_q45k(int64_t n, const void* w, const void* x, size_t x_stride, float* y) {
  static_assert(NX >= 1 && NX <= 4);
  constexpr bool kQ5 = std::is_same_v<Block, BlockQ5K>;
  const auto* blocks = static_cast<const Block*>(w);
  __m128 acc = _mm_setzero_ps();  // row j in element j (NX > 1)
  float acc1 = 0.0f;              // NX == 1
  // The previous super-block's integer sums and factors, and its f32 steps: NX == 1 acc1 = fma(d·y.d, A,
  // acc1), acc1 = fma(-(dmin·y.d), M, acc1); else the same in the lanes of acc.
  __m256i pend_A = _mm256_setzero_si256(), pend_M = _mm256_setzero_si256(), pend_am = _mm256_setzero_si256();
  float pend_dy = 0.0f, pend_my = 0.0f;
  __m128 pend_dyv = _mm_setzero_ps(), pend_myv = _mm_setzero_ps();
  auto steps = [&] {
    if constexpr (NX == 1) {
      const __m128 am = _mm_cvtepi32_ps(hsum2_i32(pend_A, pend_M));  // [A, M, A, M]
      acc1 = __builtin_fmaf(pend_dy, _mm_cvtss_f32(am), acc1);
      acc1 = __builtin_fmaf(pend_my, _mm_cvtss_f32(_mm_movehdup_ps(am)), acc1);
    } else {
      const __m256 f = _mm256_cvtepi32_ps(pend_am);
      acc = _mm_fmadd_ps(pend_dyv, _mm256_castps256_ps128(f), acc);
      acc = _mm_fnmadd_ps(pend_myv, _mm256_extractf128_ps(f, 1), acc);
    }
  };
  const int64_t ahead = NX == 1 ? g_weight_prefetch_bytes.load(std::memory_order_relaxed) : 0;
  for (int64_t k = 0; k < n / kQK_K; ++k) {
    const Block* a = &blocks[k];
    if (NX == 1 && ahead > 0) prefetch_weights_ahead(a, sizeof(Block), ahead);
    Q45kDecoder<kQ5> dec(a);
    __m256i A[4] = {};
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {
      __m256i w_lo, w_hi, scale;
      dec.pair(a, p, &w_lo, &w_hi, &scale);
#pragma GCC unroll 4
      for (int j = 0; j < NX; ++j)
        A[j] = _mm256_add_epi32(A[j], q45k_pair_sum(w_lo, w_hi, scale, q8k_row(x, x_stride, j)[k].qs + 64 * p));
    }
    __m256i M[4] = {};
    alignas(16) float yd_rows[4] = {};
#pragma GCC unroll 4
    for (int j = 0; j < NX; ++j) {
      const BlockQ8K& b = q8k_row(x, x_stride, j)[k];
      M[j] = _mm256_madd_epi16(load256(b.bsums), dec.mins);
      yd_rows[j] = b.d;
    }
    const float d = _cvtsh_ss(a->d), dmin = _cvtsh_ss(a->dmin);
    // The previous super-block's f32 steps first (the same order), then this block's are kept for the
    // next round, so the horizontal sums' latency overlaps the next block's work.
    if (k > 0) steps();
    if constexpr (NX == 1) {
      pend_A = A[0];
      pend_M = M[0];
      pend_dy = d * yd_rows[0];
      pend_my = -(dmin * yd_rows[0]);
    } else {
      // One tree for the A and M of all rows: elements 0..3 of the fold are A_j, 4..7 M_j.
      pend_am = fold_tree8(tree4(A[0], A[1], A[2], A[3]), tree4(M[0], M[1], M[2], M[3]));
      const __m128 yd = _mm_load_ps(yd_rows);
      pend_dyv = _mm_mul_ps(_mm_set1_ps(d), yd);
      pend_myv = _mm_mul_ps(_mm_set1_ps(dmin), yd);
    }
  }
  if (n >= kQK_K) steps();
  if constexpr (NX == 1) {
    y[0] = acc1;
  } else {
    alignas(16) float out[4];
    _mm_store_ps(out, acc);
#pragma GCC unroll 4
    for (int j = 0; j < NX; ++j) y[j] = out[j];
  }
}

// The four-weight-row decode kernel's hints at super-block k. The four rows are one stream of
// 4·sizeof(Block) bytes per super-block (they are adjacent, and matmul asks for the next four next): the
// hints sweep it at that pace, twice the one-row distance ahead into L1 and eight times into L2 (qwen3moe
// tg64 on the AMD EPYC, Zen 3: 3 KB / 12 KB at the default 1536 measured 0.74-0.77 of the read bandwidth,
// 6 KB / 24 KB no better than the one-row kernel, hints that jump to the same row of the next four 0.48).
// always_inline: as an ordinary inline function GCC 12 found it free of side effects (prefetches do not
// count) and dropped its calls; the hints vanished and the decode ran at 0.45 of the read bandwidth.
template <typename Block>
__attribute__((always_inline)) inline void hint_four_rows(const uint8_t* w, int64_t k, int64_t ahead) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(w) + uintptr_t(k) * 4 * sizeof(Block);
  const uintptr_t near = at + 2 * uintptr_t(ahead), far = at + 8 * uintptr_t(ahead);
#pragma GCC unroll 16
  for (uintptr_t o = 0; o < 4 * sizeof(Block); o += 64) {
    __builtin_prefetch(reinterpret_cast<const void*>(near + o), 0, 3);
    __builtin_prefetch(reinterpret_cast<const void*>(far + o), 0, 2);
  }
}

// dot_q45k_w4's M for a block whose bsums pair sums do not fit a word: each row's as the one-row form forms
// it (madd of the bsums by the mins doubled), its lanes added, rows q and q + 2 in the lanes of M2[q].
template <typename Block>
__attribute__((noinline)) void q45k_w4_foreign_M(const Block* const a[4], __m256i bsums, __m256i M2[2]) {
  constexpr bool kQ5 = std::is_same_v<Block, BlockQ5K>;
  auto folded = [&](const Block* row) {
    const __m256i m = _mm256_madd_epi16(bsums, Q45kDecoder<kQ5>(row).mins);
    return _mm_add_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
  };
  for (int q = 0; q < 2; ++q) M2[q] = _mm256_setr_m128i(folded(a[q]), folded(a[q + 2]));
}

// Four weight rows against one activation row (decode): each row's super-block gives the integer A and M
// of dot_q45k<Block, 1>, the four rows share one horizontal-add tree, and the f32 steps run in the four
// lanes of one vector — lane r row r's chain acc = fma(d·y.d, A, acc), acc = fma(-(dmin·y.d), M, acc),
// super-block by super-block — so each result has the one-row kernel's bits.
// The scales and mins of rows r and r + 2 are decoded in one register (a lane each), and M is formed for
// the two rows by one madd: m[s] against the sub-block sums B[s] = bsums[2s] + bsums[2s+1] of the
// activation as words, formed once per super-block for the four rows. |B| <= 32·128 for every row a
// quantiser writes; a block whose B does not fit a word (foreign bsums, which the reference reads as given)
// takes each row's M as the one-row form does, madd of the bsums by the mins doubled. Only the integer
// grouping differs from the one-row form, so the results do not.
template <typename Block>
void dot_q45k_w4(int64_t n, const uint8_t* w, size_t w_stride, const BlockQ8K* x, float* y) {
  constexpr bool kQ5 = std::is_same_v<Block, BlockQ5K>;
  static_assert(offsetof(Block, d) == 0 && offsetof(Block, dmin) == 2);
  const int64_t ahead = g_weight_prefetch_bytes.load(std::memory_order_relaxed);
  constexpr char z = char(0x80);  // a zero byte
  // Per lane: i32 element p the (sc[2p], sc[2p+1]) words one madd needs; the mins as words m[0..7].
  const __m256i sc_pattern = _mm256_setr_epi8(0, z, 1, z, 2, z, 3, z, 4, z, 5, z, 6, z, 7, z,  //
                                              0, z, 1, z, 2, z, 3, z, 4, z, 5, z, 6, z, 7, z);
  const __m256i min_pattern = _mm256_setr_epi8(8, z, 9, z, 10, z, 11, z, 12, z, 13, z, 14, z, 15, z,  //
                                               8, z, 9, z, 10, z, 11, z, 12, z, 13, z, 14, z, 15, z);
  // One row's integer A of super-block k (the four pairs' sums, 8 partials).
  auto row_A = [&](const Block* a, const BlockQ8K& b, __m256i sc_pairs) {
    Q45kDecoder<kQ5> dec(a, sc_pairs);
    __m256i sum = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {
      __m256i w_lo, w_hi, scale;
      dec.pair(a, p, &w_lo, &w_hi, &scale);
      sum = _mm256_add_epi32(sum, q45k_pair_sum(w_lo, w_hi, scale, b.qs + 64 * p));
    }
    return sum;
  };
  __m128 acc = _mm_setzero_ps();  // lane r: weight row r
  __m256 pend_f = _mm256_setzero_ps(), pend_dy = _mm256_setzero_ps();  // the previous super-block's A, M and factors
  auto steps = [&] {
    acc = _mm_fmadd_ps(_mm256_castps256_ps128(pend_dy), _mm256_castps256_ps128(pend_f), acc);
    acc = _mm_fnmadd_ps(_mm256_extractf128_ps(pend_dy, 1), _mm256_extractf128_ps(pend_f, 1), acc);
  };
  for (int64_t k = 0; k < n / kQK_K; ++k) {
    const BlockQ8K& b = x[k];
    if (ahead > 0) hint_four_rows<Block>(w, k, ahead);
    const Block* a[4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) a[r] = reinterpret_cast<const Block*>(w + size_t(r) * w_stride) + k;
    // The sub-block sums B of the activation, and as words in both lanes: [B0 .. B7 | B0 .. B7].
    const __m256i bsums = load256(b.bsums);
    const __m256i B = _mm256_madd_epi16(bsums, _mm256_set1_epi16(1));  // [B0..B3 | B4..B7]
    const __m256i B_words = _mm256_permute4x64_epi64(_mm256_packs_epi32(B, B), 0x88);
    // Every B in [-2^15, 2^15): B + 2^15 has no bit above the low 16.
    const bool B_fit = _mm256_testz_si256(_mm256_add_epi32(B, _mm256_set1_epi32(0x8000)), _mm256_set1_epi32(int32_t(0xFFFF0000u)));
    __m256i sm[2];  // the scales and mins of rows q | q + 2
#pragma GCC unroll 2
    for (int q = 0; q < 2; ++q) sm[q] = q4k_scales_mins2(a[q]->scales, a[q + 2]->scales);
    __m256i M2[2];  // lane 0 row q's M partials, lane 1 row q + 2's
    if (B_fit) [[likely]] {
#pragma GCC unroll 2
      for (int q = 0; q < 2; ++q) M2[q] = _mm256_madd_epi16(_mm256_shuffle_epi8(sm[q], min_pattern), B_words);
    } else {
      q45k_w4_foreign_M<Block>(a, bsums, M2);
    }
    __m256i A[4];
#pragma GCC unroll 2
    for (int q = 0; q < 2; ++q) {
      const __m256i sc = _mm256_shuffle_epi8(sm[q], sc_pattern);
      A[q] = row_A(a[q], b, _mm256_permute4x64_epi64(sc, 0x44));
      A[q + 2] = row_A(a[q + 2], b, _mm256_permute4x64_epi64(sc, 0xEE));
    }
    // The f32 steps of the previous super-block (kept in order: it comes before this one's), then this
    // one's trees and factors for the next round, so the trees' latency overlaps the next block's work.
    if (k > 0) steps();
    // [A_0 .. A_3]: the usual tree; [M_0 .. M_3]: hadd of (rows 0 | 2, rows 1 | 3) twice gives
    // lane 0 [M_0, M_1, ·, ·] and lane 1 [M_2, M_3, ·, ·].
    const __m128i a4 = fold_tree4(tree4(A[0], A[1], A[2], A[3]));
    const __m256i hm = _mm256_hadd_epi32(M2[0], M2[1]);
    const __m128i m4 = _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_hadd_epi32(hm, hm), 0x08));
    pend_f = _mm256_cvtepi32_ps(_mm256_setr_m128i(a4, m4));
    // Each block starts with d, dmin (f16): the four dwords, words reordered to d0..d3, dmin0..dmin3.
    int32_t ddm[4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) std::memcpy(&ddm[r], a[r], 4);
    const __m128i halves = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ddm)),
                                            _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15));
    // [d·y.d of rows 0..3, dmin·y.d of rows 0..3]
    pend_dy = _mm256_mul_ps(_mm256_cvtph_ps(halves), _mm256_set1_ps(b.d));
  }
  if (n >= kQK_K) steps();
  _mm_storeu_ps(y, acc);
}

// Five to eight activation rows (prefill, experts with many rows): the weight block is decoded once —
// the four sub-block pairs' interleaved nibble words (eight ymm) and their scales — and then each row runs
// its integer sums on its own and enters the horizontal-add tree of its group of four at once, so only a
// few accumulators are live; the f32 steps run for all rows in one ymm.
template <typename Block, int NX>
void dot_q45k_wide(int64_t n, const void* w, const void* x, size_t x_stride, float* y) {
  static_assert(NX >= 5 && NX <= 8);
  constexpr bool kQ5 = std::is_same_v<Block, BlockQ5K>;
  const auto* blocks = static_cast<const Block*>(w);
  __m256 acc = _mm256_setzero_ps();  // row j in element j
  for (int64_t k = 0; k < n / kQK_K; ++k) {
    const Block* a = &blocks[k];
    Q45kDecoder<kQ5> dec(a);
    __m256i w_lo[4], w_hi[4], scale[4];
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) dec.pair(a, p, &w_lo[p], &w_hi[p], &scale[p]);
    __m256i A[8] = {}, M[8] = {};
    alignas(32) float yd_rows[8] = {};
#pragma GCC unroll 8
    for (int j = 0; j < NX; ++j) {
      const BlockQ8K& b = q8k_row(x, x_stride, j)[k];
      const int8_t* q8 = b.qs;  // q45k_avx2 layout
      __m256i s = q45k_pair_sum(w_lo[0], w_hi[0], scale[0], q8);
#pragma GCC unroll 3
      for (int p = 1; p < 4; ++p) s = _mm256_add_epi32(s, q45k_pair_sum(w_lo[p], w_hi[p], scale[p], q8 + 64 * p));
      A[j] = s;
      M[j] = _mm256_madd_epi16(load256(b.bsums), dec.mins);
      yd_rows[j] = b.d;
    }
    const __m256 fa = _mm256_cvtepi32_ps(fold_tree8(tree4(A[0], A[1], A[2], A[3]), tree4(A[4], A[5], A[6], A[7])));
    const __m256 fm = _mm256_cvtepi32_ps(fold_tree8(tree4(M[0], M[1], M[2], M[3]), tree4(M[4], M[5], M[6], M[7])));
    const __m256 yd = _mm256_load_ps(yd_rows);
    acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(a->d)), yd), fa, acc);
    acc = _mm256_fnmadd_ps(_mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(a->dmin)), yd), fm, acc);
  }
  alignas(32) float out[8];
  _mm256_store_ps(out, acc);
#pragma GCC unroll 8
  for (int j = 0; j < NX; ++j) y[j] = out[j];
}

// ---- Q6_K ----------------------------------------------------------------------------------------------

// A = Σ_s sc[s]·Σ (q − 32)·x = Σ_s sc[s]·Σ q·x − 32·Σ_s sc[s]·bsums[s] (a Q6_K sub-block is one bsums
// group of 16): maddubs takes the unsigned 6-bit q (0..63, pair sums ≤ 2·63·128, no saturation) against
// the signed activations directly, and the offset is one madd of bsums (recomputed from qs by the q6k_avx2
// prepare, so this holds for any Q8_K bytes) by the scales per row. Per row and super-block: 8 maddubs +
// 8 madd + 1 madd for the offset; per 128-element half the rows' sums enter the horizontal-add trees of
// their groups of four (hadd is linear, so the halves' trees add up), then one f32 step for all rows.
// Kept whole: one super-block loop whose NX accumulators must stay in registers across its steps (the other
// dot_* kernels of this file have the same shape, shorter).
template <int NX>
void dot_q6k(int64_t n, const void* w, const void* x, size_t x_stride, float* y) {
  static_assert(NX >= 1 && NX <= 8);
  constexpr int kGroups = (NX + 3) / 4;
  const auto* blocks = static_cast<const BlockQ6K*>(w);
  __m256 acc8 = _mm256_setzero_ps();  // row j in element j
  __m128 acc4 = _mm_setzero_ps();
  float acc1 = 0.0f;
  // The previous super-block's integer sums (NX == 1: A; else the trees) and d·y.d per row, and its step.
  __m256i pend_A = _mm256_setzero_si256(), pend_T0 = _mm256_setzero_si256(), pend_T1 = _mm256_setzero_si256();
  float pend_dy = 0.0f;
  __m256 pend_dy8 = _mm256_setzero_ps();
  auto steps = [&] {
    if constexpr (NX == 1) {
      acc1 = __builtin_fmaf(pend_dy, float(hsum_i32(pend_A)), acc1);
    } else if constexpr (kGroups == 1) {
      const __m128 fa = _mm_cvtepi32_ps(fold_tree4(pend_T0));
      acc4 = _mm_fmadd_ps(_mm256_castps256_ps128(pend_dy8), fa, acc4);
    } else {
      const __m256 fa = _mm256_cvtepi32_ps(fold_tree8(pend_T0, pend_T1));
      acc8 = _mm256_fmadd_ps(pend_dy8, fa, acc8);
    }
  };
  const int64_t ahead = NX == 1 ? g_weight_prefetch_bytes.load(std::memory_order_relaxed) : 0;
  for (int64_t k = 0; k < n / kQK_K; ++k) {
    const BlockQ6K& a = blocks[k];
    if (NX == 1 && ahead > 0) prefetch_weights_ahead(&a, sizeof(BlockQ6K), ahead);
    const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a.scales));
    const __m256i sc_all = _mm256_cvtepi8_epi16(sc8);  // the 16 scales as words, against bsums
    __m256i T[2] = {};  // tree4 partials of rows 0..3 and 4..7
    __m256i A1 = _mm256_setzero_si256();
    alignas(32) float yd_rows[8] = {};
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {  // elements 128h + 32c + i, c = 0..3
      __m256i g[4];  // the 6-bit values of the four groups of 32
      q6k_half_values(a.ql, a.qh, h, g);
      // Group c's low half is sub-block 8h+2c, its high half 8h+2c+1: their scale words, from the eight
      // scales of this half (words, in both 128-bit halves).
      const __m256i sc_h = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(h == 0 ? sc8 : _mm_unpackhi_epi64(sc8, sc8)));
      // Dword c of the low lane sc[2c] in both words, of the high lane sc[2c+1] (one byte shuffle), then each
      // group's vector an in-lane dword broadcast: one constant register instead of one per group.
      const __m256i pairs = _mm256_shuffle_epi8(sc_h, _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13,  //
                                                                       2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15));
      const __m256i scale[4] = {_mm256_shuffle_epi32(pairs, 0x00), _mm256_shuffle_epi32(pairs, 0x55),
                                _mm256_shuffle_epi32(pairs, 0xAA), _mm256_shuffle_epi32(pairs, 0xFF)};
      // Each row's sums enter the first level of its group's tree as soon as its pair of rows is done
      // (hadd of rows 2i, 2i+1), so at most two rows' sums are live, not eight.
      const __m256i z = _mm256_setzero_si256();
      __m256i H[4], S_even = z;
#pragma GCC unroll 8
      for (int j = 0; j < NX; ++j) {
        const BlockQ8K& b = q8k_row(x, x_stride, j)[k];
        const int8_t* q8 = b.qs + 128 * h;
        __m256i s01 = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(g[0], load256(q8)), scale[0]),
                                       _mm256_madd_epi16(_mm256_maddubs_epi16(g[1], load256(q8 + 32)), scale[1]));
        const __m256i s23 = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(g[2], load256(q8 + 64)), scale[2]),
                                             _mm256_madd_epi16(_mm256_maddubs_epi16(g[3], load256(q8 + 96)), scale[3]));
        if (h == 0) {  // the −32 offset of all 16 sub-blocks: 32·Σ_s sc[s]·bsums[s]
          yd_rows[j] = b.d;
          s01 = _mm256_sub_epi32(s01, _mm256_slli_epi32(_mm256_madd_epi16(load256(b.bsums), sc_all), 5));
        }
        const __m256i S = _mm256_add_epi32(s01, s23);
        if constexpr (NX == 1) {
          A1 = _mm256_add_epi32(A1, S);
        } else if (j % 2 == 0) {
          S_even = S;
          if (j + 1 == NX) H[j / 2] = _mm256_hadd_epi32(S, z);
        } else {
          H[j / 2] = _mm256_hadd_epi32(S_even, S);
        }
      }
      if constexpr (NX > 1) {
        // hadd is linear: the trees of the two halves h add up to the tree of the whole super-block, and a
        // missing row's zeros are tree4's.
        constexpr int kPairs = (NX + 1) / 2;
#pragma GCC unroll 2
        for (int q = 0; q < kGroups; ++q)
          T[q] = _mm256_add_epi32(T[q], _mm256_hadd_epi32(H[2 * q], 2 * q + 1 < kPairs ? H[2 * q + 1] : z));
      }
    }
    const float d = _cvtsh_ss(a.d);
    // The previous super-block's step first (the same order), then this block's sums and factors are kept
    // for the next round, so the horizontal sums' latency overlaps the next block's work. (At k = 0 the
    // step adds fma(0, 0, +0) = +0 to +0: no branch, the same bits.)
    steps();
    if constexpr (NX == 1) {
      pend_A = A1;
      pend_dy = d * yd_rows[0];
    } else {
      pend_T0 = T[0];
      pend_T1 = T[1];
      pend_dy8 = _mm256_mul_ps(_mm256_set1_ps(d), _mm256_load_ps(yd_rows));
    }
  }
  if (n >= kQK_K) steps();
  alignas(32) float out[8];
  if constexpr (NX == 1) out[0] = acc1;
  else if constexpr (kGroups == 1) _mm_store_ps(out, acc4);
  else _mm256_store_ps(out, acc8);
#pragma GCC unroll 8
  for (int j = 0; j < NX; ++j) y[j] = out[j];
}

// ---- Q8_0 ----------------------------------------------------------------------------------------------

// Σ w_i·x_i of one 32-block as 8 partial i32 sums: |w| times x carrying w's sign (maddubs is unsigned x signed).
struct Q8_0PartialsMaddubs {
  static __m256i of(__m256i w_abs, __m256i w, __m256i x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w_abs, _mm256_sign_epi8(x, w)), _mm256_set1_epi16(1));
  }
};

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
  using x86::dot_q8_0;
  ESSAIM_DISPATCH_NX(dot_q8_0, Q8_0PartialsMaddubs)
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
void dot_q4k_w4_avx2(int64_t n, const void* w, size_t w_stride, const void* x, float* y) {
  dot_q45k_w4<BlockQ4K>(n, static_cast<const uint8_t*>(w), w_stride, static_cast<const BlockQ8K*>(x), y);
}
void dot_q5k_w4_avx2(int64_t n, const void* w, size_t w_stride, const void* x, float* y) {
  dot_q45k_w4<BlockQ5K>(n, static_cast<const uint8_t*>(w), w_stride, static_cast<const BlockQ8K*>(x), y);
}
void vec_dot_q6k_q8k_avx2(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  ESSAIM_DISPATCH_NX8(dot_q6k)
}

}  // namespace essaim
