// Q4_K and Q6_K products of many activation rows on AMX tiles, bit-identical to the dot kernels
// (matmul_amx.h).
//
// A call computes weight rows [o_begin, o_end) for all activation rows in passes of 16 weight rows × 16
// activation rows × one super-block: three chains of four tile products (one per 64-element chunk) form
// exact int32 sums, from which each format's integer A (and M) are exact combinations, and then the
// canonical f32 steps run for the 16 × 16 results at once.
//   Q4_K: C_lo = Σ (q·(sc & 7))·q8, C_hi = Σ (q·(sc >> 3))·q8, C_m = Σ m·q8 (tdpbusd, weights unsigned);
//     A = 8·C_hi + C_lo, M = C_m; acc = fma(db, f32(A), acc), acc = fma(-dmb, f32(M), acc).
//   Q6_K: the signed 8-bit scale as three digits in [-3, 4], sc = d0 + 8·d1 + 64·d2, so that every
//     (q - 32)·d_j is a signed byte; C_j = Σ ((q - 32)·d_j)·q8 (tdpbssd); A = C_0 + 8·C_1 + 64·C_2;
//     acc = fma(d·y.d, f32(A), acc).
// Layouts (docs/kernels.md, "AMX tiles"):
//   weights (tile A): 16 rows × 64 bytes per chunk c, in the element order of chunk c of the AVX-512
//     activation layout of the format (prepare_q8k_q45k_avx512 / prepare_q8k_q6k_avx512), so the
//     activation bytes need no reordering; prepared once per 16 weight rows and super-block and reused by
//     every activation group of the call.
//   activations (tile B, "VNNI"): row r of chunk c holds dword 16c + r of each of 16 prepared rows, a
//     16 × 16 dword transpose, once per call.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/blocks.h"
#include "kernels/matmul_amx.h"
#include "kernels/q45k_arrange_avx512.h"
#include "kernels/q6k_arrange_avx512.h"
#include "kernels/transpose_avx512.h"

namespace essaim {
namespace {

constexpr int kTile = 16;       // weight rows and activation rows per tile pass
constexpr int kMaxGroups = 16;  // activation groups of 16 rows prepared at once: at most ~0.8 MB per thread

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

constexpr TileConfig all_tiles_16x64() {
  TileConfig cfg;
  for (int i = 0; i < 8; ++i) {
    cfg.colsb[i] = 64;
    cfg.rows[i] = kTile;
  }
  return cfg;
}
// In static storage: GCC 12 dropped the stores of a stack copy's rows and widths before ldtilecfg in one
// caller (the tile loads then faulted), not seeing that the instruction reads all 64 bytes.
constexpr TileConfig kTileConfig = all_tiles_16x64();

// Every tile 16 rows of 64 bytes (palette 1), for the calling thread.
void configure_tiles() { _tile_loadconfig(&kTileConfig); }

// One super-block of 16 activation rows: chunk c, tile row r, bytes 4n..4n+3 from activation row n.
struct alignas(64) ActivationTiles {
  int8_t q[4][1024];
  float d[kTile];
};

// f32 results of 16 weight rows × 16 activation rows, element 16r + n.
struct alignas(64) AccTile {
  float v[kTile * kTile];
};

const BlockQ8K* activation_row(const uint8_t* x, uint64_t stride, int64_t t) {
  return reinterpret_cast<const BlockQ8K*>(x + uint64_t(t) * stride);
}

// Whether every bsum of the super-block is the sum of its 16 values (prepared layout: group i of sub-block s
// at bytes 32i + 4s, so chunks 0-1 hold the first half of each sub-block and chunks 2-3 the second).
bool bsums_consistent(const BlockQ8K& b) {
  const __m512i ones = _mm512_set1_epi8(1), z = _mm512_setzero_si512();
  const __m512i s0 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, ones, _mm512_loadu_si512(b.qs)), ones,
                                         _mm512_loadu_si512(b.qs + 64));
  const __m512i s1 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, ones, _mm512_loadu_si512(b.qs + 128)), ones,
                                         _mm512_loadu_si512(b.qs + 192));
  // dword s (< 8) of h0 / h1: the sum of the first / second half of sub-block s = bsums[2s] / bsums[2s + 1].
  const __m256i h0 = _mm256_add_epi32(_mm512_castsi512_si256(s0), _mm512_extracti64x4_epi64(s0, 1));
  const __m256i h1 = _mm256_add_epi32(_mm512_castsi512_si256(s1), _mm512_extracti64x4_epi64(s1, 1));
  const __m512i interleave = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i sums = _mm512_permutex2var_epi32(_mm512_zextsi256_si512(h0), interleave, _mm512_zextsi256_si512(h1));
  __m256i bs;
  std::memcpy(&bs, b.bsums, sizeof(bs));
  return _mm512_cmpneq_epi32_mask(sums, _mm512_cvtepi16_epi32(bs)) == 0;
}

// Activation rows [t0, t0 + n) (n <= 16; the rest zero) as tiles, super-block after super-block.
void prepare_activation_tiles(const uint8_t* x, uint64_t stride, int64_t t0, int n, int64_t nkb,
                              ActivationTiles* out, int64_t out_stride) {
  for (int64_t kb = 0; kb < nkb; ++kb) {
    ActivationTiles& at = out[kb * out_stride];
    for (int c = 0; c < 4; ++c) {
      __m512i r[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i)
        r[i] = i < n ? _mm512_loadu_si512(activation_row(x, stride, t0 + i)[kb].qs + 64 * c) : _mm512_setzero_si512();
      transpose16x16(r);
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) _mm512_store_si512(at.q[c] + 64 * i, r[i]);
    }
    for (int i = 0; i < kTile; ++i) at.d[i] = i < n ? activation_row(x, stride, t0 + i)[kb].d : 0.0f;
  }
}

void zero_rows(uint8_t* tile, int from) {
  for (int i = from; i < kTile; ++i) _mm512_store_si512(tile + 64 * i, _mm512_setzero_si512());
}

const uint8_t* weight_block(const WeightMatrix& w, int64_t row, int64_t kb, size_t block_bytes) {
  return w.data + uint64_t(row) * w.row_stride + uint64_t(kb) * block_bytes;
}

// ---- Q4_K ----

struct Q4k {
  using Block = BlockQ4K;
  static constexpr bool kReadsBsums = true;  // M from the q8 values must equal the reference's Σ bsums·m

  // One super-block of 16 weight rows, row n at byte 64n of each tile.
  struct alignas(64) Weights {
    uint8_t lo[4][1024];  // chunk c: q·(sc & 7)
    uint8_t hi[4][1024];  // chunk c: q·(sc >> 3)
    uint8_t mins[1024];   // m of each byte's sub-block: the same for every chunk
    float d[kTile], dmin[kTile];
  };
  struct alignas(64) Ints {
    int32_t lo[256], hi[256], m[256];
  };

  // The weights in the arrangement of the AVX-512 kernels (q45k_arrange_avx512.h).
  using Index = Q45kIndex;
  static Index index() { return q45k_index(); }

  // Super-block kb of weight rows [o0, o0 + n) (n <= 16; the rest zero) as tiles.
  static void prepare(const WeightMatrix& w, int64_t o0, int n, int64_t kb, const Index& ix, Weights& wt) {
    const __m512i k7 = _mm512_set1_epi32(7);
    for (int i = 0; i < n; ++i) {
      const Block& a = *reinterpret_cast<const Block*>(weight_block(w, o0 + i, kb, sizeof(Block)));
      // q.w[c]: the 0..15 values of chunk c; dword e of q.sc: sc[e % 8]; of q.mins2: m[e % 8] in both words.
      const Q45kWeights q = q45k_arrange<Block, false>(a, ix);
      // sc & 7 and sc >> 3 (both <= 7) in both words of their dword; m in all four bytes.
      const __m512i lo = _mm512_and_si512(q.sc, k7), hi = _mm512_srli_epi32(q.sc, 3);
      const __m512i s_lo = _mm512_or_si512(lo, _mm512_slli_epi32(lo, 16));
      const __m512i s_hi = _mm512_or_si512(hi, _mm512_slli_epi32(hi, 16));
      _mm512_store_si512(wt.mins + 64 * i, _mm512_or_si512(q.mins2, _mm512_slli_epi32(q.mins2, 8)));
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        // Each word (q_a | q_b << 8) times s: q_a·s + (q_b·s << 8), both below 256, so the bytes are exact.
        _mm512_store_si512(wt.lo[c] + 64 * i, _mm512_mullo_epi16(q.w[c], s_lo));
        _mm512_store_si512(wt.hi[c] + 64 * i, _mm512_mullo_epi16(q.w[c], s_hi));
      }
      wt.d[i] = _cvtsh_ss(a.d);
      wt.dmin[i] = _cvtsh_ss(a.dmin);
    }
    for (int c = 0; c < 4; ++c) {
      zero_rows(wt.lo[c], n);
      zero_rows(wt.hi[c], n);
    }
    zero_rows(wt.mins, n);
    for (int i = n; i < kTile; ++i) wt.d[i] = wt.dmin[i] = 0.0f;
  }

  // Twelve tdpbusd: C_lo, C_hi and C_m over the four chunks.
  static void products(const Weights& w, const ActivationTiles& a, Ints& c) {
    _tile_zero(4);
    _tile_zero(5);
    _tile_zero(6);
    _tile_loadd(3, w.mins, 64);
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      _tile_loadd(0, a.q[k], 64);
      _tile_loadd(1, w.lo[k], 64);
      _tile_loadd(2, w.hi[k], 64);
      _tile_dpbusd(4, 1, 0);
      _tile_dpbusd(5, 2, 0);
      _tile_dpbusd(6, 3, 0);
    }
    _tile_stored(4, c.lo, 64);
    _tile_stored(5, c.hi, 64);
    _tile_stored(6, c.m, 64);
  }

  // acc[16r + n] = fma(db, f32(A), acc), then fma(-dmb, f32(M), acc), A = 8·C_hi + C_lo, M = C_m.
  static void f32_steps(const Weights& w, const float* da_rows, const Ints& c, float* acc) {
    const __m512 da = _mm512_load_ps(da_rows);
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) {
      const __m512i ai = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(c.hi + 16 * r), 3),
                                          _mm512_load_si512(c.lo + 16 * r));
      const __m512 db = _mm512_mul_ps(_mm512_set1_ps(w.d[r]), da);
      const __m512 dmb = _mm512_mul_ps(_mm512_set1_ps(w.dmin[r]), da);
      __m512 v = _mm512_fmadd_ps(db, _mm512_cvtepi32_ps(ai), _mm512_load_ps(acc + 16 * r));
      v = _mm512_fnmadd_ps(dmb, _mm512_cvtepi32_ps(_mm512_load_si512(c.m + 16 * r)), v);
      _mm512_store_ps(acc + 16 * r, v);
    }
  }
};

// ---- Q6_K ----

struct Q6k {
  using Block = BlockQ6K;
  static constexpr bool kReadsBsums = false;  // the reference reads only the q8 values

  struct alignas(64) Weights {
    int8_t w[3][4][1024];  // digit j, chunk c: (q - 32)·d_j
    float d[kTile];
  };
  struct alignas(64) Ints {
    int32_t c[3][256];
  };
  struct Index {};
  static Index index() { return {}; }

  // Bytes b (signed) times the small signed word constant d of their word, each product a signed byte:
  // the even and odd bytes sign-extended to words, multiplied, and put back in place.
  static __m512i times(__m512i even, __m512i odd, __m512i d) {
    const __m512i lo = _mm512_and_si512(_mm512_mullo_epi16(even, d), _mm512_set1_epi16(0x00FF));
    return _mm512_or_si512(lo, _mm512_slli_epi16(_mm512_mullo_epi16(odd, d), 8));
  }

  static void prepare(const WeightMatrix& w, int64_t o0, int n, int64_t kb, const Index&, Weights& wt) {
    const __m512i k32 = _mm512_set1_epi8(32), k3 = _mm512_set1_epi32(3), k7 = _mm512_set1_epi32(7);
    const __m512i low16 = _mm512_set1_epi32(0xFFFF);
    for (int i = 0; i < n; ++i) {
      const Block& a = *reinterpret_cast<const Block*>(weight_block(w, o0 + i, kb, sizeof(Block)));
      const Q6kWeights q = q6k_weights(a);
      // sc = d0 + 8·d1 + 64·d2 with every digit in [-3, 4]: d = ((v + 3) & 7) - 3, then v = (v - d) / 8.
      __m512i v = q.scales, digit[3];
      for (int j = 0; j < 3; ++j) {
        const __m512i d = _mm512_sub_epi32(_mm512_and_si512(_mm512_add_epi32(v, k3), k7), k3);
        v = _mm512_srai_epi32(_mm512_sub_epi32(v, d), 3);
        digit[j] = _mm512_or_si512(_mm512_and_si512(d, low16), _mm512_slli_epi32(d, 16));  // d in both words
      }
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        const __m512i x = _mm512_sub_epi8(q.w[c], k32);  // q - 32 in [-32, 31]
        const __m512i even = _mm512_srai_epi16(_mm512_slli_epi16(x, 8), 8), odd = _mm512_srai_epi16(x, 8);
        for (int j = 0; j < 3; ++j) _mm512_store_si512(wt.w[j][c] + 64 * i, times(even, odd, digit[j]));
      }
      wt.d[i] = _cvtsh_ss(a.d);
    }
    for (int j = 0; j < 3; ++j)
      for (int c = 0; c < 4; ++c) zero_rows(reinterpret_cast<uint8_t*>(wt.w[j][c]), n);
    for (int i = n; i < kTile; ++i) wt.d[i] = 0.0f;
  }

  // Twelve tdpbssd: C_0, C_1, C_2 over the four chunks.
  static void products(const Weights& w, const ActivationTiles& a, Ints& c) {
    _tile_zero(4);
    _tile_zero(5);
    _tile_zero(6);
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      _tile_loadd(0, a.q[k], 64);
      _tile_loadd(1, w.w[0][k], 64);
      _tile_loadd(2, w.w[1][k], 64);
      _tile_loadd(3, w.w[2][k], 64);
      _tile_dpbssd(4, 1, 0);
      _tile_dpbssd(5, 2, 0);
      _tile_dpbssd(6, 3, 0);
    }
    _tile_stored(4, c.c[0], 64);
    _tile_stored(5, c.c[1], 64);
    _tile_stored(6, c.c[2], 64);
  }

  // acc[16r + n] = fma(d·y.d, f32(A), acc), A = C_0 + 8·(C_1 + 8·C_2).
  static void f32_steps(const Weights& w, const float* da_rows, const Ints& c, float* acc) {
    const __m512 da = _mm512_load_ps(da_rows);
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) {
      const __m512i hi = _mm512_add_epi32(_mm512_load_si512(c.c[1] + 16 * r),
                                          _mm512_slli_epi32(_mm512_load_si512(c.c[2] + 16 * r), 3));
      const __m512i ai = _mm512_add_epi32(_mm512_load_si512(c.c[0] + 16 * r), _mm512_slli_epi32(hi, 3));
      const __m512 dd = _mm512_mul_ps(_mm512_set1_ps(w.d[r]), da);
      _mm512_store_ps(acc + 16 * r, _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(ai), _mm512_load_ps(acc + 16 * r)));
    }
  }
};

template <typename F>
bool matmul_rows_amx(const WeightMatrix& w, const uint8_t* x, uint64_t x_stride, int64_t n_rows, int64_t o_begin,
                     int64_t o_end, float* const* y) {
  const int64_t nkb = w.cols / kQK_K;
  if (n_rows <= 0 || o_end <= o_begin || nkb == 0) return true;
  if constexpr (F::kReadsBsums)
    for (int64_t t = 0; t < n_rows; ++t)
      for (int64_t kb = 0; kb < nkb; ++kb)
        if (!bsums_consistent(activation_row(x, x_stride, t)[kb])) return false;

  thread_local std::vector<ActivationTiles> acts;
  thread_local std::vector<AccTile> accs;
  thread_local typename F::Weights weights;
  thread_local typename F::Ints ints[2];
  const int64_t groups = (n_rows + kTile - 1) / kTile;
  acts.resize(size_t(kMaxGroups * nkb));  // [super-block][group]: a pass reads one super-block's in order
  accs.resize(size_t(kMaxGroups));
  const typename F::Index ix = F::index();

  configure_tiles();
  for (int64_t g0 = 0; g0 < groups; g0 += kMaxGroups) {
    const int64_t ng = std::min<int64_t>(kMaxGroups, groups - g0);
    for (int64_t g = 0; g < ng; ++g) {
      const int64_t t0 = (g0 + g) * kTile;
      prepare_activation_tiles(x, x_stride, t0, int(std::min<int64_t>(kTile, n_rows - t0)), nkb, &acts[size_t(g)],
                               kMaxGroups);
    }
    for (int64_t o0 = o_begin; o0 < o_end; o0 += kTile) {
      const int nw = int(std::min<int64_t>(kTile, o_end - o0));
      std::memset(static_cast<void*>(accs.data()), 0, size_t(ng) * sizeof(AccTile));
      // Super-block by super-block: its weight tiles stay in L1 while every group passes over them.
      for (int64_t kb = 0; kb < nkb; ++kb) {
        // The next block's rows of this super-block on their way to L2 (they come cold from memory).
        for (int i = 0; i < kTile; ++i) {
          const uintptr_t next = reinterpret_cast<uintptr_t>(w.data) + uint64_t(o0 + kTile + i) * w.row_stride +
                                 uint64_t(kb) * sizeof(typename F::Block);
#pragma GCC unroll 4
          for (uintptr_t b = 0; b < sizeof(typename F::Block); b += 64)
            _mm_prefetch(reinterpret_cast<const char*>(next + b), _MM_HINT_T1);
        }
        F::prepare(w, o0, nw, kb, ix, weights);
        // The f32 steps of group g - 1 run while the tiles form group g's integers (two buffers).
        const ActivationTiles* at = &acts[size_t(kb * kMaxGroups)];
        for (int64_t g = 0; g < ng; ++g) {
          F::products(weights, at[g], ints[g & 1]);
          if (g > 0) F::f32_steps(weights, at[g - 1].d, ints[(g - 1) & 1], accs[size_t(g - 1)].v);
        }
        F::f32_steps(weights, at[ng - 1].d, ints[(ng - 1) & 1], accs[size_t(ng - 1)].v);
      }
      const __mmask16 rows_mask = __mmask16((1u << nw) - 1);
      for (int64_t g = 0; g < ng; ++g) {
        __m512i out[16];
        for (int r = 0; r < 16; ++r) out[r] = _mm512_load_si512(accs[size_t(g)].v + 16 * r);
        transpose16x16(out);  // out[n]: the 16 weight rows' results for activation row n
        const int64_t t0 = (g0 + g) * kTile;
        const int nt = int(std::min<int64_t>(kTile, n_rows - t0));
        for (int n = 0; n < nt; ++n) _mm512_mask_storeu_ps(y[t0 + n] + o0, rows_mask, _mm512_castsi512_ps(out[n]));
      }
    }
  }
  _tile_release();
  return true;
}

}  // namespace

void amx_tile_peak_loop(int64_t iters) {
  alignas(64) static const uint8_t operand[1024] = {3};
  configure_tiles();
  _tile_loadd(0, operand, 64);
  _tile_loadd(1, operand, 64);
  _tile_zero(4);
  _tile_zero(5);
  _tile_zero(6);
  _tile_zero(7);
  for (int64_t it = 0; it < iters; ++it) {
    _tile_dpbusd(4, 1, 0);
    _tile_dpbusd(5, 1, 0);
    _tile_dpbusd(6, 1, 0);
    _tile_dpbusd(7, 1, 0);
  }
  _tile_release();
}

bool amx_matmul_rows(const WeightMatrix& w, const uint8_t* xprep, uint64_t x_stride, int64_t n_rows, int64_t o_begin,
                     int64_t o_end, float* const* y) {
  switch (w.type) {
    case GgmlType::Q4_K: return matmul_rows_amx<Q4k>(w, xprep, x_stride, n_rows, o_begin, o_end, y);
    case GgmlType::Q6_K: return matmul_rows_amx<Q6k>(w, xprep, x_stride, n_rows, o_begin, o_end, y);
    default: return false;
  }
}

}  // namespace essaim
