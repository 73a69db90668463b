// AVX-512 (F, BW, VL, VNNI) dot products of the quantised formats, bit-identical to dot_scalar.cpp.
//
// Same lane bookkeeping as dot_quant_avx2.cpp at twice the width. After the in-lane pair shuffle each
// 128-bit quarter holds lanes 0..7 of one 16-element run and maddubs forms same-lane pair sums. The weight
// words of two sub-blocks are interleaved and their 128-bit quarters regrouped once per super-block, and
// the activations arrive arranged the same way (prepare_q8k_q45k_avx512, prepare_q8k_q6k_avx512), so
// VNNI's vpdpwssd applies both sub-blocks' scales and accumulates into one i32 register per row whose
// element e is always lane e % 8. A weight block is decoded once for up to eight activation rows, which
// then run two at a time; two rows' lanes share one zmm for the f32 steps, and each row's values go
// through exactly the reference's operations.
// vpdpbusd would sum four neighbouring bytes, i.e. two different canonical lanes after any in-lane
// shuffle, so it serves only Q8_0 here, whose reference sums a whole block at once.
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/blocks.h"
#include "kernels/dot_kernels.h"

namespace essaim {
namespace {

__m512i pairs(__m512i v) {
  const __m512i k = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15));
  return _mm512_shuffle_epi8(v, k);
}

__m256i pairs256(__m256i v) {
  const __m256i k = _mm256_setr_epi8(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15,  //
                                     0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
  return _mm256_shuffle_epi8(v, k);
}

__m512i load512(const void* p) { return _mm512_loadu_si512(p); }
__m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

int32_t hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// [S_0 .. S_7]: the full sums of eight partial vectors (eight blocks, or eight rows).
__m256i hsum8_i32(const __m256i v[8]) {
  const __m256i h0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
  const __m256i h4567 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(h0123, h4567, 0x20),
                          _mm256_permute2x128_si256(h0123, h4567, 0x31));
}

// Two 256-bit halves of a zmm: lower from lo, upper from hi.
__m512i join(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

const BlockQ8K* q8k_row(const void* x, size_t stride, int j) {
  return reinterpret_cast<const BlockQ8K*>(static_cast<const uint8_t*>(x) + size_t(j) * stride);
}

}  // namespace

// q45k_avx512: pair shuffle of every 16 bytes; per 128 elements the sub-blocks in the order 0, 2, 1, 3
// (the order of the low and high nibbles of 64 weight bytes); the two 64-byte runs interleaved by 16-bit
// words (L = unpacklo, H = unpackhi); and finally the 16-byte quarters regrouped as [L0 H0 L1 H1] and
// [L2 H2 L3 H3]. The kernel builds the same arrangement of the weight bytes once per super-block, so one
// maddubs + vpdpwssd per 64 activation bytes leaves lane l of the canonical order in i32 element l and
// l + 8 of a single accumulator (docs/kernels.md).
void prepare_q8k_q45k_avx512(const void* x, void* out, int64_t n) {
  const auto* in = static_cast<const BlockQ8K*>(x);
  auto* o = static_cast<BlockQ8K*>(out);
  const __m512i quarters_a = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
  const __m512i quarters_b = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
  for (int64_t k = 0; k < n / kQK_K; ++k) {
    o[k] = in[k];
    for (int half = 0; half < 2; ++half) {
      const int8_t* src = in[k].qs + 128 * half;
      int8_t* dst = o[k].qs + 128 * half;
      const int order[4] = {0, 2, 1, 3};
#pragma GCC unroll 8
      for (int i = 0; i < 4; ++i)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 32 * i), pairs256(load256(src + 32 * order[i])));
      const __m512i a = load512(dst), b = load512(dst + 64);
      const __m512i lo = _mm512_unpacklo_epi16(a, b), hi = _mm512_unpackhi_epi16(a, b);
      _mm512_storeu_si512(dst, _mm512_permutex2var_epi64(lo, quarters_a, hi));
      _mm512_storeu_si512(dst + 64, _mm512_permutex2var_epi64(lo, quarters_b, hi));
    }
  }
}

// q6k_avx512: pair shuffle of every 16 bytes, then per 128 elements the words of the two 64-byte groups
// (sub-blocks 8h+t and 8h+4+t in quarter t) interleaved, L = unpacklo and H = unpackhi, and regrouped as
// [L0 H0 L1 H1] [L2 H2 L3 H3], the arrangement q6k_decode gives the weights.
void prepare_q8k_q6k_avx512(const void* x, void* out, int64_t n) {
  const auto* in = static_cast<const BlockQ8K*>(x);
  auto* o = static_cast<BlockQ8K*>(out);
  const __m512i quarters_a = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
  const __m512i quarters_b = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
  for (int64_t k = 0; k < n / kQK_K; ++k) {
    o[k] = in[k];
    for (int half = 0; half < 2; ++half) {
      const int8_t* src = in[k].qs + 128 * half;
      const __m512i a = pairs(load512(src)), b = pairs(load512(src + 64));
      const __m512i lo = _mm512_unpacklo_epi16(a, b), hi = _mm512_unpackhi_epi16(a, b);
      _mm512_storeu_si512(o[k].qs + 128 * half, _mm512_permutex2var_epi64(lo, quarters_a, hi));
      _mm512_storeu_si512(o[k].qs + 128 * half + 64, _mm512_permutex2var_epi64(lo, quarters_b, hi));
    }
  }
}

namespace {

// ---- Q4_K / Q5_K ---------------------------------------------------------------------------------------

// One weight super-block decoded into the q45k_avx512 arrangement: w[i] pairs with activation bytes
// 64i .. 64i+63; its words alternate two sub-blocks (a, b) of one lane, scale[i] holds (sc_a, sc_b).
// The min scales as the bsums madd operand (each m[g/2] twice).
struct Q45kWeights {
  __m512i w[4], scale[4];
  __m256i mins;
};

template <typename Block>
inline Q45kWeights q45k_decode(const Block& a) {
  constexpr bool kQ5 = std::is_same_v<Block, BlockQ5K>;
  const __m512i low4 = _mm512_set1_epi8(0x0F), bit4 = _mm512_set1_epi8(0x10);
  const __m512i quarters_a = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
  const __m512i quarters_b = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
  uint64_t sc64, m64;
  q4k_unpack_scales_u64(a.scales, &sc64, &m64);
  // i32 p of sc16 is the (sc[2p], sc[2p+1]) word pair; broadcast from memory (a load, not a shuffle).
  alignas(16) int32_t sc16[4];
  _mm_store_si128(reinterpret_cast<__m128i*>(sc16), _mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(sc64))));
  const __m128i m16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(m64)));
  Q45kWeights r;
  r.mins = _mm256_setr_m128i(_mm_unpacklo_epi16(m16, m16), _mm_unpackhi_epi16(m16, m16));
  __m256i qh = _mm256_setzero_si256();
  if constexpr (kQ5) qh = pairs256(load256(a.qh));
#pragma GCC unroll 2
  for (int half = 0; half < 2; ++half) {  // sub-blocks 4h .. 4h+3
    const __m512i raw = pairs(load512(a.qs + 64 * half));
    __m512i q_lo = _mm512_and_si512(raw, low4);                          // sub-blocks 4h | 4h+2
    __m512i q_hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);  // sub-blocks 4h+1 | 4h+3
    if constexpr (kQ5) {  // bits 4h, 4h+1 (lower half) and 4h+2, 4h+3 (upper half) down to bits 0, 1
      const __m512i hb = join(_mm256_srli_epi16(qh, 4 * half), _mm256_srli_epi16(qh, 4 * half + 2));
      q_lo = _mm512_or_si512(q_lo, _mm512_and_si512(_mm512_slli_epi16(hb, 4), bit4));
      q_hi = _mm512_or_si512(q_hi, _mm512_and_si512(_mm512_slli_epi16(hb, 3), bit4));
    }
    // Word pairs (lane l of sub-block 4h|4h+2, lane l of 4h+1|4h+3), then the quarters regrouped so that
    // w[2h] holds sub-blocks (4h, 4h+1) lanes 0..3, 4..7, 0..3, 4..7 and w[2h+1] sub-blocks (4h+2, 4h+3).
    const __m512i lo = _mm512_unpacklo_epi16(q_lo, q_hi), hi = _mm512_unpackhi_epi16(q_lo, q_hi);
    r.w[2 * half] = _mm512_permutex2var_epi64(lo, quarters_a, hi);
    r.w[2 * half + 1] = _mm512_permutex2var_epi64(lo, quarters_b, hi);
    r.scale[2 * half] = _mm512_set1_epi32(sc16[2 * half]);
    r.scale[2 * half + 1] = _mm512_set1_epi32(sc16[2 * half + 1]);
  }
  return r;
}

// Σ_s sc[s]·Σ_c q·q8 of one activation super-block (q45k_avx512 layout): lane l in i32 elements l and l+8.
inline __m512i q45k_row_sums(const Q45kWeights& wt, const int8_t* q8) {
  __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
  s0 = _mm512_dpwssd_epi32(s0, _mm512_maddubs_epi16(wt.w[0], load512(q8)), wt.scale[0]);
  s1 = _mm512_dpwssd_epi32(s1, _mm512_maddubs_epi16(wt.w[1], load512(q8 + 64)), wt.scale[1]);
  s0 = _mm512_dpwssd_epi32(s0, _mm512_maddubs_epi16(wt.w[2], load512(q8 + 128)), wt.scale[2]);
  s1 = _mm512_dpwssd_epi32(s1, _mm512_maddubs_epi16(wt.w[3], load512(q8 + 192)), wt.scale[3]);
  return _mm512_add_epi32(s0, s1);
}

// [A_a (lanes 0..7) | A_b (lanes 0..7)] from two such sums.
inline __m512i fold_halves_two(__m512i a, __m512i b) {
  return _mm512_add_epi32(_mm512_shuffle_i64x2(a, b, 0x44), _mm512_shuffle_i64x2(a, b, 0xEE));
}

// [M_0 .. M_7] from the first NX rows' bsums·mins partial vectors (the others are zero).
template <int NX>
__m256i hsum_rows_i32(const __m256i v[8]) {
  if constexpr (NX == 1) return _mm256_castsi128_si256(_mm_cvtsi32_si128(hsum_i32(v[0])));
  if constexpr (NX <= 4) {
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    return _mm256_castsi128_si256(_mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
  }
  return hsum8_i32(v);
}

// NX (1..8) activation rows: the weight block is decoded once; each pair of rows then forms its integer
// sums, folds its lanes, and runs the reference's f32 steps — lane = fma(db, f32(A), lane) on eight lanes
// per row, acc = fma(-dmb, f32(M), acc) — block after block. Only integers are regrouped, so every row's
// result is the scalar reference's.
template <typename Block, int NX>
void dot_q45k(int64_t n, const void* w, const void* x, size_t x_stride, float* y) {
  static_assert(NX >= 1 && NX <= 8);
  constexpr int kPairs = (NX + 1) / 2;
  const auto* blocks = static_cast<const Block*>(w);
  __m512 lanes[kPairs];  // [row 2i lanes 0..7 | row 2i+1 lanes 0..7]
#pragma GCC unroll 8
  for (int i = 0; i < kPairs; ++i) lanes[i] = _mm512_setzero_ps();
  __m256 acc = _mm256_setzero_ps();  // acc of row j in element j
  for (int64_t k = 0; k < n / kQK_K; ++k) {
    const Block& a = blocks[k];
    const Q45kWeights wt = q45k_decode(a);
    // Min term of all rows at once: M_j in element j, then acc_j = fma(-dmin * d_j, M_j, acc_j).
    __m256i mpart[8] = {};
    alignas(32) float yd_rows[8] = {};
#pragma GCC unroll 8
    for (int j = 0; j < NX; ++j) {
      const BlockQ8K& b = q8k_row(x, x_stride, j)[k];
      mpart[j] = _mm256_madd_epi16(load256(b.bsums), wt.mins);
      yd_rows[j] = b.d;
    }
    const __m256 yd = _mm256_load_ps(yd_rows);
    const __m256 M = _mm256_cvtepi32_ps(hsum_rows_i32<NX>(mpart));
    acc = _mm256_fnmadd_ps(_mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(a.dmin)), yd), M, acc);
    const __m512 db = _mm512_castps256_ps512(_mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(a.d)), yd));
#pragma GCC unroll 8
    for (int i = 0; i < kPairs; ++i) {
      const __m512i s_a = q45k_row_sums(wt, q8k_row(x, x_stride, 2 * i)[k].qs);
      const __m512i s_b = 2 * i + 1 < NX ? q45k_row_sums(wt, q8k_row(x, x_stride, 2 * i + 1)[k].qs)
                                         : _mm512_setzero_si512();
      const __m512i A = fold_halves_two(s_a, s_b);
      const __m512i spread = join(_mm256_set1_epi32(2 * i), _mm256_set1_epi32(2 * i + 1));
      lanes[i] = _mm512_fmadd_ps(_mm512_permutexvar_ps(spread, db), _mm512_cvtepi32_ps(A), lanes[i]);
    }
  }
  alignas(32) float acc_rows[8];
  _mm256_store_ps(acc_rows, acc);
#pragma GCC unroll 8
  for (int i = 0; i < kPairs; ++i) {
    alignas(64) float lane[16];
    _mm512_store_ps(lane, lanes[i]);
    y[2 * i] = fold_lanes8(acc_rows[2 * i], lane);
    if (2 * i + 1 < NX) y[2 * i + 1] = fold_lanes8(acc_rows[2 * i + 1], lane + 8);
  }
}

// One activation row against one Q4_K weight row (decode): nothing amortises the per-block bookkeeping,
// so two consecutive super-blocks share one lane fold ([A_k | A_k+1]) and one min-term reduction. The f32
// steps still run block by block in order: lane = fma(db_k, A_k, lane), then block k+1; acc likewise.
void dot_q4k_one_row(int64_t n, const void* w, const void* x, float* y) {
  const auto* a = static_cast<const BlockQ4K*>(w);
  const auto* b = static_cast<const BlockQ8K*>(x);
  __m256 lane = _mm256_setzero_ps();
  float acc = 0.0f;
  const int64_t nb = n / kQK_K;
  int64_t k = 0;
  for (; k + 2 <= nb; k += 2) {
    const Q45kWeights w0 = q45k_decode(a[k]), w1 = q45k_decode(a[k + 1]);
    const __m512 A = _mm512_cvtepi32_ps(fold_halves_two(q45k_row_sums(w0, b[k].qs), q45k_row_sums(w1, b[k + 1].qs)));
    const __m256i h = _mm256_hadd_epi32(_mm256_madd_epi16(load256(b[k].bsums), w0.mins),
                                        _mm256_madd_epi16(load256(b[k + 1].bsums), w1.mins));
    const __m128i h2 = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    const __m128 M = _mm_cvtepi32_ps(_mm_hadd_epi32(h2, h2));  // [M_k, M_k+1, M_k, M_k+1]
    const float db0 = _cvtsh_ss(a[k].d) * b[k].d, dmb0 = _cvtsh_ss(a[k].dmin) * b[k].d;
    const float db1 = _cvtsh_ss(a[k + 1].d) * b[k + 1].d, dmb1 = _cvtsh_ss(a[k + 1].dmin) * b[k + 1].d;
    lane = _mm256_fmadd_ps(_mm256_set1_ps(db0), _mm512_castps512_ps256(A), lane);
    lane = _mm256_fmadd_ps(_mm256_set1_ps(db1), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(A), 1)), lane);
    acc = __builtin_fmaf(-dmb0, _mm_cvtss_f32(M), acc);
    acc = __builtin_fmaf(-dmb1, _mm_cvtss_f32(_mm_shuffle_ps(M, M, 0x55)), acc);
  }
  for (; k < nb; ++k) {  // an odd last block
    const Q45kWeights w0 = q45k_decode(a[k]);
    const __m512 A = _mm512_cvtepi32_ps(fold_halves_two(q45k_row_sums(w0, b[k].qs), _mm512_setzero_si512()));
    const float M = float(hsum_i32(_mm256_madd_epi16(load256(b[k].bsums), w0.mins)));
    const float db = _cvtsh_ss(a[k].d) * b[k].d, dmb = _cvtsh_ss(a[k].dmin) * b[k].d;
    lane = _mm256_fmadd_ps(_mm256_set1_ps(db), _mm512_castps512_ps256(A), lane);
    acc = __builtin_fmaf(-dmb, M, acc);
  }
  alignas(32) float l8[8];
  _mm256_store_ps(l8, lane);
  *y = fold_lanes8(acc, l8);
}

// ---- Q6_K ----------------------------------------------------------------------------------------------

// One Q6_K weight super-block decoded into the q6k_avx512 arrangement: per 128 elements the signed
// 6-bit values of sub-blocks 8h+t and 8h+4+t interleaved by words (L = unpacklo, H = unpackhi of the
// two 64-byte groups) and regrouped as [L0 H0 L1 H1], [L2 H2 L3 H3] — as prepare_q8k_q6k_avx512
// arranges the activations — kept as magnitudes plus sign masks (maddubs wants an unsigned operand);
// scale[i] holds each quarter's (sc_a, sc_b) word pair.
struct Q6kWeights {
  __m512i mag[4], scale[4];
  __mmask64 neg[4];
};

inline Q6kWeights q6k_decode(const BlockQ6K& a) {
  const __m512i low4 = _mm512_set1_epi8(0x0F), bits45 = _mm512_set1_epi8(0x30), bias = _mm512_set1_epi8(32);
  // 32-bit rotations bringing qh bits 2c, 2c+1 of each byte to bits 4, 5 of the same byte, for the lower
  // (group c) and upper (group c+1) half of a vector; the mask drops what other bits move in.
  const __m512i rot01 = join(_mm256_set1_epi32(4), _mm256_set1_epi32(2));
  const __m512i rot23 = join(_mm256_set1_epi32(0), _mm256_set1_epi32(30));
  const __m512i quarters_a = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
  const __m512i quarters_b = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
  const __m512i pair_a = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  const __m512i pair_b = _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  Q6kWeights r;
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {  // elements 128h .. 128h+127: groups c = 0 | 1 and c = 2 | 3
    const __m512i ql = pairs(load512(a.ql + 64 * h));
    const __m512i qh = pairs(_mm512_broadcast_i64x4(load256(a.qh + 32 * h)));
    const __m512i hi01 = _mm512_and_si512(_mm512_rolv_epi32(qh, rot01), bits45);
    const __m512i hi23 = _mm512_and_si512(_mm512_rolv_epi32(qh, rot23), bits45);
    const __m512i g01 = _mm512_or_si512(_mm512_and_si512(ql, low4), hi01);  // quarter t: sub-block 8h+t
    const __m512i g23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4), hi23);  // 8h+4+t
    const __m512i s01 = _mm512_sub_epi8(g01, bias), s23 = _mm512_sub_epi8(g23, bias);  // q - 32
    const __m512i lo = _mm512_unpacklo_epi16(s01, s23), hi = _mm512_unpackhi_epi16(s01, s23);
    const __m512i sa = _mm512_permutex2var_epi64(lo, quarters_a, hi);
    const __m512i sb = _mm512_permutex2var_epi64(lo, quarters_b, hi);
    r.mag[2 * h] = _mm512_abs_epi8(sa);
    r.mag[2 * h + 1] = _mm512_abs_epi8(sb);
    r.neg[2 * h] = _mm512_movepi8_mask(sa);
    r.neg[2 * h + 1] = _mm512_movepi8_mask(sb);
    // i32 t of sp: (sc[8h+t], sc[8h+4+t]), the pair of quarter t's data; sa holds quarters 0, 0, 1, 1 of
    // that data, sb quarters 2, 2, 3, 3.
    const __m128i s16 = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a.scales + 8 * h)));
    const __m512i sp = _mm512_castsi128_si512(_mm_unpacklo_epi16(s16, _mm_srli_si128(s16, 8)));
    r.scale[2 * h] = _mm512_permutexvar_epi32(pair_a, sp);
    r.scale[2 * h + 1] = _mm512_permutexvar_epi32(pair_b, sp);
  }
  return r;
}

// Σ_s sc[s]·Σ (q-32)·q8 of one activation super-block (q6k_avx512 layout): lane l in elements l, l+8.
inline __m512i q6k_row_sums(const Q6kWeights& wt, const int8_t* q8) {
  const __m512i zero = _mm512_setzero_si512();
  __m512i s[2] = {zero, zero};
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    const __m512i y = load512(q8 + 64 * i);
    // |q| times y with q's sign: the unsigned x signed form maddubs needs.
    const __m512i p = _mm512_maddubs_epi16(wt.mag[i], _mm512_mask_sub_epi8(y, wt.neg[i], zero, y));
    s[i & 1] = _mm512_dpwssd_epi32(s[i & 1], p, wt.scale[i]);
  }
  return _mm512_add_epi32(s[0], s[1]);
}

// NX (1..8) rows: the block is decoded once, then each pair of rows forms its integer sums, folds its
// lanes and runs the reference's f32 step lane = lane + (d·y.d)·f32(A) (multiply, then add).
template <int NX>
void dot_q6k(int64_t n, const void* w, const void* x, size_t x_stride, float* y) {
  static_assert(NX >= 1 && NX <= 8);
  constexpr int kPairs = (NX + 1) / 2;
  const auto* blocks = static_cast<const BlockQ6K*>(w);
  __m512 lanes[kPairs];  // [row 2i lanes 0..7 | row 2i+1 lanes 0..7]
#pragma GCC unroll 8
  for (int i = 0; i < kPairs; ++i) lanes[i] = _mm512_setzero_ps();
  for (int64_t k = 0; k < n / kQK_K; ++k) {
    const BlockQ6K& a = blocks[k];
    const Q6kWeights wt = q6k_decode(a);
    alignas(32) float yd_rows[8] = {};
#pragma GCC unroll 8
    for (int j = 0; j < NX; ++j) yd_rows[j] = q8k_row(x, x_stride, j)[k].d;
    const __m512 dd =
        _mm512_castps256_ps512(_mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(a.d)), _mm256_load_ps(yd_rows)));
#pragma GCC unroll 8
    for (int i = 0; i < kPairs; ++i) {
      const __m512i s_a = q6k_row_sums(wt, q8k_row(x, x_stride, 2 * i)[k].qs);
      const __m512i s_b =
          2 * i + 1 < NX ? q6k_row_sums(wt, q8k_row(x, x_stride, 2 * i + 1)[k].qs) : _mm512_setzero_si512();
      const __m512i A = fold_halves_two(s_a, s_b);
      const __m512i spread = join(_mm256_set1_epi32(2 * i), _mm256_set1_epi32(2 * i + 1));
      const __m512 scaled = _mm512_mul_ps(_mm512_permutexvar_ps(spread, dd), _mm512_cvtepi32_ps(A));
      lanes[i] = _mm512_add_ps(lanes[i], scaled);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < kPairs; ++i) {
    alignas(64) float lane[16];
    _mm512_store_ps(lane, lanes[i]);
    y[2 * i] = fold_lanes8(0.0f, lane);
    if (2 * i + 1 < NX) y[2 * i + 1] = fold_lanes8(0.0f, lane + 8);
  }
}


// ---- Q8_0 ----------------------------------------------------------------------------------------------

// One block's Σ w_i·x_i as 8 partial i32 sums, by vpdpbusd on |w| and x carrying w's sign.
__m256i q8_0_partials(__m256i w_abs, __m256i w, __m256i x) {
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w_abs, _mm256_sign_epi8(x, w));
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

}  // namespace

void vec_dot_q8_0_q8_0_avx512(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  ESSAIM_DISPATCH_NX(dot_q8_0)
}
// Up to four rows the register-resident form (all accumulators live); more rows the wide form.
void vec_dot_q4k_q8k_avx512(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  if (nx == 1) return dot_q4k_one_row(n, w, x, y);
  ESSAIM_DISPATCH_NX8(dot_q45k, BlockQ4K)
}
void vec_dot_q5k_q8k_avx512(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  ESSAIM_DISPATCH_NX8(dot_q45k, BlockQ5K)
}
void vec_dot_q6k_q8k_avx512(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  ESSAIM_DISPATCH_NX8(dot_q6k)
}

}  // namespace essaim
