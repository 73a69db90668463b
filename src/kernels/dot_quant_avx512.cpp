// AVX-512 (F, BW, VL, VNNI) dot products of the quantised formats, bit-identical to dot_scalar.cpp.
//
// Q6_K lives in dot_q6k_avx512.cpp.
// Q4_K/Q5_K: a 32-element sub-block has exactly four elements of each lane, so weights and activations
// are both put in an order where they fill one dword (prepare_q8k_q45k_avx512, q45k_decode) and
// vpdpbusd forms every (sub-block, lane) sum exactly; two sub-blocks' sums are then paired into words
// and vpdpwssd applies their scales. Q8_0 uses vpdpbusd on whole blocks, whose reference sum is one
// integer. A weight block is decoded once for up to eight activation rows, which then run two at a time;
// two rows' lanes share one zmm for the f32 steps, and each row's values go through exactly the
// reference's operations. With one row (decode) and a CPU with AVX-512 VBMI, Q4_K arranges the
// weight bytes with vpermi2b instead of chains of shuffles: same registers, same bits.
#include <cpuid.h>
#include <immintrin.h>

#include <atomic>
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

namespace {

// The q45k_avx512 byte order of four 32-byte runs (element j of a run at byte j) held as v0 = [run 0 |
// run 1], v1 = [run 2 | run 3]: pairs16 in every 16 bytes, then the words of each run's two 16-byte halves
// interleaved, so that every dword holds the four elements 8c + l (c = 0..3) of one lane l of one run.
// e1 = [run 0 lanes 0-3 | run 1 lanes 0-3 | run 2 lanes 4-7 | run 3 lanes 4-7] and
// e2 = [run 2 lanes 0-3 | run 3 lanes 0-3 | run 0 lanes 4-7 | run 1 lanes 4-7] (16 bytes each).
inline void vnni_runs(__m512i v0, __m512i v1, __m512i* e1, __m512i* e2) {
  const __m512i a = pairs(v0), b = pairs(v1);
  const __m512i first = _mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(2, 0, 2, 0));   // elements 0..15 of runs 0..3
  const __m512i second = _mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(3, 1, 3, 1));  // elements 16..31
  const __m512i lo = _mm512_unpacklo_epi16(first, second);  // per run: lanes 0..3
  const __m512i hi = _mm512_unpackhi_epi16(first, second);  // per run: lanes 4..7
  *e1 = _mm512_mask_blend_epi64(0xF0, lo, hi);
  *e2 = _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(1, 0, 3, 2));
}

}  // namespace

// q45k_avx512: each super-block's qs as four 64-byte groups G0..G3, every dword one lane of one sub-block
// (its four elements 8c + l): G0 = vnni_runs e1 of sub-blocks (0, 2, 4, 6), G1 = e1 of (1, 3, 5, 7),
// G2 = e2 of (0, 2, 4, 6), G3 = e2 of (1, 3, 5, 7) — the arrangement q45k_decode gives the weights' low
// (even sub-blocks) and high (odd sub-blocks) nibbles, so one vpdpbusd per 64 bytes yields the per-lane
// sums of four sub-blocks at once (docs/kernels.md).
void prepare_q8k_q45k_avx512(const void* x, void* out, int64_t n) {
  const auto* in = static_cast<const BlockQ8K*>(x);
  auto* o = static_cast<BlockQ8K*>(out);
  for (int64_t k = 0; k < n / kQK_K; ++k) {
    o[k] = in[k];
    const int8_t* q = in[k].qs;
    __m512i g[4];
    for (int odd = 0; odd < 2; ++odd) {  // sub-blocks 2g + odd, g = 0..3
      const __m512i v0 = join(load256(q + 32 * odd), load256(q + 64 + 32 * odd));
      const __m512i v1 = join(load256(q + 128 + 32 * odd), load256(q + 192 + 32 * odd));
      vnni_runs(v0, v1, &g[odd], &g[2 + odd]);
    }
    for (int i = 0; i < 4; ++i) _mm512_storeu_si512(o[k].qs + 64 * i, g[i]);
  }
}

namespace {

// ---- Q4_K / Q5_K ---------------------------------------------------------------------------------------

// One weight super-block decoded into the q45k_avx512 arrangement: w[i] pairs with activation group Gi
// (w[0], w[2]: low nibbles, the even sub-blocks; w[1], w[3]: high nibbles, the odd ones — the two
// nibbles of a qs byte are the same element of sub-blocks 2g and 2g+1, so one byte order serves both).
// scale[0] holds in each dword of 128-bit part k the word pair (sc[2k], sc[2k+1]) — the sub-blocks of
// w[0] | w[1] there — and scale[1] those of w[2] | w[3]: parts (2, 3, 0, 1). The min scales as the bsums
// madd operand (each m[g/2] twice).
struct Q45kWeights {
  __m512i w[4], scale[2];
  __m256i mins;
};

// The decode from the four qs runs already in the q45k_avx512 order (e[0] = e1, e[1] = e2 of vnni_runs).
template <typename Block>
inline Q45kWeights q45k_decode_runs(const Block& a, const __m512i e[2]) {
  constexpr bool kQ5 = std::is_same_v<Block, BlockQ5K>;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  uint64_t sc64, m64;
  q4k_unpack_scales_u64(a.scales, &sc64, &m64);
  const __m512i sc16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(sc64))));
  const __m128i m16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(m64)));
  Q45kWeights r;
  r.mins = _mm256_setr_m128i(_mm_unpacklo_epi16(m16, m16), _mm_unpackhi_epi16(m16, m16));
  r.scale[0] = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3), sc16);
  r.scale[1] = _mm512_permutexvar_epi32(_mm512_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3, 0, 0, 0, 0, 1, 1, 1, 1), sc16);
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i) {
    r.w[2 * i] = _mm512_and_si512(e[i], low4);                           // sub-blocks 2g
    r.w[2 * i + 1] = _mm512_and_si512(_mm512_srli_epi16(e[i], 4), low4);  // sub-blocks 2g + 1
  }
  if constexpr (kQ5) {
    // qh byte j holds the fifth bit of element j of sub-block s at bit s. Every run uses one byte order,
    // so qh in that order serves every part: lanes 0-3 in parts 0, 1 and lanes 4-7 in parts 2, 3 (e1 and
    // e2 alike). Part k of e1 holds run k, of e2 run (k + 2) % 4: shift words right by 2·run.
    const __m256i qp = pairs256(load256(a.qh));
    const __m512i first = _mm512_broadcast_i32x4(_mm256_castsi256_si128(qp));
    const __m512i second = _mm512_broadcast_i32x4(_mm256_extracti128_si256(qp, 1));
    const __m512i qh = _mm512_mask_blend_epi64(0xF0, _mm512_unpacklo_epi16(first, second),
                                               _mm512_unpackhi_epi16(first, second));
    const __m512i shift[2] = {
        join(_mm256_setr_epi16(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2),
             _mm256_setr_epi16(4, 4, 4, 4, 4, 4, 4, 4, 6, 6, 6, 6, 6, 6, 6, 6)),
        join(_mm256_setr_epi16(4, 4, 4, 4, 4, 4, 4, 4, 6, 6, 6, 6, 6, 6, 6, 6),
             _mm256_setr_epi16(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2))};
    const __m512i bit0 = _mm512_set1_epi8(0x01), bit1 = _mm512_set1_epi8(0x02);
#pragma GCC unroll 2
    for (int i = 0; i < 2; ++i) {
      const __m512i h = _mm512_srlv_epi16(qh, shift[i]);  // bit 0: sub-block 2·run, bit 1: 2·run + 1
      r.w[2 * i] = _mm512_or_si512(r.w[2 * i], _mm512_slli_epi16(_mm512_and_si512(h, bit0), 4));
      r.w[2 * i + 1] = _mm512_or_si512(r.w[2 * i + 1], _mm512_slli_epi16(_mm512_and_si512(h, bit1), 3));
    }
  }
  return r;
}

template <typename Block>
inline Q45kWeights q45k_decode(const Block& a) {
  __m512i e[2];  // runs g = 0..3 of qs (32 bytes each) in the q45k_avx512 byte order
  vnni_runs(load512(a.qs), load512(a.qs + 64), &e[0], &e[1]);
  return q45k_decode_runs(a, e);
}

// Σ_s sc[s]·Σ_c q·q8 of one activation super-block (q45k_avx512 layout). vpdpbusd sums the four
// elements of one (sub-block, lane) exactly (|sum| <= 4·31·128 < 2^15); the odd sub-blocks' sums move to
// the upper words and vpdpwssd applies both scales. Part k of the result holds lanes 0-3 (k = 0, 1) or
// 4-7 (k = 2, 3), each of two sub-block pairs.
inline __m512i q45k_row_sums(const Q45kWeights& wt, const int8_t* q8) {
  const __m512i zero = _mm512_setzero_si512();
  __m512i p[2];
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i) {
    const __m512i even = _mm512_dpbusd_epi32(zero, wt.w[2 * i], load512(q8 + 128 * i));
    const __m512i odd = _mm512_dpbusd_epi32(zero, wt.w[2 * i + 1], load512(q8 + 128 * i + 64));
    p[i] = _mm512_mask_blend_epi16(0xAAAAAAAA, even, _mm512_slli_epi32(odd, 16));
  }
  return _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(zero, p[0], wt.scale[0]), p[1], wt.scale[1]);
}

// [A_a (lanes 0..7) | A_b (lanes 0..7)] from two such sums: parts 0 + 1 are lanes 0-3, parts 2 + 3 lanes 4-7.
inline __m512i q45k_fold_two(__m512i a, __m512i b) {
  return _mm512_add_epi32(_mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                          _mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
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
      const __m512i A = q45k_fold_two(s_a, s_b);
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
    const __m512 A = _mm512_cvtepi32_ps(q45k_fold_two(q45k_row_sums(w0, b[k].qs), q45k_row_sums(w1, b[k + 1].qs)));
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
    const __m512 A = _mm512_cvtepi32_ps(q45k_fold_two(q45k_row_sums(w0, b[k].qs), _mm512_setzero_si512()));
    const float M = float(hsum_i32(_mm256_madd_epi16(load256(b[k].bsums), w0.mins)));
    const float db = _cvtsh_ss(a[k].d) * b[k].d, dmb = _cvtsh_ss(a[k].dmin) * b[k].d;
    lane = _mm256_fmadd_ps(_mm256_set1_ps(db), _mm512_castps512_ps256(A), lane);
    acc = __builtin_fmaf(-dmb, M, acc);
  }
  alignas(32) float l8[8];
  _mm256_store_ps(l8, lane);
  *y = fold_lanes8(acc, l8);
}

// ---- Q4_K one row with AVX-512 VBMI ---------------------------------------------------------------------

// vpermi2b indices giving vnni_runs' e1 (kVbmiRuns[0]) and e2 ([1]) of qs bytes 0..127 in one instruction
// each (source byte 32·run + element; 64 and up select the second 64 bytes). Part p of e1 holds run
// (0, 1, 2, 3)[p], lanes 0-3 for p < 2 and 4-7 above; e2 runs (2, 3, 0, 1); dword d of a part is lane
// L + d, its byte c element 8c + L + d — the order vnni_runs reaches with eight shuffles.
struct VbmiRunIndex {
  alignas(64) uint8_t idx[2][64];
};
constexpr VbmiRunIndex make_vbmi_run_index() {
  VbmiRunIndex t{};
  constexpr int kRun[2][4] = {{0, 1, 2, 3}, {2, 3, 0, 1}};
  for (int e = 0; e < 2; ++e)
    for (int o = 0; o < 64; ++o) {
      const int part = o / 16, lane = (part < 2 ? 0 : 4) + (o % 16) / 4, c = o % 4;
      t.idx[e][o] = uint8_t(32 * kRun[e][part] + 8 * c + lane);
    }
  return t;
}
constexpr VbmiRunIndex kVbmiRuns = make_vbmi_run_index();

// Whether the one-row Q4_K kernel uses VBMI: -1 until first asked (CPUID leaf 7, ECX bit 1; the kernel
// table's AVX-512 check already covers the OS's zmm state), then 0 or 1. Lazy, so that no code of this
// file runs on a CPU without AVX-512; set_avx512_vbmi_kernels lets tests run both forms.
bool cpu_has_vbmi() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (c & (1u << 1)) != 0;
}
std::atomic<int> g_q4k_vbmi{-1};
bool use_vbmi() {
  int v = g_q4k_vbmi.load(std::memory_order_relaxed);
  if (v < 0) {
    v = cpu_has_vbmi() ? 1 : 0;
    g_q4k_vbmi.store(v, std::memory_order_relaxed);
  }
  return v != 0;
}

__attribute__((target("avx512vbmi"))) inline Q45kWeights q4k_decode_vbmi(const BlockQ4K& blk, __m512i i1,
                                                                           __m512i i2) {
  const __m512i lo = load512(blk.qs), hi = load512(blk.qs + 64);
  const __m512i e[2] = {_mm512_permutex2var_epi8(lo, i1, hi), _mm512_permutex2var_epi8(lo, i2, hi)};
  return q45k_decode_runs(blk, e);
}

// dot_q4k_one_row with the weight runs arranged by two vpermi2b instead of vnni_runs' eight shuffles:
// the same bytes in the same registers, so the same integer sums, and the f32 steps are dot_q4k_one_row's
// line for line (keep the two in step).
__attribute__((target("avx512vbmi"))) void dot_q4k_one_row_vbmi(int64_t n, const void* w, const void* x,
                                                                 float* y) {
  const auto* a = static_cast<const BlockQ4K*>(w);
  const auto* b = static_cast<const BlockQ8K*>(x);
  const __m512i i1 = _mm512_load_si512(kVbmiRuns.idx[0]), i2 = _mm512_load_si512(kVbmiRuns.idx[1]);
  __m256 lane = _mm256_setzero_ps();
  float acc = 0.0f;
  const int64_t nb = n / kQK_K;
  int64_t k = 0;
  for (; k + 2 <= nb; k += 2) {
    const Q45kWeights w0 = q4k_decode_vbmi(a[k], i1, i2), w1 = q4k_decode_vbmi(a[k + 1], i1, i2);
    const __m512 A = _mm512_cvtepi32_ps(q45k_fold_two(q45k_row_sums(w0, b[k].qs), q45k_row_sums(w1, b[k + 1].qs)));
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
    const Q45kWeights w0 = q4k_decode_vbmi(a[k], i1, i2);
    const __m512 A = _mm512_cvtepi32_ps(q45k_fold_two(q45k_row_sums(w0, b[k].qs), _mm512_setzero_si512()));
    const float M = float(hsum_i32(_mm256_madd_epi16(load256(b[k].bsums), w0.mins)));
    const float db = _cvtsh_ss(a[k].d) * b[k].d, dmb = _cvtsh_ss(a[k].dmin) * b[k].d;
    lane = _mm256_fmadd_ps(_mm256_set1_ps(db), _mm512_castps512_ps256(A), lane);
    acc = __builtin_fmaf(-dmb, M, acc);
  }
  alignas(32) float l8[8];
  _mm256_store_ps(l8, lane);
  *y = fold_lanes8(acc, l8);
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
  if (nx == 1) {
    if (use_vbmi()) return dot_q4k_one_row_vbmi(n, w, x, y);
    return dot_q4k_one_row(n, w, x, y);
  }
  ESSAIM_DISPATCH_NX8(dot_q45k, BlockQ4K)
}
void vec_dot_q5k_q8k_avx512(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  ESSAIM_DISPATCH_NX8(dot_q45k, BlockQ5K)
}

}  // namespace essaim

namespace essaim {
bool set_avx512_vbmi_kernels(bool on) {
  const bool was = use_vbmi();
  g_q4k_vbmi.store(on && cpu_has_vbmi() ? 1 : 0);
  return was;
}
}  // namespace essaim
