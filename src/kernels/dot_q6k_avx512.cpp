// AVX-512 (F, BW, VL, VNNI) Q6_K·Q8_K dot products, bit-identical to dot_scalar.cpp's dot_q6k.
//
// The canonical order asks only for the exact integer A = Σ_s sc[s]·Σ_i (q6 − 32)·q8 of each row and
// super-block, then acc = fma(d·y.d, f32(A), acc). Here
//     A = Σ_s sc[s]·U_s − 32·Σ_s sc[s]·bsums[s],   U_s = Σ_{i<16} q6[16s+i]·q8[16s+i]
// with q6 the unsigned 6-bit value (0..63, vpdpbusd's unsigned operand) and bsums[s] = Σ q8 of sub-block s.
// Weights and activations are both arranged "by group": vector i (i = 0..3, 64 bytes) holds in dword p
// the elements 4i..4i+3 of sub-block s(p) = 4(p % 4) + p / 4 (a 4×4 dword transpose in each 128-bit lane
// of the element order). An accumulator started at −32·bsums (the prepared bsums, in that order) and four
// vpdpbusd then give S_s = U_s − 32·bsums[s] of all 16 sub-blocks, one vpmulld applies the scales (in the
// same order), and a transpose-add tree shared by all rows of the call sums the 16 products of every row
// at once; the f32 step runs for all rows in one fma. The weight block is decoded once per call (up to
// eight rows). docs/kernels.md ("AVX-512 Q6_K") gives the bounds.
#include <immintrin.h>

#include <cstdint>

#include "kernels/blocks.h"
#include "kernels/dot_kernels.h"
#include "kernels/q6k_arrange_avx512.h"

namespace essaim {
namespace {

__m512i load512(const void* p) { return _mm512_loadu_si512(p); }
__m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// The sixteen sc[s]·S_s, S_s = U_s − 32·bsums[s], of one row and super-block (activations prepared by
// group, their bsums negated in dword order): the accumulator starts at −32·bsums[s(p)] (|·| ≤ 32·2048)
// and four vpdpbusd add U (≤ 16·63·128 < 2^17 per dword), leaving the exact S (|S| ≤ 16·128·32 = 2^16);
// |sc·S| ≤ 2^23 and their sum, A, stays below 2^27 in any grouping.
inline __m512i q6k_row_products(const Q6kWeights& wt, const BlockQ8K& b) {
  __m512i u = _mm512_slli_epi32(_mm512_cvtepi16_epi32(load256(b.bsums)), 5);
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) u = _mm512_dpbusd_epi32(u, wt.w[i], load512(b.qs + 64 * i));
  return _mm512_mullo_epi32(u, wt.scales);
}

// [Σ p[0], …, Σ p[NX−1], 0…]: the sums of the 16 dwords of each of NX vectors, by one transpose-add tree
// (stage 1 pairs rows by dwords, stage 2 by qwords, then the 128-bit lanes). Integer adds: exact.
template <int NX>
inline __m256i sum_rows(const __m512i p[8]) {
  static_assert(NX >= 1 && NX <= 8);
  constexpr int kT = (NX + 1) / 2, kU = (NX + 3) / 4;
  const __m512i zero = _mm512_setzero_si512();
  __m512i t[4], u[2];
#pragma GCC unroll 4
  for (int q = 0; q < kT; ++q) {  // dword 2d + r of each lane: row 2q + r
    const __m512i a = p[2 * q], b = 2 * q + 1 < NX ? p[2 * q + 1] : zero;
    t[q] = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
  }
#pragma GCC unroll 2
  for (int r = 0; r < kU; ++r) {  // dword d of each lane: row 4r + d
    const __m512i a = t[2 * r], b = 2 * r + 1 < kT ? t[2 * r + 1] : zero;
    u[r] = _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
  }
  if constexpr (kU == 1) {
    const __m512i v = _mm512_add_epi32(u[0], _mm512_shuffle_i64x2(u[0], u[0], _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm256_zextsi128_si256(_mm_add_epi32(_mm512_castsi512_si128(v), _mm512_extracti32x4_epi32(v, 1)));
  } else {
    const __m512i v = _mm512_add_epi32(_mm512_shuffle_i64x2(u[0], u[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                       _mm512_shuffle_i64x2(u[0], u[1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512i c = _mm512_shuffle_i64x2(v, v, _MM_SHUFFLE(3, 1, 2, 0));  // [rows 0-3 | 4-7 | 0-3 | 4-7]
    return _mm256_add_epi32(_mm512_castsi512_si256(c), _mm512_extracti64x4_epi64(c, 1));
  }
}

const BlockQ8K* q8k_row(const void* x, size_t stride, int j) {
  return reinterpret_cast<const BlockQ8K*>(static_cast<const uint8_t*>(x) + size_t(j) * stride);
}

// NX (1..8) rows: per super-block the weights are decoded once, every row forms its sixteen products,
// one tree gives A of all rows, and acc_j = fma(d·y_j.d, f32(A_j), acc_j) runs for all rows in one fma
// (row j in element j; the rows beyond NX compute fma(0, 0, 0) and are not stored).
template <int NX>
void dot_q6k(int64_t n, const void* w, const void* x, size_t x_stride, float* y) {
  static_assert(NX >= 1 && NX <= 8);
  const auto* blocks = static_cast<const BlockQ6K*>(w);
  const BlockQ8K* rows[NX];
#pragma GCC unroll 8
  for (int j = 0; j < NX; ++j) rows[j] = q8k_row(x, x_stride, j);
  __m256 acc = _mm256_setzero_ps();
  const int64_t nb = n / kQK_K;
  for (int64_t k = 0; k < nb; ++k) {
    // Super-block k of the next weight row in memory, which matmul usually asks for next: the weights
    // are read once per call and come cold from memory when few rows share them. The address is formed
    // as an integer (it may lie past the buffer, where a prefetch is harmless).
    const uintptr_t next = reinterpret_cast<uintptr_t>(blocks) + sizeof(BlockQ6K) * uintptr_t(nb + k);
#pragma GCC unroll 4
    for (uintptr_t o = 0; o < 256; o += 64) _mm_prefetch(reinterpret_cast<const char*>(next + o), _MM_HINT_T0);
    const Q6kWeights wt = q6k_weights(blocks[k]);
    __m512i p[8];
    alignas(32) float yd[8] = {};
#pragma GCC unroll 8
    for (int j = 0; j < NX; ++j) {
      p[j] = q6k_row_products(wt, rows[j][k]);
      yd[j] = rows[j][k].d;
    }
    const __m256 A = _mm256_cvtepi32_ps(sum_rows<NX>(p));
    const __m256 dd = _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(blocks[k].d)), _mm256_load_ps(yd));
    acc = _mm256_fmadd_ps(dd, A, acc);
  }
  _mm256_mask_storeu_ps(y, __mmask8((1u << NX) - 1), acc);
}

// One row (decode): B consecutive super-blocks share one tree ([A_k .. A_k+B−1]); the f32 steps then run
// block by block in order, acc = fma(d_k·y_k.d, f32(A_k), acc).
template <int B>
inline float one_row_blocks(const BlockQ6K* a, const BlockQ8K* b, float acc) {
  __m512i p[8];
#pragma GCC unroll 4
  for (int i = 0; i < B; ++i) p[i] = q6k_row_products(q6k_weights(a[i]), b[i]);
  alignas(16) float A[4];
  _mm_store_ps(A, _mm_cvtepi32_ps(_mm256_castsi256_si128(sum_rows<B>(p))));
#pragma GCC unroll 4
  for (int i = 0; i < B; ++i) acc = __builtin_fmaf(_cvtsh_ss(a[i].d) * b[i].d, A[i], acc);
  return acc;
}

void dot_q6k_one_row(int64_t n, const void* w, const void* x, float* y) {
  const auto* a = static_cast<const BlockQ6K*>(w);
  const auto* b = static_cast<const BlockQ8K*>(x);
  const int64_t nb = n / kQK_K;
  float acc = 0.0f;
  int64_t k = 0;
  const int64_t ahead = g_weight_prefetch_bytes.load(std::memory_order_relaxed);
  for (; k + 4 <= nb; k += 4) {
    if (ahead > 0) prefetch_weights_ahead(a + k, 4 * sizeof(BlockQ6K), ahead);
    acc = one_row_blocks<4>(a + k, b + k, acc);
  }
  switch (nb - k) {
    case 3: acc = one_row_blocks<3>(a + k, b + k, acc); break;
    case 2: acc = one_row_blocks<2>(a + k, b + k, acc); break;
    case 1: acc = one_row_blocks<1>(a + k, b + k, acc); break;
    default: break;
  }
  *y = acc;
}

}  // namespace

// by_group on the activations: per super-block, qs as four 64-byte vectors, dword p of vector i holding
// elements 4i..4i+3 of sub-block 4(p % 4) + p / 4 (the arrangement q6k_weights gives the weights). d is
// copied; bsums[p] becomes −Σ q8 of sub-block s(p), recomputed from qs: the negation and order of the
// input's bsums for every row the Q8_K quantiser writes, and consistent with qs whatever the input held
// (the scalar reference reads only qs).
void prepare_q8k_q6k_avx512(const void* x, void* out, int64_t n) {
  const auto* in = static_cast<const BlockQ8K*>(x);
  auto* o = static_cast<BlockQ8K*>(out);
  for (int64_t k = 0; k < n / kQK_K; ++k) {
    o[k].d = in[k].d;
    __m512i e[4], g[4];
#pragma GCC unroll 4
    for (int m = 0; m < 4; ++m) e[m] = load512(in[k].qs + 64 * m);
    by_group(e, g);
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) _mm512_storeu_si512(o[k].qs + 64 * i, g[i]);
    for (int p = 0; p < kQK_K / 16; ++p) {
      const int s = 4 * (p % 4) + p / 4;
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += in[k].qs[16 * s + i];
      o[k].bsums[p] = int16_t(-sum);
    }
  }
}

void vec_dot_q6k_q8k_avx512(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  if (nx == 1) return dot_q6k_one_row(n, w, x, y);
  ESSAIM_DISPATCH_NX8(dot_q6k)
}

}  // namespace essaim
