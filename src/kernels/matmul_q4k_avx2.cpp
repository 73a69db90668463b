// Q4_K products of several activation rows on AVX2, one activation row per 32-bit lane, bit-identical to
// the dot kernels (matmul_q4k_avx2.h; docs/kernels.md, "AVX2 lane-per-row Q4_K products").
//
// The dot kernels keep one weight row in a vector and reduce each activation row's partial sums across
// lanes once per super-block (trees of hadd), and decode each weight block once per eight activation rows.
// Here the roles turn: per super-block, eight activation rows are transposed so that lane j of vector i
// holds dword i of row j's prepared bytes, and each dword of an unpacked weight row is broadcast against
// them. One maddubs then forms two products for each of the eight rows, eight of them add up as 16-bit words
// (|Σ| <= 8·2·15·128 = 30 720: exact for any activation bytes), and one madd by the broadcast scale pair
// (sc[2p], sc[2p+1]) turns them into that half pair's contribution to A, lane by lane. Per weight row,
// activation group and super-block that is 64 maddubs + 8 madd (+ 8 madd for M, from the rows' bsums as
// given, so any Q8_K bytes give the reference's M) against the dot kernels' 64 + 40 and their reductions.
//
// The prepared activation layout (prepare_q8k_q45k_avx2) interleaves sub-blocks 2p and 2p+1 by 16-bit words;
// the weights are unpacked into the same order (low nibbles = sub-block 2p, high = 2p+1, interleaved the
// same way), so dword i of a weight row and dword i of an activation row hold the same four elements, and a
// dword's low word belongs to sub-block 2p and its high word to 2p+1.
#include "kernels/matmul_q4k_avx2.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/status.h"
#include "kernels/blocks.h"

namespace essaim {
namespace {

constexpr int kLanes = 8;         // activation rows per vector
constexpr int kChunkRows = 16;    // weight rows unpacked at once (all their super-blocks: ~60 KB at 3072 columns)
constexpr uint64_t kLaneBudget = 192 * 1024;  // transposed activation bytes per pass, in L2

// One super-block of eight activation rows in lanes (rows past the end of the batch are zeros), as two
// quads of four rows: q[p][c][Q][i] holds, in lane l, dword 16p + 8c + i of row 4Q + l and, in lane 4 + l,
// dword 16p + 8c + 4 + i of the same row — what the in-lane dword shuffle i of a weight row's 32 bytes
// 64p + 32c .. + 31 meets. Each row's A then sits in lanes l and 4 + l, added once per super-block.
struct alignas(32) LaneBlock {
  __m256i q[4][2][2][4];
  __m256i b[8];  // lane j of b[i]: bsums[2i] | bsums[2i+1] << 16 of row j
  __m256 d;      // lane j: row j's d
};

// One super-block of a weight row, unpacked.
struct alignas(32) WeightBlock {
  uint8_t q[256];    // the values 0..15, in the prepared activation order
  int32_t scale[4];  // pair p: sc[2p] | sc[2p+1] << 16 (the words of a dword: sub-blocks 2p, 2p+1)
  int32_t min[8];    // sub-block s: m[s] | m[s] << 16 (against bsums 2s, 2s+1)
  float d, dmin;
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

// Super-block k of activation rows rows[0..valid) into lanes.
void build_lanes(const BlockQ8K* const rows[kLanes], int valid, int64_t k, LaneBlock* out) {
  const __m256i zero = _mm256_setzero_si256();
  for (int p = 0; p < 4; ++p)
    for (int c = 0; c < 2; ++c)
      for (int Q = 0; Q < 2; ++Q) {
        __m256i r[4];
        for (int l = 0; l < 4; ++l) {
          const int j = 4 * Q + l;
          r[l] = j < valid ? load256(rows[j][k].qs + 64 * p + 32 * c) : zero;
        }
        transpose4x4_halves(r);
        for (int i = 0; i < 4; ++i) out->q[p][c][Q][i] = r[i];
      }
  __m256i r[kLanes];
  alignas(32) float d[kLanes] = {};
  for (int j = 0; j < kLanes; ++j) {
    r[j] = j < valid ? load256(rows[j][k].bsums) : zero;
    if (j < valid) d[j] = rows[j][k].d;
  }
  transpose8x8(r);
  for (int i = 0; i < kLanes; ++i) out->b[i] = r[i];
  out->d = _mm256_load_ps(d);
}

void unpack_weights(const BlockQ4K& a, WeightBlock* o) {
  uint8_t sc[8], m[8];
  q4k_unpack_scales(a.scales, sc, m);
  for (int p = 0; p < 4; ++p) o->scale[p] = int32_t(sc[2 * p]) | int32_t(sc[2 * p + 1]) << 16;
  for (int s = 0; s < 8; ++s) o->min[s] = int32_t(m[s]) | int32_t(m[s]) << 16;
  o->d = _cvtsh_ss(a.d);
  o->dmin = _cvtsh_ss(a.dmin);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int p = 0; p < 4; ++p) {
    const __m256i raw = load256(a.qs + 32 * p);
    const __m256i lo = _mm256_and_si256(raw, low4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
    _mm256_store_si256(reinterpret_cast<__m256i*>(o->q + 64 * p), _mm256_unpacklo_epi16(lo, hi));
    _mm256_store_si256(reinterpret_cast<__m256i*>(o->q + 64 * p + 32), _mm256_unpackhi_epi16(lo, hi));
  }
}

inline __m256i bcast(const void* p) { return _mm256_set1_epi32(*static_cast<const int32_t*>(p)); }

// A[2r + Q] += the contribution of pair p for rows w[0..n) against quad Q of the lanes. Each shuffle of a
// weight half feeds both quads; eight maddubs per quad add up as words (each lane meets eight dwords of the
// pair, |Σ| <= 30 720), then one madd by the pair's scales.
// The first pair (kFirst) writes A instead of adding to it.
template <bool kFirst>
inline __attribute__((always_inline)) void pair_sums(const WeightBlock* w, int n, int p, const LaneBlock& L,
                                                     __m256i* A) {
  for (int r = 0; r < n; ++r) {
    const uint8_t* q = w[r].q + 64 * p;
    __m256i s00 = _mm256_setzero_si256(), s01 = s00, s10 = s00, s11 = s00;  // s[quad][chain]
#pragma GCC unroll 2
    for (int c = 0; c < 2; ++c) {
      const __m256i wc = _mm256_load_si256(reinterpret_cast<const __m256i*>(q + 32 * c));
      const __m256i* x0 = L.q[p][c][0];
      const __m256i* x1 = L.q[p][c][1];
      __m256i t = _mm256_shuffle_epi32(wc, 0x00);
      s00 = _mm256_add_epi16(s00, _mm256_maddubs_epi16(t, x0[0]));
      s10 = _mm256_add_epi16(s10, _mm256_maddubs_epi16(t, x1[0]));
      t = _mm256_shuffle_epi32(wc, 0x55);
      s01 = _mm256_add_epi16(s01, _mm256_maddubs_epi16(t, x0[1]));
      s11 = _mm256_add_epi16(s11, _mm256_maddubs_epi16(t, x1[1]));
      t = _mm256_shuffle_epi32(wc, 0xAA);
      s00 = _mm256_add_epi16(s00, _mm256_maddubs_epi16(t, x0[2]));
      s10 = _mm256_add_epi16(s10, _mm256_maddubs_epi16(t, x1[2]));
      t = _mm256_shuffle_epi32(wc, 0xFF);
      s01 = _mm256_add_epi16(s01, _mm256_maddubs_epi16(t, x0[3]));
      s11 = _mm256_add_epi16(s11, _mm256_maddubs_epi16(t, x1[3]));
    }
    const __m256i sc = _mm256_set1_epi32(w[r].scale[p]);
    const __m256i a0 = _mm256_madd_epi16(_mm256_add_epi16(s00, s01), sc);
    const __m256i a1 = _mm256_madd_epi16(_mm256_add_epi16(s10, s11), sc);
    A[2 * r] = kFirst ? a0 : _mm256_add_epi32(A[2 * r], a0);
    A[2 * r + 1] = kFirst ? a1 : _mm256_add_epi32(A[2 * r + 1], a1);
  }
}

// The canonical steps of one super-block for rows w[0..n) against one lane block: A from the values, M from
// bsums, then acc = fma(d·y.d, A, acc), acc = fma(-(dmin·y.d), M, acc) in every lane.
void super_block(const WeightBlock* w, int n, const LaneBlock& L, Acc8* acc) {
  __m256i A[2 * kChunkRows];
  pair_sums<true>(w, n, 0, L, A);
  for (int p = 1; p < 4; ++p) pair_sums<false>(w, n, p, L, A);
  for (int r = 0; r < n; ++r) {
    __m256i M = _mm256_madd_epi16(L.b[0], _mm256_set1_epi32(w[r].min[0]));
    for (int s = 1; s < 8; ++s) M = _mm256_add_epi32(M, _mm256_madd_epi16(L.b[s], _mm256_set1_epi32(w[r].min[s])));
    const __m256 dy = _mm256_mul_ps(_mm256_set1_ps(w[r].d), L.d);
    const __m256 my = _mm256_mul_ps(_mm256_set1_ps(w[r].dmin), L.d);
    // Row 4Q + l's two halves (lanes l and 4 + l of quad Q) added: lane j is row j's A.
    const __m256i a = _mm256_add_epi32(_mm256_permute2x128_si256(A[2 * r], A[2 * r + 1], 0x20),
                                       _mm256_permute2x128_si256(A[2 * r], A[2 * r + 1], 0x31));
    acc[r].v = _mm256_fmadd_ps(dy, _mm256_cvtepi32_ps(a), acc[r].v);
    acc[r].v = _mm256_fnmadd_ps(my, _mm256_cvtepi32_ps(M), acc[r].v);
  }
}

}  // namespace

void q4k_lanes_matmul_rows(const WeightMatrix& w, const uint8_t* xprep, uint64_t x_stride, int64_t n_rows,
                           int64_t o_begin, int64_t o_end, float* const* y) {
  ESSAIM_CHECK(w.type == GgmlType::Q4_K && w.cols % kQK_K == 0);
  if (n_rows <= 0 || o_end <= o_begin) return;
  const int64_t n_sb = w.cols / kQK_K;
  const int64_t n_groups = (n_rows + kLanes - 1) / kLanes;
  // As few passes as the budget allows, of equal size: each pass unpacks every weight row once more.
  const int64_t max_per_pass =
      std::clamp<int64_t>(int64_t(kLaneBudget / (uint64_t(n_sb) * sizeof(LaneBlock))), 1, n_groups);
  const int64_t passes = (n_groups + max_per_pass - 1) / max_per_pass;
  const int64_t groups_per_pass = (n_groups + passes - 1) / passes;
  thread_local std::vector<LaneBlock> lanes;
  thread_local std::vector<WeightBlock> unpacked;
  thread_local std::vector<Acc8> acc;
  lanes.resize(size_t(groups_per_pass * n_sb));
  unpacked.resize(size_t(n_sb * kChunkRows));
  acc.resize(size_t(groups_per_pass * kChunkRows));

  for (int64_t g0 = 0; g0 < n_groups; g0 += groups_per_pass) {
    const int64_t gn = std::min(groups_per_pass, n_groups - g0);
    for (int64_t g = 0; g < gn; ++g) {
      const int64_t t0 = (g0 + g) * kLanes;
      const int valid = int(std::min<int64_t>(kLanes, n_rows - t0));
      const BlockQ8K* rows[kLanes] = {};
      for (int j = 0; j < valid; ++j) rows[j] = reinterpret_cast<const BlockQ8K*>(xprep + uint64_t(t0 + j) * x_stride);
      for (int64_t k = 0; k < n_sb; ++k) build_lanes(rows, valid, k, &lanes[size_t(g * n_sb + k)]);
    }
    for (int64_t o0 = o_begin; o0 < o_end; o0 += kChunkRows) {
      const int n = int(std::min<int64_t>(kChunkRows, o_end - o0));
      std::fill(acc.begin(), acc.begin() + gn * kChunkRows, Acc8{_mm256_setzero_ps()});
      // Each weight row read front to back (the order the hardware prefetchers follow from memory), into
      // unpacked[k * kChunkRows + r]; then super-block by super-block, every group against the same rows.
      for (int r = 0; r < n; ++r) {
        const auto* blocks = reinterpret_cast<const BlockQ4K*>(w.data + uint64_t(o0 + r) * w.row_stride);
        for (int64_t k = 0; k < n_sb; ++k) unpack_weights(blocks[k], &unpacked[size_t(k * kChunkRows + r)]);
      }
      const int64_t next = o0 + kChunkRows;
      const int n_next = int(std::clamp<int64_t>(o_end - next, 0, kChunkRows));
      for (int64_t k = 0; k < n_sb; ++k) {
        // The next chunk's block k on its way to the caches while this chunk's block k is computed.
        for (int r = 0; r < n_next; ++r) {
          const uint8_t* b = w.data + uint64_t(next + r) * w.row_stride + uint64_t(k) * sizeof(BlockQ4K);
          _mm_prefetch(reinterpret_cast<const char*>(b), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(b + 64), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(b + 143), _MM_HINT_T0);
        }
        for (int64_t g = 0; g < gn; ++g)
          super_block(&unpacked[size_t(k * kChunkRows)], n, lanes[size_t(g * n_sb + k)], &acc[size_t(g * kChunkRows)]);
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

}  // namespace essaim
