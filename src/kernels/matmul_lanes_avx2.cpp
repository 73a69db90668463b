// Q4_K and Q6_K products of several activation rows on AVX2, one activation row per 32-bit lane,
// bit-identical to the dot kernels (matmul_lanes_avx2.h; docs/kernels.md, "AVX2 lane-per-row products").
//
// The dot kernels keep one weight row in a vector and reduce each activation row's partial sums across
// lanes once per super-block (trees of hadd), and decode each weight block once per eight activation rows.
// Here the roles turn: per super-block, eight activation rows are transposed into lanes and each dword of
// an unpacked weight row meets all eight at once, so every lane's sums are one row's. The weight row's 32
// bytes of a chunk are loaded once and shuffled in-lane (dword i of each 128-bit half to all four of its
// lanes) against two quads of four rows whose lanes hold the matching dwords (LaneBlock). maddubs forms
// two products per lane and 16-bit word; words of one scale add up while they stay exact for any
// activation bytes (Q4_K: eight maddubs, |Σ| <= 8·2·15·128 = 30 720; Q6_K: two, 2·2·63·128 = 32 256), and
// one madd by the scales turns them into int32. Each row's two halves are added once per super-block.
// Groups of eight go in pairs where they can: sixteen rows (four quads) per LaneBlock<2>, each weight
// shuffle feeding four maddubs instead of two (Q4_K: one chain of words per quad, 8 shuffles and no chain
// add fewer per 1024 multiply-adds); an odd last group alone in a LaneBlock<1>.
//
// The weights are unpacked into the prepared activation order of their format, so dword i of a weight row
// and dword i of an activation row hold the same four elements:
//   Q4_K (prepare_q8k_q45k_avx2): sub-blocks 2p and 2p+1 interleaved by 16-bit words, so a dword's low word
//     belongs to 2p and its high word to 2p+1 — one madd by (sc[2p], sc[2p+1]) scales both; M from the
//     rows' bsums as given, as the reference reads them (four madd of pair sums where every |bsums| <= 16383,
//     as in every row essaim quantises; eight madd of the bsums themselves otherwise).
//   Q6_K (prepare_q8k_q6k_avx2): the unsigned 6-bit values, each 16-byte half one sub-block of 16, so
//     the low lanes of a chunk's shuffles meet sub-block 2u and the high lanes 2u+1; the -32 offset is
//     32·Σ sc·bsums with the bsums the prepare recomputed from qs (the reference reads only qs).
#include "kernels/matmul_lanes_avx2.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/status.h"
#include "kernels/blocks.h"
#include "kernels/kernel_traits.h"
#include "kernels/kquant_unpack_avx2.h"

namespace essaim {
namespace {

constexpr int kLanes = 8;         // activation rows per vector
constexpr int kMaxChunkRows = 16;  // most weight rows per chunk (one super-block of each unpacked at a time: 4.7 KB)

// One super-block of 8·kH activation rows in lanes (rows past the end of the batch are zeros), as 2·kH
// quads of four rows: q[u][Q][i] holds, in lane l, dword 8u + i of row 4Q + l and, in lane 4 + l, dword
// 8u + 4 + i of the same row — what the in-lane dword shuffle i of a weight row's chunk u (bytes 32u ..
// 32u + 31) meets. Each row's A then sits in lanes l and 4 + l of its quad, added once per super-block.
// Half h (rows 8h .. 8h + 7) has its own bsums and d vectors.
template <int kH>
struct alignas(32) LaneBlock {
  __m256i q[8][2 * kH][4];
  __m256i b[kH][8];   // lane j of b[h][i]: bsums[2i] | bsums[2i+1] << 16 of row 8h + j
  __m256i bb[kH][4];  // lane j of bb[h][t]: B[2t] | B[2t+1] << 16, B[s] = bsums[2s] + bsums[2s+1] (when sums_fit)
  __m256 d[kH];       // lane j: row 8h + j's d
  bool sums_fit;  // every |bsums| <= 16383, so every B is a 16-bit word (true for every row essaim quantises)
};

// One super-block of a Q4_K weight row, unpacked.
struct alignas(32) Q4kWeights {
  uint8_t q[256];    // the values 0..15, in the prepared activation order
  int32_t scale[4];  // pair p: sc[2p] | sc[2p+1] << 16 (the words of a dword: sub-blocks 2p, 2p+1)
  int32_t min2[4];   // m[2t] | m[2t+1] << 16 (against B[2t], B[2t+1]; m[s] alone where the pair sums overflow)
  float d, dmin;
};

// One super-block of a Q6_K weight row, unpacked.
struct alignas(32) Q6kWeights {
  uint8_t q[256];     // the values 0..63 (q + 32 of the reference), in the prepared activation order
  __m256i chunk_scale[8];  // chunk u: sc[2u] | sc[2u] << 16 in the low lanes, sc[2u+1] in the high lanes
  int32_t pair[8];    // sc[2i] | sc[2i+1] << 16, against bsums 2i, 2i+1
  float d;
};

struct alignas(32) Acc8 {  // f32 results of one weight row, lane j: activation row j of the group
  __m256 v;
};

// r[j] dword i becomes old r[i] dword j.
inline __attribute__((always_inline)) void transpose8x8(__m256i r[8]) {
  const __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]), t1 = _mm256_unpackhi_epi32(r[0], r[1]);
  const __m256i t2 = _mm256_unpacklo_epi32(r[2], r[3]), t3 = _mm256_unpackhi_epi32(r[2], r[3]);
  const __m256i t4 = _mm256_unpacklo_epi32(r[4], r[5]), t5 = _mm256_unpackhi_epi32(r[4], r[5]);
  const __m256i t6 = _mm256_unpacklo_epi32(r[6], r[7]), t7 = _mm256_unpackhi_epi32(r[6], r[7]);
  // u_i, 128-bit half h: dword 4h + i of rows 0..3 (u0..u3) or 4..7 (u4..u7).
  const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
  const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
  const __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
  const __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
  r[0] = _mm256_permute2x128_si256(u0, u4, 0x20);
  r[1] = _mm256_permute2x128_si256(u1, u5, 0x20);
  r[2] = _mm256_permute2x128_si256(u2, u6, 0x20);
  r[3] = _mm256_permute2x128_si256(u3, u7, 0x20);
  r[4] = _mm256_permute2x128_si256(u0, u4, 0x31);
  r[5] = _mm256_permute2x128_si256(u1, u5, 0x31);
  r[6] = _mm256_permute2x128_si256(u2, u6, 0x31);
  r[7] = _mm256_permute2x128_si256(u3, u7, 0x31);
}

// Per 128-bit half: r[j] dword i becomes old r[i] dword j (four rows, both halves at once).
inline __attribute__((always_inline)) void transpose4x4_halves(__m256i r[4]) {
  const __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]), t1 = _mm256_unpackhi_epi32(r[0], r[1]);
  const __m256i t2 = _mm256_unpacklo_epi32(r[2], r[3]), t3 = _mm256_unpackhi_epi32(r[2], r[3]);
  r[0] = _mm256_unpacklo_epi64(t0, t2);
  r[1] = _mm256_unpackhi_epi64(t0, t2);
  r[2] = _mm256_unpacklo_epi64(t1, t3);
  r[3] = _mm256_unpackhi_epi64(t1, t3);
}

__m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
void store256(void* p, __m256i v) { _mm256_store_si256(static_cast<__m256i*>(p), v); }

// Super-block k of activation rows rows[0..valid) into lanes (any byte order: dwords are moved whole).
template <int kH>
void build_lanes(const BlockQ8K* const rows[8 * kH], int valid, int64_t k, LaneBlock<kH>* out) {
  const __m256i zero = _mm256_setzero_si256();
  for (int u = 0; u < 8; ++u)
    for (int Q = 0; Q < 2 * kH; ++Q) {
      __m256i r[4];
      for (int l = 0; l < 4; ++l) {
        const int j = 4 * Q + l;
        r[l] = j < valid ? load256(rows[j][k].qs + 32 * u) : zero;
      }
      transpose4x4_halves(r);
      for (int i = 0; i < 4; ++i) out->q[u][Q][i] = r[i];
    }
  __m256i big = _mm256_setzero_si256();
  for (int h = 0; h < kH; ++h) {
    __m256i r[kLanes];
    alignas(32) float d[kLanes] = {};
    for (int j = 0; j < kLanes; ++j) {
      const int jj = kLanes * h + j;
      r[j] = jj < valid ? load256(rows[jj][k].bsums) : zero;
      if (jj < valid) d[j] = rows[jj][k].d;
    }
    transpose8x8(r);
    for (int i = 0; i < kLanes; ++i) {
      out->b[h][i] = r[i];
      big = _mm256_or_si256(big, _mm256_cmpgt_epi16(_mm256_abs_epi16(r[i]), _mm256_set1_epi16(16383)));
    }
    const __m256i ones = _mm256_set1_epi16(1), low16 = _mm256_set1_epi32(0xFFFF);
    for (int t = 0; t < 4; ++t) {
      const __m256i lo = _mm256_madd_epi16(r[2 * t], ones), hi = _mm256_madd_epi16(r[2 * t + 1], ones);
      out->bb[h][t] = _mm256_or_si256(_mm256_and_si256(lo, low16), _mm256_slli_epi32(hi, 16));
    }
    out->d[h] = _mm256_load_ps(d);
  }
  out->sums_fit = _mm256_testz_si256(big, big) != 0;
}

void unpack(const BlockQ4K& a, Q4kWeights* o) {
  const __m128i sm = q4k_scales_mins(a.scales);  // bytes 0..7 the scales, 8..15 the mins
  // The eight scales as words are the four (sc[2p], sc[2p+1]) dwords, the mins as words the four (m[2t],
  // m[2t+1]) dwords.
  _mm_store_si128(reinterpret_cast<__m128i*>(o->scale), _mm_cvtepu8_epi16(sm));
  const __m128i m16 = _mm_cvtepu8_epi16(_mm_unpackhi_epi64(sm, sm));
  _mm_store_si128(reinterpret_cast<__m128i*>(o->min2), m16);
  o->d = _cvtsh_ss(a.d);
  o->dmin = _cvtsh_ss(a.dmin);
  for (int p = 0; p < 4; ++p) {
    __m256i lo, hi, w_lo, w_hi;
    q4k_nibbles(a.qs + 32 * p, &lo, &hi);
    q45k_interleave(lo, hi, &w_lo, &w_hi);
    store256(o->q + 64 * p, w_lo);
    store256(o->q + 64 * p + 32, w_hi);
  }
}

// Element 128h + 32c + i of q6k_half_values (the values dot_q6k reads), stored at bytes 128h + 32c.
void unpack(const BlockQ6K& a, Q6kWeights* o) {
  // The sixteen signed scales as words are the eight pairs (sc[2i], sc[2i+1]); each word doubled into a
  // dword (in-lane unpacks, then the halves put in order), and per chunk the vector its madd takes, made
  // once per call here rather than once per row and group in q6k_chunk (Q6_K products of 16 rows 1.3x
  // faster on the AMD EPYC, Zen 3, with the scalar loops this replaced).
  const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a.scales)));
  store256(o->pair, w);
  const __m256i lo = _mm256_unpacklo_epi16(w, w), hi = _mm256_unpackhi_epi16(w, w);  // [s0..3 | s8..11], [s4..7 | s12..15]
  const __m256i s07 = _mm256_permute2x128_si256(lo, hi, 0x20), s8f = _mm256_permute2x128_si256(lo, hi, 0x31);
  for (int u = 0; u < 8; ++u) {
    const int c = u % 4;
    const __m256i pick = _mm256_setr_epi32(2 * c, 2 * c, 2 * c, 2 * c, 2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1);
    store256(&o->chunk_scale[u], _mm256_permutevar8x32_epi32(u < 4 ? s07 : s8f, pick));
  }
  o->d = _cvtsh_ss(a.d);
  for (int h = 0; h < 2; ++h) {
    __m256i g[4];
    q6k_half_values(a.ql, a.qh, h, g);
    for (int c = 0; c < 4; ++c) store256(o->q + 128 * h + 32 * c, g[c]);
  }
}

// An empty asm that claims to change the four word chains, so the compiler keeps them as chains: GCC 12
// otherwise regroups the sixteen products of a pair into trees and spills them (the kernel measured ~10 %
// slower on the AMD EPYC, Zen 3). Integer adds, exact in any grouping: no bit changes.
inline __attribute__((always_inline)) void keep_chains(__m256i& a, __m256i& b, __m256i& c, __m256i& d) {
  asm("" : "+x"(a), "+x"(b), "+x"(c), "+x"(d));
}

// A[Q] = (kFirst) or += the contribution of pair p (chunks 2p, 2p+1) of Q4_K row w against quad Q. Each
// shuffle of a weight chunk feeds both quads; eight maddubs per quad add up as words, then one madd by the
// pair's scales.
template <bool kFirst>
inline __attribute__((always_inline)) void q4k_pair(const Q4kWeights& w, int p, const LaneBlock<1>& L, __m256i* A) {
  const __m256i* x00 = L.q[2 * p][0];  // [chunk][quad]
  const __m256i* x01 = L.q[2 * p][1];
  const __m256i* x10 = L.q[2 * p + 1][0];
  const __m256i* x11 = L.q[2 * p + 1][1];
  // The activation vectors stay memory operands: GCC otherwise copies them to the stack once per call of
  // the row loop (they do not fit in registers), a load and a store each. An empty asm that claims to
  // change the pointers keeps the loads here, once per row.
  asm("" : "+r"(x00), "+r"(x01), "+r"(x10), "+r"(x11));
  const uint8_t* q = w.q + 64 * p;
  const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(q));
  const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(q + 32));
  // s[quad][chain], each started by its first product.
  __m256i t = _mm256_shuffle_epi32(w0, 0x00);
  __m256i s00 = _mm256_maddubs_epi16(t, x00[0]), s10 = _mm256_maddubs_epi16(t, x01[0]);
  t = _mm256_shuffle_epi32(w0, 0x55);
  __m256i s01 = _mm256_maddubs_epi16(t, x00[1]), s11 = _mm256_maddubs_epi16(t, x01[1]);
  keep_chains(s00, s10, s01, s11);
  t = _mm256_shuffle_epi32(w0, 0xAA);
  s00 = _mm256_add_epi16(s00, _mm256_maddubs_epi16(t, x00[2]));
  s10 = _mm256_add_epi16(s10, _mm256_maddubs_epi16(t, x01[2]));
  keep_chains(s00, s10, s01, s11);
  t = _mm256_shuffle_epi32(w0, 0xFF);
  s01 = _mm256_add_epi16(s01, _mm256_maddubs_epi16(t, x00[3]));
  s11 = _mm256_add_epi16(s11, _mm256_maddubs_epi16(t, x01[3]));
  keep_chains(s00, s10, s01, s11);
  t = _mm256_shuffle_epi32(w1, 0x00);
  s00 = _mm256_add_epi16(s00, _mm256_maddubs_epi16(t, x10[0]));
  s10 = _mm256_add_epi16(s10, _mm256_maddubs_epi16(t, x11[0]));
  keep_chains(s00, s10, s01, s11);
  t = _mm256_shuffle_epi32(w1, 0x55);
  s01 = _mm256_add_epi16(s01, _mm256_maddubs_epi16(t, x10[1]));
  s11 = _mm256_add_epi16(s11, _mm256_maddubs_epi16(t, x11[1]));
  keep_chains(s00, s10, s01, s11);
  t = _mm256_shuffle_epi32(w1, 0xAA);
  s00 = _mm256_add_epi16(s00, _mm256_maddubs_epi16(t, x10[2]));
  s10 = _mm256_add_epi16(s10, _mm256_maddubs_epi16(t, x11[2]));
  keep_chains(s00, s10, s01, s11);
  t = _mm256_shuffle_epi32(w1, 0xFF);
  s01 = _mm256_add_epi16(s01, _mm256_maddubs_epi16(t, x10[3]));
  s11 = _mm256_add_epi16(s11, _mm256_maddubs_epi16(t, x11[3]));
  const __m256i sc = _mm256_set1_epi32(w.scale[p]);
  const __m256i a0 = _mm256_madd_epi16(_mm256_add_epi16(s00, s01), sc);
  const __m256i a1 = _mm256_madd_epi16(_mm256_add_epi16(s10, s11), sc);
  A[0] = kFirst ? a0 : _mm256_add_epi32(A[0], a0);
  A[1] = kFirst ? a1 : _mm256_add_epi32(A[1], a1);
}

// The same for sixteen rows (four quads): each shuffle of a weight chunk feeds four maddubs, one per quad,
// and each quad's eight products add up in one chain of words (|Σ| <= 8·2·15·128 = 30 720, as above) —
// per 1024 multiply-adds 8 shuffles instead of 16 and no add of two chains. A[Q].
template <bool kFirst>
inline __attribute__((always_inline)) void q4k_pair(const Q4kWeights& w, int p, const LaneBlock<2>& L, __m256i* A) {
  const __m256i* x0 = L.q[2 * p][0];  // [quad][i], quads 0..3 contiguous
  const __m256i* x1 = L.q[2 * p + 1][0];
  asm("" : "+r"(x0), "+r"(x1));  // memory operands, not copies (as in the eight-row form)
  const uint8_t* q = w.q + 64 * p;
  const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(q));
  const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(q + 32));
  __m256i t = _mm256_shuffle_epi32(w0, 0x00);
  __m256i s0 = _mm256_maddubs_epi16(t, x0[0]), s1 = _mm256_maddubs_epi16(t, x0[4]);
  __m256i s2 = _mm256_maddubs_epi16(t, x0[8]), s3 = _mm256_maddubs_epi16(t, x0[12]);
  keep_chains(s0, s1, s2, s3);
  const auto step = [&](__m256i wv, auto imm, const __m256i* x, int i) __attribute__((always_inline)) {
    t = _mm256_shuffle_epi32(wv, decltype(imm)::value);
    s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(t, x[i]));
    s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(t, x[4 + i]));
    s2 = _mm256_add_epi16(s2, _mm256_maddubs_epi16(t, x[8 + i]));
    s3 = _mm256_add_epi16(s3, _mm256_maddubs_epi16(t, x[12 + i]));
    keep_chains(s0, s1, s2, s3);
  };
  step(w0, std::integral_constant<int, 0x55>{}, x0, 1);
  step(w0, std::integral_constant<int, 0xAA>{}, x0, 2);
  step(w0, std::integral_constant<int, 0xFF>{}, x0, 3);
  step(w1, std::integral_constant<int, 0x00>{}, x1, 0);
  step(w1, std::integral_constant<int, 0x55>{}, x1, 1);
  step(w1, std::integral_constant<int, 0xAA>{}, x1, 2);
  step(w1, std::integral_constant<int, 0xFF>{}, x1, 3);
  const __m256i sc = _mm256_set1_epi32(w.scale[p]);
  s0 = _mm256_madd_epi16(s0, sc);
  s1 = _mm256_madd_epi16(s1, sc);
  s2 = _mm256_madd_epi16(s2, sc);
  s3 = _mm256_madd_epi16(s3, sc);
  A[0] = kFirst ? s0 : _mm256_add_epi32(A[0], s0);
  A[1] = kFirst ? s1 : _mm256_add_epi32(A[1], s1);
  A[2] = kFirst ? s2 : _mm256_add_epi32(A[2], s2);
  A[3] = kFirst ? s3 : _mm256_add_epi32(A[3], s3);
}

// Q6_K chunk u (sub-blocks 2u in the low lanes, 2u+1 in the high lanes): two maddubs add up as words, then
// a madd by the lanes' scales.
template <bool kFirst>
inline __attribute__((always_inline)) void q6k_chunk(const Q6kWeights* w, int n, int u, const LaneBlock<1>& L, __m256i* A) {
  const __m256i* x0 = L.q[u][0];
  const __m256i* x1 = L.q[u][1];
  for (int r = 0; r < n; ++r) {
    asm("" : "+r"(x0), "+r"(x1));  // memory operands, not copies (as in q4k_pair)
    const __m256i wc = _mm256_load_si256(reinterpret_cast<const __m256i*>(w[r].q + 32 * u));
    const __m256i sc = _mm256_load_si256(&w[r].chunk_scale[u]);
    __m256i t = _mm256_shuffle_epi32(wc, 0x00);
    __m256i a0 = _mm256_maddubs_epi16(t, x0[0]), b0 = _mm256_maddubs_epi16(t, x1[0]);
    t = _mm256_shuffle_epi32(wc, 0x55);
    a0 = _mm256_add_epi16(a0, _mm256_maddubs_epi16(t, x0[1]));
    b0 = _mm256_add_epi16(b0, _mm256_maddubs_epi16(t, x1[1]));
    t = _mm256_shuffle_epi32(wc, 0xAA);
    __m256i a1 = _mm256_maddubs_epi16(t, x0[2]), b1 = _mm256_maddubs_epi16(t, x1[2]);
    t = _mm256_shuffle_epi32(wc, 0xFF);
    a1 = _mm256_add_epi16(a1, _mm256_maddubs_epi16(t, x0[3]));
    b1 = _mm256_add_epi16(b1, _mm256_maddubs_epi16(t, x1[3]));
    const __m256i s0 = _mm256_add_epi32(_mm256_madd_epi16(a0, sc), _mm256_madd_epi16(a1, sc));
    const __m256i s1 = _mm256_add_epi32(_mm256_madd_epi16(b0, sc), _mm256_madd_epi16(b1, sc));
    A[2 * r] = kFirst ? s0 : _mm256_add_epi32(A[2 * r], s0);
    A[2 * r + 1] = kFirst ? s1 : _mm256_add_epi32(A[2 * r + 1], s1);
  }
}

// The same for sixteen rows (four quads): each shuffle of the chunk feeds four maddubs. A[4r + Q]. (The
// eight-row form above stays written out: this loop over two quads measured 2 % slower there.)
template <bool kFirst>
inline __attribute__((always_inline)) void q6k_chunk(const Q6kWeights* w, int n, int u, const LaneBlock<2>& L, __m256i* A) {
  const __m256i* xu = L.q[u][0];
  for (int r = 0; r < n; ++r) {
    asm("" : "+r"(xu));  // memory operands, not copies (as in q4k_pair)
    const __m256i wc = _mm256_load_si256(reinterpret_cast<const __m256i*>(w[r].q + 32 * u));
    const __m256i sc = _mm256_load_si256(&w[r].chunk_scale[u]);
    const __m256i t0 = _mm256_shuffle_epi32(wc, 0x00), t1 = _mm256_shuffle_epi32(wc, 0x55);
    const __m256i t2 = _mm256_shuffle_epi32(wc, 0xAA), t3 = _mm256_shuffle_epi32(wc, 0xFF);
#pragma GCC unroll 4
    for (int Q = 0; Q < 4; ++Q) {
      const __m256i* x = xu + 4 * Q;
      const __m256i a0 = _mm256_add_epi16(_mm256_maddubs_epi16(t0, x[0]), _mm256_maddubs_epi16(t1, x[1]));
      const __m256i a1 = _mm256_add_epi16(_mm256_maddubs_epi16(t2, x[2]), _mm256_maddubs_epi16(t3, x[3]));
      const __m256i s = _mm256_add_epi32(_mm256_madd_epi16(a0, sc), _mm256_madd_epi16(a1, sc));
      A[4 * r + Q] = kFirst ? s : _mm256_add_epi32(A[4 * r + Q], s);
    }
  }
}

// Row 4Q + l's two halves (lanes l and 4 + l of quad Q) added: lane j is row j's sum.
inline __m256i fold_quads(__m256i q0, __m256i q1) {
  return _mm256_add_epi32(_mm256_permute2x128_si256(q0, q1, 0x20), _mm256_permute2x128_si256(q0, q1, 0x31));
}

// Σ_i pair_i · b[i]: per lane, Σ_s w_s·bsums[s] for the word pairs (w_2i, w_2i+1) of pair[i].
inline __m256i against_bsums(const int32_t pair[8], const __m256i b[8]) {
  __m256i s = _mm256_madd_epi16(b[0], _mm256_set1_epi32(pair[0]));
  for (int i = 1; i < 8; ++i) s = _mm256_add_epi32(s, _mm256_madd_epi16(b[i], _mm256_set1_epi32(pair[i])));
  return s;
}

// Weight rows unpacked at once, per format. Q6_K takes eight: each block k of the next chunk's rows is
// prefetched while block k of this one is computed, and sixteen Q6_K rows (five lines each, against as much
// work per block as Q4_K's three) stalled on the misses in flight. Measured on the AMD EPYC (Zen 3), paired
// runs in one process: Q6_K products of 16-64 rows 5-12 % faster with 8 than with 16 (dropping the prefetch
// instead gained less); Q4_K unchanged at 8 or 12, slower at 32.
template <typename Weights>
constexpr int kChunkRowsOf = std::is_same_v<Weights, Q6kWeights> ? 8 : kMaxChunkRows;
// The prefetch hint of those next-chunk bytes: Q6_K's as non-temporal (its products of 16-64 rows another
// 2-8 % faster, the same paired runs), Q4_K's to all levels (non-temporal measured ~5 % slower there).
// The canonical steps of one super-block for rows w[0..n) against one lane block, in every lane: Q4_K
// acc = fma(d·y.d, A, acc), acc = fma(-(dmin·y.d), M, acc); Q6_K acc = fma(d·y.d, A, acc).
// acc[h * kChunkRowsOf<Weights> + r]: weight row r against half h of the block.
// Q4_K goes row by row, its four pairs' sums in registers (products of 8-512 rows 1-5 % faster on the AMD
// EPYC, Zen 5, than pair by pair over all rows with the sums in memory); Q6_K stays chunk by chunk over all
// rows (row by row, its eight chunks, measured 11 % slower).
template <int kH>
void super_block(const Q4kWeights* w, int n, const LaneBlock<kH>& L, Acc8* acc) {
  constexpr int kQuads = 2 * kH, stride = kChunkRowsOf<Q4kWeights>;
  for (int r = 0; r < n; ++r) {
    __m256i A[kQuads];
    q4k_pair<true>(w[r], 0, L, A);
#pragma GCC unroll 3
    for (int p = 1; p < 4; ++p) q4k_pair<false>(w[r], p, L, A);
    for (int h = 0; h < kH; ++h) {
      // M = Σ_s m[s]·B[s]: four madd where the pair sums fit in words, else eight against the bsums themselves.
      __m256i M;
      if (L.sums_fit) {
        M = _mm256_madd_epi16(L.bb[h][0], _mm256_set1_epi32(w[r].min2[0]));
        for (int t = 1; t < 4; ++t) M = _mm256_add_epi32(M, _mm256_madd_epi16(L.bb[h][t], _mm256_set1_epi32(w[r].min2[t])));
      } else {
        // Rare (no row essaim quantises): each min doubled, (m[s], m[s]) against (bsums[2s], bsums[2s+1]).
        int32_t min[8];
        for (int i = 0; i < 8; ++i) min[i] = int32_t((uint32_t(w[r].min2[i / 2]) >> (16 * (i % 2)) & 0xFFFFu) * 0x10001u);
        M = against_bsums(min, L.b[h]);
      }
      const __m256 dy = _mm256_mul_ps(_mm256_set1_ps(w[r].d), L.d[h]);
      const __m256 my = _mm256_mul_ps(_mm256_set1_ps(w[r].dmin), L.d[h]);
      Acc8& a = acc[h * stride + r];
      a.v = _mm256_fmadd_ps(dy, _mm256_cvtepi32_ps(fold_quads(A[2 * h], A[2 * h + 1])), a.v);
      a.v = _mm256_fnmadd_ps(my, _mm256_cvtepi32_ps(M), a.v);
    }
  }
}

template <int kH>
void super_block(const Q6kWeights* w, int n, const LaneBlock<kH>& L, Acc8* acc) {
  constexpr int kQuads = 2 * kH, stride = kChunkRowsOf<Q6kWeights>;
  __m256i A[kQuads * kMaxChunkRows];
  q6k_chunk<true>(w, n, 0, L, A);
  for (int u = 1; u < 8; ++u) q6k_chunk<false>(w, n, u, L, A);
  for (int r = 0; r < n; ++r)
    for (int h = 0; h < kH; ++h) {
      // A = Σ sc·Σ q·x − 32·Σ sc·bsums, exact in int32 (|Σ sc·Σ q·x| <= 256·63·128·128).
      const __m256i a = _mm256_sub_epi32(fold_quads(A[kQuads * r + 2 * h], A[kQuads * r + 2 * h + 1]),
                                         _mm256_slli_epi32(against_bsums(w[r].pair, L.b[h]), 5));
      const __m256 dy = _mm256_mul_ps(_mm256_set1_ps(w[r].d), L.d[h]);
      Acc8& o = acc[h * stride + r];
      o.v = _mm256_fmadd_ps(dy, _mm256_cvtepi32_ps(a), o.v);
    }
}

template <typename Weights>
constexpr auto kPrefetchHintOf = std::is_same_v<Weights, Q6kWeights> ? _MM_HINT_NTA : _MM_HINT_T0;

template <typename Block, typename Weights>
void lanes_rows(const WeightMatrix& w, const uint8_t* xprep, uint64_t x_stride, int64_t n_rows, int64_t o_begin,
                int64_t o_end, float* const* y) {
  constexpr int kChunkRows = kChunkRowsOf<Weights>;
  static_assert(kChunkRows <= kMaxChunkRows);  // the bound of super_block's arrays
  const int64_t n_sb = w.cols / kQK_K;
  const int64_t n_groups = (n_rows + kLanes - 1) / kLanes;  // of eight rows
  // Groups go in pairs (sixteen rows in one LaneBlock<2>); an odd last group alone (LaneBlock<1>). As few
  // passes as the budget allows, of equal size and an even number of groups: each pass unpacks every
  // weight row once more.
  const int64_t max_per_pass =
      std::clamp<int64_t>(int64_t(lanes_pass_bytes() / (uint64_t(n_sb) * sizeof(LaneBlock<1>))) / 2 * 2, 2, std::max<int64_t>(n_groups, 2));
  const int64_t passes = (n_groups + max_per_pass - 1) / max_per_pass;
  const int64_t groups_per_pass = ((n_groups + passes - 1) / passes + 1) / 2 * 2;
  thread_local std::vector<LaneBlock<2>> wide;
  thread_local std::vector<LaneBlock<1>> narrow;
  thread_local std::vector<Acc8> acc;
  wide.resize(size_t(groups_per_pass / 2 * n_sb));
  narrow.resize(size_t(n_sb));
  acc.resize(size_t(groups_per_pass * kChunkRows));

  for (int64_t g0 = 0; g0 < n_groups; g0 += groups_per_pass) {
    const int64_t gn = std::min(groups_per_pass, n_groups - g0);
    const int64_t pairs = gn / 2;
    const bool odd = gn % 2 != 0;
    for (int64_t g = 0; g < gn; g += 2) {
      const int64_t t0 = (g0 + g) * kLanes;
      const int valid = int(std::min<int64_t>(2 * kLanes, n_rows - t0));
      const BlockQ8K* rows[2 * kLanes] = {};
      for (int j = 0; j < valid; ++j) rows[j] = reinterpret_cast<const BlockQ8K*>(xprep + uint64_t(t0 + j) * x_stride);
      if (g + 1 < gn)
        for (int64_t k = 0; k < n_sb; ++k) build_lanes<2>(rows, valid, k, &wide[size_t(g / 2 * n_sb + k)]);
      else
        for (int64_t k = 0; k < n_sb; ++k) build_lanes<1>(rows, valid, k, &narrow[size_t(k)]);
    }
    for (int64_t o0 = o_begin; o0 < o_end; o0 += kChunkRows) {
      const int n = int(std::min<int64_t>(kChunkRows, o_end - o0));
      std::fill(acc.begin(), acc.begin() + gn * kChunkRows, Acc8{_mm256_setzero_ps()});
      // Super-block by super-block: block k of the chunk's rows unpacked (into L1), then every group against
      // them. Unpacking each row whole first (all its super-blocks, ~60 KB at 3072 columns, in the order the
      // hardware prefetchers follow a row) measured 2.5-5 % slower for Q4_K products of 16-24 rows and 1 %
      // for Q6_K on the AMD EPYC (Zen 5), weights beyond the caches (scripts/lanes-ab.sh, 200 copies): the
      // unpacked rows no longer fit in L1, and the next chunk's prefetches below bring its blocks in anyway.
      const int64_t next = o0 + kChunkRows;
      const int n_next = int(std::clamp<int64_t>(o_end - next, 0, kChunkRows));
      for (int64_t k = 0; k < n_sb; ++k) {
        // The next chunk's block k on its way to the caches while this chunk's block k is computed.
        for (int r = 0; r < n_next; ++r) {
          const char* b = reinterpret_cast<const char*>(w.data + uint64_t(next + r) * w.row_stride) + k * sizeof(Block);
          for (size_t off = 0; off < sizeof(Block); off += 64) _mm_prefetch(b + off, kPrefetchHintOf<Weights>);
          _mm_prefetch(b + sizeof(Block) - 1, kPrefetchHintOf<Weights>);
        }
        Weights wk[kChunkRows];
        for (int r = 0; r < n; ++r) unpack(reinterpret_cast<const Block*>(w.data + uint64_t(o0 + r) * w.row_stride)[k], &wk[r]);
        for (int64_t i = 0; i < pairs; ++i)
          super_block(wk, n, wide[size_t(i * n_sb + k)], &acc[size_t(2 * i * kChunkRows)]);
        if (odd) super_block(wk, n, narrow[size_t(k)], &acc[size_t(2 * pairs * kChunkRows)]);
      }
      for (int64_t g = 0; g < gn; ++g) {
        const int64_t t0 = (g0 + g) * kLanes;
        const int valid = int(std::min<int64_t>(kLanes, n_rows - t0));
        for (int r = 0; r < n; ++r) {
          alignas(32) float out[kLanes];
          _mm256_store_ps(out, acc[size_t(g * kChunkRows + r)].v);
          for (int j = 0; j < valid; ++j) y[t0 + j][o0 + r] = out[j];
        }
      }
    }
  }
}

}  // namespace

void lanes_matmul_rows(const WeightMatrix& w, const uint8_t* xprep, uint64_t x_stride, int64_t n_rows,
                       int64_t o_begin, int64_t o_end, float* const* y) {
  ESSAIM_CHECK(lanes_matmul_type(w.type) && w.cols % kQK_K == 0);
  if (n_rows <= 0 || o_end <= o_begin) return;
  if (w.type == GgmlType::Q4_K) return lanes_rows<BlockQ4K, Q4kWeights>(w, xprep, x_stride, n_rows, o_begin, o_end, y);
  lanes_rows<BlockQ6K, Q6kWeights>(w, xprep, x_stride, n_rows, o_begin, o_end, y);
}

}  // namespace essaim
