// AVX-512 (F, BW, VL, VNNI) Q4_K / Q5_K dot products, bit-identical to dot_scalar.cpp.
//
// The canonical order keeps no f32 lanes: per row and super-block only the exact integers
// A = Σ_s sc[s]·S_s (S_s = Σ_i q·q8 over sub-block s) and M = Σ_g bsums[g]·m[g/2] are needed, then two fused
// f32 steps. So the activations are transposed once (prepare_q8k_q45k_avx512: 4-byte group i of sub-block s
// at bytes 32i + 4s) and every weight super-block is arranged the same way once for all rows of the call:
// four zmm W_p, dword e holding group 2p + e/8 of sub-block e % 8. Per row, four vpdpbusd chained into one
// accumulator leave the two 16-element halves of S_s in dwords s and s + 8. Two rows at a time the scales
// are applied (Q4_K: the halves fit i16, one vpermt2w pairs them as words and vpmaddwd scales and adds;
// Q5_K: halves added, vpmulld), and one transpose-add tree shared by all rows of the call forms every A and,
// from bsums·mins, every M. The f32 steps then run for all rows at once, row j's acc in one element of a
// ymm. One row (decode) shares the same work across up to eight consecutive super-blocks instead, then
// runs the scalar f32 chain block by block. Usage: through the kernel table (kernel_traits.h).
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/blocks.h"
#include "kernels/dot_kernels.h"
#include "kernels/q45k_arrange_avx512.h"

namespace essaim {

// q45k_avx512: per super-block the 8x8 matrix of 4-byte groups transposed — group i (elements 4i..4i+3) of
// sub-block s moves from byte 32s + 4i to byte 32i + 4s — so bytes 64p..64p+63 hold groups 2p, 2p+1 of all
// eight sub-blocks; d and bsums stay where they are.
void prepare_q8k_q45k_avx512(const void* x, void* out, int64_t n) {
  const auto* in = static_cast<const BlockQ8K*>(x);
  auto* o = static_cast<BlockQ8K*>(out);
  for (int64_t k = 0; k < n / kQK_K; ++k) {
    o[k] = in[k];
    for (int s = 0; s < 8; ++s)
      for (int i = 0; i < 8; ++i) std::memcpy(o[k].qs + 32 * i + 4 * s, in[k].qs + 32 * s + 4 * i, 4);
  }
}

namespace {

__m512i load512(const void* p) { return _mm512_loadu_si512(p); }
__m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// S_s of one activation super-block (q45k_avx512 layout) in dwords s and s + 8: four vpdpbusd, one chain.
// Each dword sums 16 products of at most 31·128: exact.
inline __m512i q45k_sub_sums(const Q45kWeights& wt, const int8_t* q8) {
  __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wt.w[0], load512(q8));
  s = _mm512_dpbusd_epi32(s, wt.w[1], load512(q8 + 64));
  s = _mm512_dpbusd_epi32(s, wt.w[2], load512(q8 + 128));
  return _mm512_dpbusd_epi32(s, wt.w[3], load512(q8 + 192));
}

// [sc[s]·S_s of a (s = 0..7) | the same of b] from two such sums and sc (lower 256 bits a's scales, upper
// b's). Q4_K: each dword of a sum covers 16 elements, |.| <= 16·15·128 < 2^15, so the low words of dwords s
// and s + 8 of both rows are gathered as word pairs by one vpermt2w and vpmaddwd applies the scale to
// both halves and adds them. Q5_K (|.| <= 16·31·128 does not fit i16): the halves are added as i32 and
// multiplied by vpmulld.
template <bool kWords>
inline __m512i scaled_pair(__m512i a, __m512i b, __m512i sc, const Q45kIndex& ix) {
  if constexpr (!kWords) {
    const __m512i f = _mm512_add_epi32(_mm512_shuffle_i64x2(a, b, 0x44), _mm512_shuffle_i64x2(a, b, 0xEE));
    return _mm512_mullo_epi32(f, sc);
  } else {
    return _mm512_madd_epi16(_mm512_permutex2var_epi16(a, ix.halves, b), sc);
  }
}

// The full sums of the eight-dword halves of NP (1..4) vectors P_r = [u_2r | u_2r+1] (the A partials pa)
// and of the M partials pm alike: element t of the result's lower 256 bits is Σ of half kHalfOrder[t]
// (u_0, u_2, u_4, u_6, u_1, u_3, u_5, u_7) of pa, of its upper 256 bits the same of pm; halves past 2·NP
// are zero. One transpose-add tree: two unpack levels within 128-bit parts, then the parts.
inline constexpr int kHalfOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};
template <int NP>
inline __m512i pair_level(const __m512i p[4], int first) {
  const __m512i z = _mm512_setzero_si512();
  const __m512i b = first + 1 < NP ? p[first + 1] : z;
  return _mm512_add_epi32(_mm512_unpacklo_epi32(p[first], b), _mm512_unpackhi_epi32(p[first], b));
}
template <int NP>
inline __m512i sum_halves_am(const __m512i pa[4], const __m512i pm[4]) {
  const __m512i z = _mm512_setzero_si512();
  const __m512i va0 = pair_level<NP>(pa, 0), vm0 = pair_level<NP>(pm, 0);
  const __m512i va1 = NP > 2 ? pair_level<NP>(pa, 2) : z, vm1 = NP > 2 ? pair_level<NP>(pm, 2) : z;
  // 128-bit part L: element r = the four dwords of part L of P_r summed; parts 0, 1 are u_2r, 2, 3 u_2r+1.
  const __m512i ua = _mm512_add_epi32(_mm512_unpacklo_epi64(va0, va1), _mm512_unpackhi_epi64(va0, va1));
  const __m512i um = _mm512_add_epi32(_mm512_unpacklo_epi64(vm0, vm1), _mm512_unpackhi_epi64(vm0, vm1));
  return _mm512_add_epi32(_mm512_shuffle_i64x2(ua, um, _MM_SHUFFLE(2, 0, 2, 0)),
                          _mm512_shuffle_i64x2(ua, um, _MM_SHUFFLE(3, 1, 3, 1)));
}

inline __m256 upper_ps(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }

const BlockQ8K* q8k_row(const void* x, size_t stride, int j) {
  return reinterpret_cast<const BlockQ8K*>(static_cast<const uint8_t*>(x) + size_t(j) * stride);
}

// NX (1..8) activation rows against one weight row: per super-block the weights are arranged once; every
// row's S_s, then A and M of all rows through sum_halves_am, then the two f32 steps of all rows at once (row
// kHalfOrder[t] in element t): acc = fma(db, f32(A), acc), acc = fma(-dmb, f32(M), acc).
template <typename Block, int NX>
void dot_q45k(int64_t n, const void* w, const void* x, size_t x_stride, float* y) {
  static_assert(NX >= 1 && NX <= 8);
  constexpr int kPairs = (NX + 1) / 2;
  constexpr bool kWords = !std::is_same_v<Block, BlockQ5K>;
  const auto* blocks = static_cast<const Block*>(w);
  const Q45kIndex ix = q45k_index();
  const BlockQ8K* rows[8];
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) rows[j] = q8k_row(x, x_stride, j < NX ? j : 0);
  alignas(64) int64_t offsets[8];
  for (int t = 0; t < 8; ++t) offsets[t] = kHalfOrder[t] < NX ? int64_t(kHalfOrder[t]) * int64_t(x_stride) : 0;
  const __m512i yd_index = _mm512_load_si512(offsets);
  __m256 acc = _mm256_setzero_ps();
  const int64_t nb = n / kQK_K;
  for (int64_t k = 0; k < nb; ++k) {
    // Super-block k of the next weight row in memory, which matmul usually asks for next (as the Q6_K
    // kernel does): with few rows per call the weights come cold. Formed as an integer, since it may lie
    // past the buffer, where a prefetch is harmless.
    const uintptr_t next = reinterpret_cast<uintptr_t>(blocks) + sizeof(Block) * uintptr_t(nb + k);
#pragma GCC unroll 3
    for (uintptr_t o = 0; o < sizeof(Block); o += 64) _mm_prefetch(reinterpret_cast<const char*>(next + o), _MM_HINT_T0);
    const Block& a = blocks[k];
    const Q45kWeights wt = q45k_arrange<Block, kWords>(a, ix);
    __m512i pa[4], pm[4];
#pragma GCC unroll 4
    for (int i = 0; i < kPairs; ++i) {
      const BlockQ8K& ra = rows[2 * i][k];
      const BlockQ8K& rb = rows[2 * i + 1 < NX ? 2 * i + 1 : 2 * i][k];
      const __m512i sa = q45k_sub_sums(wt, ra.qs);
      const __m512i sb = 2 * i + 1 < NX ? q45k_sub_sums(wt, rb.qs) : _mm512_setzero_si512();
      pa[i] = scaled_pair<kWords>(sa, sb, wt.sc, ix);
      const __m512i bs = 2 * i + 1 < NX
                             ? _mm512_inserti64x4(_mm512_castsi256_si512(load256(ra.bsums)), load256(rb.bsums), 1)
                             : _mm512_zextsi256_si512(load256(ra.bsums));
      pm[i] = _mm512_madd_epi16(bs, wt.mins2);
    }
    // y.d of row kHalfOrder[t] in element t (rows past NX read row 0; their results are dropped).
    const __m256 yd = _mm512_i64gather_ps(yd_index, &rows[0][k].d, 1);
    const __m512 am = _mm512_cvtepi32_ps(sum_halves_am<kPairs>(pa, pm));
    acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(a.d)), yd), _mm512_castps512_ps256(am), acc);
    acc = _mm256_fnmadd_ps(_mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(a.dmin)), yd), upper_ps(am), acc);
  }
  alignas(32) float out[8];
  _mm256_store_ps(out, acc);
#pragma GCC unroll 8
  for (int t = 0; t < 8; ++t)
    if (kHalfOrder[t] < NX) y[kHalfOrder[t]] = out[t];
}

// A and M of up to eight consecutive super-blocks k0..k0+nb-1 of one row, block k0 + kHalfOrder[t] in
// element t (the others zero).
template <typename Block, int NB>
inline __m512 one_row_group(const Block* a, const BlockQ8K* b, const Q45kIndex& ix) {
  constexpr int kPairs = (NB + 1) / 2;
  constexpr bool kTimes16 = !std::is_same_v<Block, BlockQ5K>;
  __m512i pa[4], pm[4];
#pragma GCC unroll 4
  for (int i = 0; i < kPairs; ++i) {
    const int k0 = 2 * i, k1 = 2 * i + 1;
    const Q45kWeights w0 = q45k_arrange<Block, false, kTimes16>(a[k0], ix);
    if (k1 < NB) {
      const Q45kWeights w1 = q45k_arrange<Block, false, kTimes16>(a[k1], ix);
      // Both blocks' scales and mins unpacked straight into the pair form (w0.sc, w1.sc etc. go unused).
      uint64_t sc0, m0, sc1, m1;
      q4k_unpack_scales_u64(a[k0].scales, &sc0, &m0);
      q4k_unpack_scales_u64(a[k1].scales, &sc1, &m1);
      __m512i sc = _mm512_cvtepu8_epi32(_mm_set_epi64x(int64_t(sc1), int64_t(sc0)));  // [sc_k0 | sc_k1]
      if constexpr (kTimes16) sc = _mm512_sllv_epi32(sc, ix.even16);
      const __m128i mm = _mm_set_epi64x(int64_t(m1), int64_t(m0));
      const __m512i mins = _mm512_cvtepu8_epi16(_mm256_set_m128i(_mm_unpackhi_epi8(mm, mm), _mm_unpacklo_epi8(mm, mm)));
      pa[i] = scaled_pair<false>(q45k_sub_sums(w0, b[k0].qs), q45k_sub_sums(w1, b[k1].qs), sc, ix);
      pm[i] = _mm512_madd_epi16(
          _mm512_inserti64x4(_mm512_castsi256_si512(load256(b[k0].bsums)), load256(b[k1].bsums), 1), mins);
    } else {
      pa[i] = scaled_pair<false>(q45k_sub_sums(w0, b[k0].qs), _mm512_setzero_si512(), w0.sc, ix);
      pm[i] = _mm512_madd_epi16(_mm512_zextsi256_si512(load256(b[k0].bsums)), w0.mins2);
    }
  }
  __m512i am = sum_halves_am<kPairs>(pa, pm);
  if constexpr (kTimes16) am = _mm512_srav_epi32(am, ix.a_shift);  // 16·A -> A, exact
  return _mm512_cvtepi32_ps(am);
}

// One activation row (decode): the integers of eight super-blocks share one reduction tree; the f32 chain
// then runs block by block in order.
template <typename Block>
void dot_q45k_one_row(int64_t n, const void* w, const void* x, float* y) {
  const auto* a = static_cast<const Block*>(w);
  const auto* b = static_cast<const BlockQ8K*>(x);
  const Q45kIndex ix = q45k_index();
  const int64_t nb = n / kQK_K;
  const int64_t ahead = g_weight_prefetch_bytes.load(std::memory_order_relaxed);
  float acc = 0.0f;
  for (int64_t k = 0; k < nb; k += 8) {
    if (ahead > 0) prefetch_weights_ahead(a + k, 8 * sizeof(Block), ahead);
    __m512 am;
    const int cnt = int(nb - k < 8 ? nb - k : 8);
    switch (cnt) {
      case 8: am = one_row_group<Block, 8>(a + k, b + k, ix); break;
      case 7: am = one_row_group<Block, 7>(a + k, b + k, ix); break;
      case 6: am = one_row_group<Block, 6>(a + k, b + k, ix); break;
      case 5: am = one_row_group<Block, 5>(a + k, b + k, ix); break;
      case 4: am = one_row_group<Block, 4>(a + k, b + k, ix); break;
      case 3: am = one_row_group<Block, 3>(a + k, b + k, ix); break;
      case 2: am = one_row_group<Block, 2>(a + k, b + k, ix); break;
      default: am = one_row_group<Block, 1>(a + k, b + k, ix); break;
    }
    alignas(64) float amf[16];  // A of block k + kHalfOrder[t] in t, its M in 8 + t
    _mm512_store_ps(amf, am);
    constexpr int kSlot[8] = {0, 4, 1, 5, 2, 6, 3, 7};  // element holding block k + j (inverse of kHalfOrder)
    for (int j = 0; j < cnt; ++j) {
      const float db = _cvtsh_ss(a[k + j].d) * b[k + j].d, dmb = _cvtsh_ss(a[k + j].dmin) * b[k + j].d;
      acc = __builtin_fmaf(db, amf[kSlot[j]], acc);
      acc = __builtin_fmaf(-dmb, amf[8 + kSlot[j]], acc);
    }
  }
  *y = acc;
}

}  // namespace

void vec_dot_q4k_q8k_avx512(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  if (nx == 1) return dot_q45k_one_row<BlockQ4K>(n, w, x, y);
  ESSAIM_DISPATCH_NX8(dot_q45k, BlockQ4K)
}
void vec_dot_q5k_q8k_avx512(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  if (nx == 1) return dot_q45k_one_row<BlockQ5K>(n, w, x, y);
  ESSAIM_DISPATCH_NX8(dot_q45k, BlockQ5K)
}

}  // namespace essaim
