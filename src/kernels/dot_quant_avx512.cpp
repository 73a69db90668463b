// AVX-512 (F, BW, VL, VNNI) dot products of the quantised formats, bit-identical to dot_scalar.cpp.
//
// Q6_K: the lane bookkeeping of dot_quant_avx2.cpp at twice the width. After the in-lane pair shuffle
// each 128-bit quarter holds lanes 0..7 of one 16-element run and maddubs forms same-lane pair sums; the
// weight words of two sub-blocks are interleaved and their quarters regrouped once per super-block, and
// the activations arrive arranged the same way (prepare_q8k_q6k_avx512), so vpdpwssd applies both
// sub-blocks' scales into one i32 register per row whose element e is always lane e % 8.
// Q4_K/Q5_K live in dot_q45k_avx512.cpp. Q8_0 uses vpdpbusd on whole blocks, whose reference sum is one
// integer. A Q6_K weight block is decoded once for up to eight activation rows, which then run two at a
// time; two rows' lanes share one zmm for the f32 steps, and each row's values go through exactly the
// reference's operations. With one row (decode) and a CPU with AVX-512 VBMI, Q6_K arranges the weight
// bytes with vpermi2b instead of chains of shuffles: same registers, same bits.
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

// q6k_avx512: pair shuffle of every 16 bytes, then per 128 elements the words of the two 64-byte groups
// (sub-blocks 8h+t and 8h+4+t in quarter t) interleaved, L = unpacklo and H = unpackhi, and regrouped as
// [L0 H0 L1 H1] [L2 H2 L3 H3], the arrangement q6k_decode gives the weights; finally every byte offset by
// +128 (x ^ 0x80 = x + 128 as an unsigned byte), the unsigned operand of maddubs.
void prepare_q8k_q6k_avx512(const void* x, void* out, int64_t n) {
  const auto* in = static_cast<const BlockQ8K*>(x);
  auto* o = static_cast<BlockQ8K*>(out);
  const __m512i bias = _mm512_set1_epi8(char(0x80));
  const __m512i quarters_a = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
  const __m512i quarters_b = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
  for (int64_t k = 0; k < n / kQK_K; ++k) {
    o[k] = in[k];
    for (int half = 0; half < 2; ++half) {
      const int8_t* src = in[k].qs + 128 * half;
      const __m512i a = pairs(load512(src)), b = pairs(load512(src + 64));
      const __m512i lo = _mm512_unpacklo_epi16(a, b), hi = _mm512_unpackhi_epi16(a, b);
      _mm512_storeu_si512(o[k].qs + 128 * half,
                          _mm512_xor_si512(_mm512_permutex2var_epi64(lo, quarters_a, hi), bias));
      _mm512_storeu_si512(o[k].qs + 128 * half + 64,
                          _mm512_xor_si512(_mm512_permutex2var_epi64(lo, quarters_b, hi), bias));
    }
  }
}

namespace {

// [A_a (lanes 0..7) | A_b (lanes 0..7)] from two Q6_K sums (lane l in elements l and l + 8).
inline __m512i fold_halves_two(__m512i a, __m512i b) {
  return _mm512_add_epi32(_mm512_shuffle_i64x2(a, b, 0x44), _mm512_shuffle_i64x2(a, b, 0xEE));
}

// ---- AVX-512 VBMI one-row forms -------------------------------------------------------------------

// Two 64-byte vpermi2b index vectors (Q6_K's one-row decode).
struct VbmiRunIndex {
  alignas(64) uint8_t idx[2][64];
};

// Whether the one-row VBMI forms run: -1 until first asked (CPUID leaf 7, ECX bit 1; the kernel
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

// ---- Q6_K ----------------------------------------------------------------------------------------------

// One Q6_K weight super-block decoded into the q6k_avx512 arrangement: per 128 elements the signed
// 6-bit values of sub-blocks 8h+t and 8h+4+t interleaved by words (L = unpacklo, H = unpackhi of the
// two 64-byte groups) and regrouped as [L0 H0 L1 H1], [L2 H2 L3 H3] — as prepare_q8k_q6k_avx512
// arranges the activations — kept signed (the activations are the unsigned maddubs operand, offset by
// +128; bias_sums removes the offset's term);
// scale[i] holds each quarter's (sc_a, sc_b) word pair.
struct Q6kWeights {
  __m512i q[4], scale[4];  // q - 32, signed
  __m512i bias_sums;       // -Σ_s sc[s]·Σ 128·(q-32) per lane element (see q6k_row_sums)
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
    r.q[2 * h] = sa;
    r.q[2 * h + 1] = sb;
    // i32 t of sp: (sc[8h+t], sc[8h+4+t]), the pair of quarter t's data; sa holds quarters 0, 0, 1, 1 of
    // that data, sb quarters 2, 2, 3, 3.
    const __m128i s16 = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a.scales + 8 * h)));
    const __m512i sp = _mm512_castsi128_si512(_mm_unpacklo_epi16(s16, _mm_srli_si128(s16, 8)));
    r.scale[2 * h] = _mm512_permutexvar_epi32(pair_a, sp);
    r.scale[2 * h + 1] = _mm512_permutexvar_epi32(pair_b, sp);
  }
  // The activations arrive offset by +128 (prepare_q8k_q6k_avx512), which adds 128·Σ sc·(q - 32) to
  // every sum; that weight-only term, formed the same way, starts each row's accumulator negated.
  const __m512i b128 = _mm512_set1_epi8(char(0x80));
  __m512i t[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i)
    t[i & 1] = _mm512_dpwssd_epi32(t[i & 1], _mm512_maddubs_epi16(b128, r.q[i]), r.scale[i]);
  r.bias_sums = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_add_epi32(t[0], t[1]));
  return r;
}

// Σ_s sc[s]·Σ (q-32)·q8 of one activation super-block (q6k_avx512 layout): lane l in elements l, l+8.
inline __m512i q6k_row_sums(const Q6kWeights& wt, const int8_t* q8) {
  __m512i s[2] = {wt.bias_sums, _mm512_setzero_si512()};
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    // (y + 128)·(q - 32), pair sums within [-16320, 15810]: no saturation.
    const __m512i p = _mm512_maddubs_epi16(load512(q8 + 64 * i), wt.q[i]);
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


// ---- Q6_K one row with AVX-512 VBMI ---------------------------------------------------------------------

// vpermi2b indices giving q6k_decode's q[2h] ([0]) and q[2h + 1] ([1]) of one half from the 6-bit values
// in element order (s01 = elements 0..63, s23 = 64..127 of the half; 64 and up select s23): the pair
// shuffle, the word interleave and the quarter regrouping of q6k_decode composed into one byte permutation.
constexpr VbmiRunIndex make_vbmi_q6k_index() {
  auto pair_src = [](int i) { return 16 * (i / 16) + (i % 16) / 2 + 8 * (i % 2); };  // pairs16
  // unpack{lo,hi}_epi16(A, B) byte o of 128-bit lane L: (from B?, byte of A/B)
  auto unpack_src = [](bool high, int o, int* from_b) {
    const int lane = o / 16, w = (o % 16) / 4, b = o % 2;
    *from_b = (o % 4) >= 2;
    return 16 * lane + (high ? 8 : 0) + 2 * w + b;
  };
  constexpr int kQuarters[2][8] = {{0, 1, 8, 9, 2, 3, 10, 11}, {4, 5, 12, 13, 6, 7, 14, 15}};
  VbmiRunIndex t{};
  for (int e = 0; e < 2; ++e)
    for (int o = 0; o < 64; ++o) {
      const int q = kQuarters[e][o / 8];  // qword of lo (q < 8) or hi (q >= 8)
      const int in_unpack = 8 * (q % 8) + o % 8;
      int from_b = 0;
      const int ab = unpack_src(q >= 8, in_unpack, &from_b);
      t.idx[e][o] = uint8_t(64 * from_b + pair_src(ab));
    }
  return t;
}
constexpr VbmiRunIndex kVbmiQ6k = make_vbmi_q6k_index();

// q6k_decode without the pair shuffles, the 6-bit values arranged by two vpermi2b per half: the same
// registers as q6k_decode, the bias term formed by the same instructions.
__attribute__((target("avx512vbmi"))) inline Q6kWeights q6k_decode_vbmi(const BlockQ6K& a, __m512i ia,
                                                                          __m512i ib) {
  const __m512i low4 = _mm512_set1_epi8(0x0F), bits45 = _mm512_set1_epi8(0x30), bias = _mm512_set1_epi8(32);
  const __m512i rot01 = join(_mm256_set1_epi32(4), _mm256_set1_epi32(2));
  const __m512i rot23 = join(_mm256_set1_epi32(0), _mm256_set1_epi32(30));
  const __m512i pair_a = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  const __m512i pair_b = _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  Q6kWeights r;
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    const __m512i ql = load512(a.ql + 64 * h);
    const __m512i qh = _mm512_broadcast_i64x4(load256(a.qh + 32 * h));
    const __m512i hi01 = _mm512_and_si512(_mm512_rolv_epi32(qh, rot01), bits45);
    const __m512i hi23 = _mm512_and_si512(_mm512_rolv_epi32(qh, rot23), bits45);
    const __m512i g01 = _mm512_or_si512(_mm512_and_si512(ql, low4), hi01);
    const __m512i g23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4), hi23);
    const __m512i s01 = _mm512_sub_epi8(g01, bias), s23 = _mm512_sub_epi8(g23, bias);
    r.q[2 * h] = _mm512_permutex2var_epi8(s01, ia, s23);
    r.q[2 * h + 1] = _mm512_permutex2var_epi8(s01, ib, s23);
    const __m128i s16 = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a.scales + 8 * h)));
    const __m512i sp = _mm512_castsi128_si512(_mm_unpacklo_epi16(s16, _mm_srli_si128(s16, 8)));
    r.scale[2 * h] = _mm512_permutexvar_epi32(pair_a, sp);
    r.scale[2 * h + 1] = _mm512_permutexvar_epi32(pair_b, sp);
  }
  const __m512i b128 = _mm512_set1_epi8(char(0x80));
  __m512i t[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i)
    t[i & 1] = _mm512_dpwssd_epi32(t[i & 1], _mm512_maddubs_epi16(b128, r.q[i]), r.scale[i]);
  r.bias_sums = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_add_epi32(t[0], t[1]));
  return r;
}

// dot_q6k<1> with q6k_decode_vbmi, and two super-blocks folded at once ([A_k | A_k+1]); the f32 steps
// stay block by block: lane = lane + (d_k·y_k.d)·f32(A_k), then k + 1.
__attribute__((target("avx512vbmi"))) void dot_q6k_one_row_vbmi(int64_t n, const void* w, const void* x,
                                                                 float* y) {
  const auto* a = static_cast<const BlockQ6K*>(w);
  const auto* b = static_cast<const BlockQ8K*>(x);
  const __m512i ia = _mm512_load_si512(kVbmiQ6k.idx[0]), ib = _mm512_load_si512(kVbmiQ6k.idx[1]);
  __m256 lane = _mm256_setzero_ps();
  const int64_t nb = n / kQK_K;
  int64_t k = 0;
  for (; k + 2 <= nb; k += 2) {
    const Q6kWeights w0 = q6k_decode_vbmi(a[k], ia, ib), w1 = q6k_decode_vbmi(a[k + 1], ia, ib);
    const __m512 A = _mm512_cvtepi32_ps(fold_halves_two(q6k_row_sums(w0, b[k].qs), q6k_row_sums(w1, b[k + 1].qs)));
    const float dd0 = _cvtsh_ss(a[k].d) * b[k].d, dd1 = _cvtsh_ss(a[k + 1].d) * b[k + 1].d;
    lane = _mm256_add_ps(lane, _mm256_mul_ps(_mm256_set1_ps(dd0), _mm512_castps512_ps256(A)));
    lane = _mm256_add_ps(
        lane, _mm256_mul_ps(_mm256_set1_ps(dd1), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(A), 1))));
  }
  for (; k < nb; ++k) {  // an odd last block
    const Q6kWeights w0 = q6k_decode_vbmi(a[k], ia, ib);
    const __m512 A = _mm512_cvtepi32_ps(fold_halves_two(q6k_row_sums(w0, b[k].qs), _mm512_setzero_si512()));
    const float dd = _cvtsh_ss(a[k].d) * b[k].d;
    lane = _mm256_add_ps(lane, _mm256_mul_ps(_mm256_set1_ps(dd), _mm512_castps512_ps256(A)));
  }
  alignas(32) float l8[8];
  _mm256_store_ps(l8, lane);
  *y = fold_lanes8(0.0f, l8);
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
void vec_dot_q6k_q8k_avx512(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  if (nx == 1 && use_vbmi()) return dot_q6k_one_row_vbmi(n, w, x, y);
  ESSAIM_DISPATCH_NX8(dot_q6k)
}

}  // namespace essaim

namespace essaim {
bool set_avx512_vbmi_kernels(bool on) {
  const bool was = use_vbmi();
  g_q4k_vbmi.store(on && cpu_has_vbmi() ? 1 : 0);
  return was;
}
}  // namespace essaim
