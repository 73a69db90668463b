// Q4_K and Q6_K products of several activation rows on AVX-512 VNNI, one weight row per 32-bit lane,
// bit-identical to the dot kernels (matmul_rowlanes_avx512.h; docs/kernels.md, "AVX-512 row-lane products").
//
// The eight-row dot kernels keep one weight row in a vector: each activation row's sums lie across its
// lanes and need a reduction tree per super-block, and the weight block is arranged anew for every eight
// activation rows. Here sixteen weight rows are transposed into the sixteen lanes once per call
// (RowLanesQ4k, per super-block), and every prepared activation dword is broadcast from memory straight
// into a vpdpbusd against all sixteen, so lane r only ever holds row r's sums:
//   S_lo, S_hi  = the two 16-element halves of sub-block s: four vpdpbusd each, |S| <= 16·15·128 < 2^15;
//   A          += S_lo·sc[s] + S_hi·sc[s]: vpdpwssd against (sc[s], 0) words — S fits the low word exactly;
//   M           = Σ_i (bsums[2i] + bsums[2i+1])·m[i]: vpdpwssd of the rows' bsums pairs, as given, against
//                 (m[i], m[i]) words (the reference reads the bsums, not the values);
//   acc         = fma(d·y.d, f32(A), acc), then fma(-(dmin·y.d), f32(M), acc): the canonical steps, per lane.
// The activation rows need no padding: each one is a run of broadcasts, and its sixteen results are one
// masked store. Q6_K (RowLanesQ6k) has the same shape with its own integers (rows_block below); one Q4_K
// activation row (decode) runs a fused form that stores nothing (one_row_block).
#include "kernels/matmul_rowlanes_avx512.h"

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/status.h"
#include "kernels/blocks.h"
#include "kernels/kernel_traits.h"
#include "kernels/q6k_arrange_avx512.h"
#include "kernels/transpose_avx512.h"

namespace essaim {
namespace {

constexpr int kLaneRows = 16;                 // weight rows per vector
constexpr int kGroupRows = 4;                 // activation rows sharing each load of the weight vectors (3 measured
                                              // the same, 2 and 6-8 slower)

// One super-block of sixteen weight rows; lane r of every vector is row r's.
struct alignas(64) RowLanesQ4k {
  __m512i q[8][8];  // [s][i]: the values 0..15 of group i (elements 4i..4i+3) of sub-block s
  __m512i sc[8];    // [s]: sc[s] as a dword (high word 0)
  __m512i mins[8];  // [i]: m[i] | m[i] << 16
  __m512 d, dmin;
};

// The same for Q6_K. q[m][d], lane r: dword d of row r's values 64m .. 64m + 63 in element order (elements
// 64m + 4d .. + 3, group d % 4 of sub-block 4m + d / 4), the unsigned 6-bit values 0..63.
struct alignas(64) RowLanesQ6k {
  __m512i q[4][16];
  __m512i sc[16];   // [s]: sc[s], sign-extended
  __m512i pair[8];  // [j]: sc[s(2j)] | sc[s(2j+1)] << 16 as words, s(p) = 4(p % 4) + p / 4: against the
                    // prepared bsums' dword j (bsums[p] = -Σ of sub-block s(p), dot_kernels.h)
  __m512 d;
};

struct alignas(64) Acc16 {  // f32 results of one activation row, lane r: weight row r of the vector
  __m512 v;
};

// Sixteen bytes at `offset` in each row's block — Q4_K: [d | dmin] and the three dwords of packed scales;
// Q6_K: the sixteen scales — one row per lane: f[t] lane r = dword t of row r. Four vectors of four rows
// (z[q] dword 4L + t: dword t of row 4q + L), then a 16 x 4 dword transpose (four vpgatherdd measured 5-9 %
// slower on the AMD EPYC, Zen 5, at 8 activation rows).
inline __attribute__((always_inline)) void block_heads(const uint8_t* const rows[kLaneRows], size_t offset,
                                                       __m512i f[4]) {
  auto load128 = [offset](const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + offset)); };
  __m512i z[4];
#pragma GCC unroll 4
  for (int q = 0; q < 4; ++q) {
    z[q] = _mm512_castsi128_si512(load128(rows[4 * q]));
    z[q] = _mm512_inserti32x4(z[q], load128(rows[4 * q + 1]), 1);
    z[q] = _mm512_inserti32x4(z[q], load128(rows[4 * q + 2]), 2);
    z[q] = _mm512_inserti32x4(z[q], load128(rows[4 * q + 3]), 3);
  }
#pragma GCC unroll 4
  for (int t = 0; t < 4; ++t) {
    const __m512i idx = _mm512_setr_epi32(t, 4 + t, 8 + t, 12 + t, 16 + t, 20 + t, 24 + t, 28 + t,  //
                                          t, 4 + t, 8 + t, 12 + t, 16 + t, 20 + t, 24 + t, 28 + t);
    const __m512i lo = _mm512_permutex2var_epi32(z[0], idx, z[1]), hi = _mm512_permutex2var_epi32(z[2], idx, z[3]);
    f[t] = _mm512_inserti64x4(lo, _mm512_castsi512_si256(hi), 1);
  }
}

// The sixteen Q4_K rows' d, dmin, scales and mins, one row per lane: q4k_unpack_scales_u64's arithmetic on
// the blocks' first 16 bytes. Byte b of sc[h] is sc[4h + b], of m[h] m[4h + b].
struct Q4kHeads {
  __m512 d, dmin;
  __m512i sc[2], m[2];
};
inline __attribute__((always_inline)) Q4kHeads q4k_heads(const uint8_t* const rows[kLaneRows]) {
  __m512i head[4];
  block_heads(rows, 0, head);
  const __m512i dd = head[0], u0 = head[1], u1 = head[2], u2 = head[3];
  const __m512i m3f = _mm512_set1_epi32(0x3F3F3F3F), m0f = _mm512_set1_epi32(0x0F0F0F0F),
                m30 = _mm512_set1_epi32(0x30303030);
  Q4kHeads h;
  h.d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd));
  h.dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16)));
  h.sc[0] = _mm512_and_si512(u0, m3f);
  h.sc[1] = _mm512_or_si512(_mm512_and_si512(u2, m0f), _mm512_and_si512(_mm512_srli_epi32(u0, 2), m30));
  h.m[0] = _mm512_and_si512(u1, m3f);
  h.m[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), m0f), _mm512_and_si512(_mm512_srli_epi32(u1, 2), m30));
  return h;
}

// Entry s (0..7) of four packed bytes per lane (q4k_heads' sc or m): as a dword (lane_byte), or as both
// words of the dword (twice_byte, for vpdpwssd against a pair of words). One byte shuffle each — byte s % 4
// of every dword to byte 0 (and 2), the others zero — instead of a shift and a mask (and a shift and an or):
// 32 fewer operations per sixteen rows and super-block in the decode kernel, ~0.97-0.98x its time cold (one
// thread, paired in one process with both link orders; docs/engine.md, "sixth session").
inline __attribute__((always_inline)) __m512i byte_pick(int s, bool both_words) {
  auto dword = [s, both_words](int k) {
    const uint32_t src = uint32_t(4 * k + s % 4), zero = 0x80;
    return int(src | zero << 8 | (both_words ? src : zero) << 16 | zero << 24);
  };
  return _mm512_setr4_epi32(dword(0), dword(1), dword(2), dword(3));  // the same in every 128-bit lane
}
inline __attribute__((always_inline)) __m512i lane_byte(const __m512i packed[2], int s) {
  return _mm512_shuffle_epi8(packed[s / 4], byte_pick(s, false));
}
inline __attribute__((always_inline)) __m512i twice_byte(const __m512i packed[2], int s) {
  return _mm512_shuffle_epi8(packed[s / 4], byte_pick(s, true));
}

// Bytes 64·half .. 64·half + 63 of the sixteen rows' qs, transposed: r[j] lane l = dword j of row l's
// (group j % 8 of sub-blocks 4·half + 2(j / 8) in the low nibbles and 4·half + 2(j / 8) + 1 in the high).
inline __attribute__((always_inline)) void q4k_qs_half(const uint8_t* const rows[kLaneRows], int half,
                                                       __m512i r[kLaneRows]) {
#pragma GCC unroll 16
  for (int j = 0; j < kLaneRows; ++j) r[j] = _mm512_loadu_si512(rows[j] + offsetof(BlockQ4K, qs) + 64 * half);
  transpose16x16(r);
}

// Super-block k of the sixteen weight rows at rows[r] (rows past the range repeat the last one) into P.
// Not inlined: it runs once per sixteen rows and super-block, and a profile then shows it apart from the
// products.
__attribute__((noinline)) void prepare_block(const uint8_t* const rows[kLaneRows], RowLanesQ4k* P) {
  const Q4kHeads h = q4k_heads(rows);
  P->d = h.d;
  P->dmin = h.dmin;
#pragma GCC unroll 8
  for (int s = 0; s < 8; ++s) {
    P->sc[s] = lane_byte(h.sc, s);
    P->mins[s] = twice_byte(h.m, s);
  }
  // The 128 bytes of qs as two 16 x 16 dword matrices, transposed; dword j of qs bytes 0..63 is group j % 8
  // of sub-blocks 0 (low nibbles) and 1 (high) for j < 8, of 2 and 3 for j >= 8; bytes 64..127 likewise
  // for sub-blocks 4..7.
  const __m512i low4 = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 2
  for (int half = 0; half < 2; ++half) {
    __m512i r[kLaneRows];
    q4k_qs_half(rows, half, r);
#pragma GCC unroll 16
    for (int j = 0; j < kLaneRows; ++j) {
      const int s = 4 * half + 2 * (j / 8), i = j % 8;
      P->q[s][i] = _mm512_and_si512(r[j], low4);
      P->q[s + 1][i] = _mm512_and_si512(_mm512_srli_epi16(r[j], 4), low4);
    }
  }
}

// The same for Q6_K rows.
__attribute__((noinline)) void prepare_block(const uint8_t* const rows[kLaneRows], RowLanesQ6k* P) {
  __m512i sc4[4];  // byte b of dword t, lane r: sc[4t + b] of row r
  block_heads(rows, offsetof(BlockQ6K, scales), sc4);
#pragma GCC unroll 16
  for (int s = 0; s < 16; ++s) P->sc[s] = _mm512_srai_epi32(_mm512_slli_epi32(sc4[s / 4], 24 - 8 * (s % 4)), 24);
  auto sub_block = [](int p) { return 4 * (p % 4) + p / 4; };
  const __m512i low16 = _mm512_set1_epi32(0xFFFF);
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j)
    P->pair[j] = _mm512_or_si512(_mm512_and_si512(P->sc[sub_block(2 * j)], low16),
                                 _mm512_slli_epi32(P->sc[sub_block(2 * j + 1)], 16));
  alignas(32) uint16_t d[kLaneRows];
  for (int r = 0; r < kLaneRows; ++r) std::memcpy(&d[r], rows[r] + offsetof(BlockQ6K, d), 2);
  P->d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(d)));
#pragma GCC unroll 4
  for (int m = 0; m < 4; ++m) {
    __m512i r[kLaneRows];
#pragma GCC unroll 16
    for (int j = 0; j < kLaneRows; ++j) r[j] = q6k_values64(*reinterpret_cast<const BlockQ6K*>(rows[j]), m);
    transpose16x16(r);
#pragma GCC unroll 16
    for (int d4 = 0; d4 < kLaneRows; ++d4) P->q[m][d4] = r[d4];
  }
}

// The sixteen rows' blocks `ahead` bytes on (the next super-block, or the next vector's first), requested
// while this one is computed: the rows are sixteen streams apart, more than the hardware prefetchers
// follow, and with few activation rows per call the weights arrive cold. Formed as integers, since they
// may lie past the matrix, where a prefetch is harmless. (always_inline: GCC drops calls of a function
// that only prefetches.)
template <typename Block>
inline __attribute__((always_inline)) void prefetch_next(const uint8_t* const rows[kLaneRows], uintptr_t ahead) {
  for (int r = 0; r < kLaneRows; ++r) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(rows[r]) + ahead;
    for (uintptr_t o = 0; o < sizeof(Block); o += 64) _mm_prefetch(reinterpret_cast<const char*>(p + o), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(p + sizeof(Block) - 1), _MM_HINT_T0);
  }
}

// acc + vpdpbusd / vpdpwssd (w, the dword at p broadcast), with the broadcast inside the instruction
// ({1to16}): GCC 12 makes a separate vpbroadcastd of every _mm512_set1_epi32 operand, one more instruction
// per product.
inline __attribute__((always_inline)) __m512i dpbusd_bcast(__m512i acc, __m512i w, const void* p) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*static_cast<const int32_t*>(p)));
  return acc;
}
inline __attribute__((always_inline)) __m512i dpwssd_bcast(__m512i acc, __m512i w, const void* p) {
  asm("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*static_cast<const int32_t*>(p)));
  return acc;
}

// Super-block P against NX activation rows (their block k, prepared layout: group i of sub-block s at bytes
// 32i + 4s); acc[j] (lane r: weight row r against row j) takes the canonical f32 steps.
template <int NX>
inline __attribute__((always_inline)) void rows_block(const RowLanesQ4k& P, const BlockQ8K* const x[NX],
                                                      Acc16* acc) {
  const __m512i zero = _mm512_setzero_si512();
  __m512i A[NX], M[NX];
  for (int j = 0; j < NX; ++j) A[j] = M[j] = zero;
#pragma GCC unroll 8
  for (int s = 0; s < 8; ++s) {
    const __m512i sc = P.sc[s];
#pragma GCC unroll 4
    for (int j = 0; j < NX; ++j) {
      const int8_t* q = x[j]->qs + 4 * s;
      __m512i lo = dpbusd_bcast(zero, P.q[s][0], q);
      __m512i hi = dpbusd_bcast(zero, P.q[s][4], q + 128);
      lo = dpbusd_bcast(lo, P.q[s][1], q + 32);
      hi = dpbusd_bcast(hi, P.q[s][5], q + 160);
      lo = dpbusd_bcast(lo, P.q[s][2], q + 64);
      hi = dpbusd_bcast(hi, P.q[s][6], q + 192);
      lo = dpbusd_bcast(lo, P.q[s][3], q + 96);
      hi = dpbusd_bcast(hi, P.q[s][7], q + 224);
      A[j] = _mm512_dpwssd_epi32(A[j], lo, sc);
      A[j] = _mm512_dpwssd_epi32(A[j], hi, sc);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NX; ++j) M[j] = dpwssd_bcast(M[j], P.mins[i], &x[j]->bsums[2 * i]);
#pragma GCC unroll 4
  for (int j = 0; j < NX; ++j) {
    const __m512 dx = _mm512_set1_ps(x[j]->d);
    acc[j].v = _mm512_fmadd_ps(_mm512_mul_ps(P.d, dx), _mm512_cvtepi32_ps(A[j]), acc[j].v);
    acc[j].v = _mm512_fnmadd_ps(_mm512_mul_ps(P.dmin, dx), _mm512_cvtepi32_ps(M[j]), acc[j].v);
  }
}

// Q6_K super-block P against NX activation rows (prepared q6k_avx512 layout: dword p of bytes 64g .. 64g + 63
// holds group g of sub-block s(p)): per sub-block s = 4m + i, U = Σ q·x by four vpdpbusd (|U| <=
// 16·63·128 < 2^17) and A += U·sc[s] by vpmulld; C = Σ_s sc[s]·bsums(s) with the prepared (negated,
// recomputed) bsums, so A + 32·C = Σ_s sc[s]·Σ (q − 32)·x exactly (|A| < 2^28, |32·C| < 2^28); then
// acc = fma(d·y.d, f32(A), acc).
template <int NX>
inline __attribute__((always_inline)) void rows_block(const RowLanesQ6k& P, const BlockQ8K* const x[NX],
                                                      Acc16* acc) {
  const __m512i zero = _mm512_setzero_si512();
  __m512i A[NX], C[NX];
  for (int j = 0; j < NX; ++j) A[j] = C[j] = zero;
#pragma GCC unroll 4
  for (int m = 0; m < 4; ++m)
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      const __m512i sc = P.sc[4 * m + i];
#pragma GCC unroll 4
      for (int j = 0; j < NX; ++j) {
        // Group g of sub-block 4m + i: prepared bytes 64g + 4p, p = 4i + m.
        const int8_t* q = x[j]->qs + 16 * i + 4 * m;
        __m512i u = dpbusd_bcast(zero, P.q[m][4 * i], q);
        u = dpbusd_bcast(u, P.q[m][4 * i + 1], q + 64);
        u = dpbusd_bcast(u, P.q[m][4 * i + 2], q + 128);
        u = dpbusd_bcast(u, P.q[m][4 * i + 3], q + 192);
        A[j] = _mm512_add_epi32(A[j], _mm512_mullo_epi32(u, sc));
      }
    }
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NX; ++j) C[j] = dpwssd_bcast(C[j], P.pair[i], &x[j]->bsums[2 * i]);
#pragma GCC unroll 4
  for (int j = 0; j < NX; ++j) {
    const __m512i a = _mm512_add_epi32(A[j], _mm512_slli_epi32(C[j], 5));
    acc[j].v = _mm512_fmadd_ps(_mm512_mul_ps(P.d, _mm512_set1_ps(x[j]->d)), _mm512_cvtepi32_ps(a), acc[j].v);
  }
}

// The last 1..NX rows of a pass (fewer than a group), each count with its own register allocation.
template <int NX, typename Prepared>
inline void rows_tail(int n, const Prepared& P, const BlockQ8K* const x[], Acc16* acc) {
  if constexpr (NX >= 1) {
    if (n == NX) return rows_block<NX>(P, x, acc);
    rows_tail<NX - 1>(n, P, x, acc);
  }
}

const BlockQ8K* q8k_block(const uint8_t* xprep, uint64_t x_stride, int64_t t, int64_t k) {
  return reinterpret_cast<const BlockQ8K*>(xprep + uint64_t(t) * x_stride) + k;
}

// One activation row (decode) against sixteen Q4_K rows' super-block, with nothing stored: the transposed
// weights go from the shuffles straight into the products, and the f32 steps of all sixteen rows are one
// vector (a one-row dot kernel runs them as a scalar chain, two dependent fma per super-block and row).
// Same integers and steps as rows_block<1>: per sub-block half four vpdpbusd, A += S·sc by vpdpwssd, M from
// the row's bsums as given.
inline __attribute__((always_inline)) void one_row_block(const uint8_t* const rows[kLaneRows], const BlockQ8K& x,
                                                         __m512& acc) {
  const Q4kHeads h = q4k_heads(rows);
  __m512i M = _mm512_setzero_si512();
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) M = dpwssd_bcast(M, twice_byte(h.m, i), &x.bsums[2 * i]);
  const __m512i low4 = _mm512_set1_epi8(0x0F), zero = _mm512_setzero_si512();
  __m512i A = zero;
#pragma GCC unroll 2
  for (int half = 0; half < 2; ++half) {
    __m512i r[kLaneRows];
    q4k_qs_half(rows, half, r);
    // r[8p + i]: group i of sub-blocks 4·half + 2p (low nibbles) and 4·half + 2p + 1 (high).
#pragma GCC unroll 2
    for (int p = 0; p < 2; ++p) {
      const int s = 4 * half + 2 * p;
      const __m512i sc0 = lane_byte(h.sc, s), sc1 = lane_byte(h.sc, s + 1);
      const int8_t* q0 = x.qs + 4 * s;
      const int8_t* q1 = x.qs + 4 * (s + 1);
      __m512i a = zero, b = zero, c = zero, e = zero;
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        const __m512i w0 = r[8 * p + i], w1 = r[8 * p + 4 + i];
        a = dpbusd_bcast(a, _mm512_and_si512(w0, low4), q0 + 32 * i);
        b = dpbusd_bcast(b, _mm512_and_si512(w1, low4), q0 + 32 * (4 + i));
        c = dpbusd_bcast(c, _mm512_and_si512(_mm512_srli_epi16(w0, 4), low4), q1 + 32 * i);
        e = dpbusd_bcast(e, _mm512_and_si512(_mm512_srli_epi16(w1, 4), low4), q1 + 32 * (4 + i));
      }
      A = _mm512_dpwssd_epi32(A, a, sc0);
      A = _mm512_dpwssd_epi32(A, b, sc0);
      A = _mm512_dpwssd_epi32(A, c, sc1);
      A = _mm512_dpwssd_epi32(A, e, sc1);
    }
  }
  const __m512 dx = _mm512_set1_ps(x.d);
  acc = _mm512_fmadd_ps(_mm512_mul_ps(h.d, dx), _mm512_cvtepi32_ps(A), acc);
  acc = _mm512_fnmadd_ps(_mm512_mul_ps(h.dmin, dx), _mm512_cvtepi32_ps(M), acc);
}

// One activation row against weight rows [o_begin, o_end) of a Q4_K matrix, sixteen at a time. Besides the
// next super-block of the sixteen rows, each step requests its share of the next sixteen rows' bytes (one
// contiguous stretch), so the stream runs ahead of the strided reads.
void rowlanes_one_row_q4k(const WeightMatrix& w, const BlockQ8K* x, int64_t o_begin, int64_t o_end, float* y) {
  const int64_t n_sb = w.cols / kQK_K;
  const uint64_t chunk_bytes = uint64_t(kLaneRows) * w.row_stride, lines = (chunk_bytes + 63) / 64;
  const uint64_t per_step = (lines + uint64_t(n_sb) - 1) / uint64_t(n_sb);
  for (int64_t o = o_begin; o < o_end; o += kLaneRows) {
    const int valid = int(std::min<int64_t>(kLaneRows, o_end - o));
    const uint8_t* first = w.data + uint64_t(o) * w.row_stride;
    const uintptr_t next_chunk = reinterpret_cast<uintptr_t>(first) + chunk_bytes;
    const uint8_t* rows[kLaneRows];
    for (int r = 0; r < kLaneRows; ++r) rows[r] = first + uint64_t(std::min(r, valid - 1)) * w.row_stride;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t k = 0; k < n_sb; ++k) {
      for (uint64_t l = uint64_t(k) * per_step; l < std::min(lines, uint64_t(k + 1) * per_step); ++l)
        _mm_prefetch(reinterpret_cast<const char*>(next_chunk + 64 * l), _MM_HINT_T0);
      const uint8_t* block_rows[kLaneRows];
      for (int r = 0; r < kLaneRows; ++r) block_rows[r] = rows[r] + uint64_t(k) * sizeof(BlockQ4K);
      if (k + 1 < n_sb) prefetch_next<BlockQ4K>(block_rows, sizeof(BlockQ4K));
      one_row_block(block_rows, x[k], acc);
    }
    _mm512_mask_storeu_ps(y + o, __mmask16((1u << valid) - 1u), acc);
  }
}

template <typename Block, typename Prepared>
void rowlanes_rows(const WeightMatrix& w, const uint8_t* xprep, uint64_t x_stride, int64_t n_rows,
                   int64_t o_begin, int64_t o_end, float* const* y) {
  const int64_t n_sb = w.cols / kQK_K;
  // As few passes over the weights as keep one pass's activation rows in L2, of equal size.
  const int64_t max_per_pass = std::clamp<int64_t>(int64_t(rowlanes_pass_bytes() / x_stride), kGroupRows, n_rows);
  const int64_t passes = (n_rows + max_per_pass - 1) / max_per_pass;
  const int64_t per_pass = (n_rows + passes - 1) / passes;
  std::vector<Acc16> acc(static_cast<size_t>(per_pass));
  Prepared P;

  for (int64_t t0 = 0; t0 < n_rows; t0 += per_pass) {
    const int64_t t1 = std::min(n_rows, t0 + per_pass);
    for (int64_t o = o_begin; o < o_end; o += kLaneRows) {
      const int valid = int(std::min<int64_t>(kLaneRows, o_end - o));
      const uint8_t* first = w.data + uint64_t(o) * w.row_stride;
      const uint8_t* rows[kLaneRows];
      for (int r = 0; r < kLaneRows; ++r) rows[r] = first + uint64_t(std::min(r, valid - 1)) * w.row_stride;
      std::fill(acc.begin(), acc.end(), Acc16{_mm512_setzero_ps()});
      for (int64_t k = 0; k < n_sb; ++k) {
        const uint8_t* block_rows[kLaneRows];
        for (int r = 0; r < kLaneRows; ++r) block_rows[r] = rows[r] + uint64_t(k) * sizeof(Block);
        prefetch_next<Block>(block_rows, k + 1 < n_sb ? sizeof(Block)
                                                      : uintptr_t(kLaneRows) * w.row_stride - uintptr_t(k) * sizeof(Block));
        prepare_block(block_rows, &P);
        int64_t t = t0;
        for (; t + kGroupRows <= t1; t += kGroupRows) {
          const BlockQ8K* x[kGroupRows];
          for (int j = 0; j < kGroupRows; ++j) x[j] = q8k_block(xprep, x_stride, t + j, k);
          rows_block<kGroupRows>(P, x, &acc[size_t(t - t0)]);
        }
        const BlockQ8K* x[kGroupRows];
        for (int j = 0; j < int(t1 - t); ++j) x[j] = q8k_block(xprep, x_stride, t + j, k);
        rows_tail<kGroupRows - 1>(int(t1 - t), P, x, &acc[size_t(t - t0)]);
      }
      const __mmask16 keep = __mmask16((1u << valid) - 1u);
      for (int64_t t = t0; t < t1; ++t) _mm512_mask_storeu_ps(y[t] + o, keep, acc[size_t(t - t0)].v);
    }
  }
}

}  // namespace

void rowlanes_matmul_rows(const WeightMatrix& w, const uint8_t* xprep, uint64_t x_stride, int64_t n_rows,
                          int64_t o_begin, int64_t o_end, float* const* y) {
  ESSAIM_CHECK(rowlanes_matmul_type(w.type) && w.cols % kQK_K == 0);
  if (n_rows <= 0 || o_end <= o_begin) return;
  if (w.type == GgmlType::Q4_K && n_rows == 1)
    return rowlanes_one_row_q4k(w, reinterpret_cast<const BlockQ8K*>(xprep), o_begin, o_end, y[0]);
  if (w.type == GgmlType::Q4_K) return rowlanes_rows<BlockQ4K, RowLanesQ4k>(w, xprep, x_stride, n_rows, o_begin, o_end, y);
  rowlanes_rows<BlockQ6K, RowLanesQ6k>(w, xprep, x_stride, n_rows, o_begin, o_end, y);
}

}  // namespace essaim
