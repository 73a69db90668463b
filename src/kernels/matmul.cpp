// Matrix products over the kernel table (matmul.h).
//
// Work is split over output columns (weight rows) only, in tiles of weight rows small enough to stay in
// cache while every activation row passes over them, kDotMaxRows activation rows per kernel call. Neither
// the tile size, the thread count nor the batch changes how an element is computed: y[t][o] is always the
// dot kernel's canonical order over (weight row o, activation row t), which every variant and every nx
// reproduce bit for bit. Invariance comes from that construction, not from choosing sizes carefully.
#include "kernels/matmul.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/status.h"
#include "kernels/kernel_traits.h"
#if defined(ESSAIM_KERNELS_X86)
#include "kernels/dot_kernels.h"
#include "kernels/matmul_amx.h"
#include "kernels/matmul_lanes_avx2.h"
#include "kernels/matmul_rowlanes_avx512.h"
#endif

namespace essaim {
namespace {

// Weight bytes per tile: a few hundred KiB stays in L2 on every core we target while the activation rows
// (a handful of KiB per kernel call) stream through L1.
constexpr uint64_t kTileBytes = 192 * 1024;

const KernelTraits& weight_kernels(GgmlType type) {
  const KernelTraits* k = kernel_traits(type);
  ESSAIM_CHECK(k != nullptr && k->dot(Isa::SCALAR) != nullptr);
  return *k;
}

const KernelTraits& activation_kernels(GgmlType weight_type) {
  const KernelTraits* k = kernel_traits(weight_kernels(weight_type).vec_dot_type);
  ESSAIM_CHECK(k != nullptr && k->from_float != nullptr);
  return *k;
}

}  // namespace

bool matmul_type_supported(GgmlType weight_type) {
  const KernelTraits* k = kernel_traits(weight_type);
  return k != nullptr && k->dot(Isa::SCALAR) != nullptr;
}

uint64_t activation_row_bytes(GgmlType weight_type, int64_t cols) {
  const KernelTraits& a = activation_kernels(weight_type);
  ESSAIM_CHECK(cols >= 0 && cols % a.block_size == 0);
  return a.row_bytes(cols);
}

void quantize_activations(GgmlType weight_type, const float* x, int64_t n_rows, int64_t cols, uint8_t* dst) {
  const KernelTraits& a = activation_kernels(weight_type);
  const uint64_t row_bytes = activation_row_bytes(weight_type, cols);
  for (int64_t t = 0; t < n_rows; ++t) a.from_float(x + t * cols, dst + uint64_t(t) * row_bytes, cols);
}

namespace {

void check_weights(const WeightMatrix& w, const KernelTraits& k) {
  ESSAIM_CHECK(w.cols % k.block_size == 0 && w.rows >= 0);
  ESSAIM_CHECK(w.row_stride >= k.row_bytes(w.cols));
  // Blocks are read through their structs, so rows must keep the structs' alignment.
  ESSAIM_CHECK(reinterpret_cast<uintptr_t>(w.data) % k.alignment == 0 && w.row_stride % k.alignment == 0);
}

}  // namespace

const uint8_t* prepare_rows(GgmlType weight_type, const uint8_t* xq, int64_t n_rows, int64_t cols,
                            std::vector<uint8_t>& scratch) {
  const KernelTraits& k = weight_kernels(weight_type);
  const PrepareFn prepare = k.prepare_for(kernels_isa());
  if (prepare == nullptr || n_rows == 0) return xq;
  const uint64_t x_stride = activation_row_bytes(weight_type, cols);
  scratch.resize(x_stride * uint64_t(n_rows));
  for (int64_t t = 0; t < n_rows; ++t) prepare(xq + uint64_t(t) * x_stride, scratch.data() + uint64_t(t) * x_stride, cols);
  return scratch.data();
}

PrepareRowFn prepare_fn_for(GgmlType weight_type) { return weight_kernels(weight_type).prepare_for(kernels_isa()); }

bool prepare_layout_shared(GgmlType a, GgmlType b) {
  return weight_kernels(a).vec_dot_type == weight_kernels(b).vec_dot_type && prepare_fn_for(a) == prepare_fn_for(b);
}

namespace {

// Whether matmul_rows hands these rows to the AMX tiles (matmul_amx.h).
bool tiles_take(GgmlType type, int64_t n_rows) {
#if defined(ESSAIM_KERNELS_X86)
  return amx_matmul_type(type) && n_rows >= kAmxMinRows && amx_enabled();
#else
  (void)type;
  (void)n_rows;
  return false;
#endif
}

// Whether matmul_rows hands these rows to the AVX2 lane-per-row products (matmul_lanes_avx2.h).
bool lanes_take(GgmlType type, int64_t n_rows) {
#if defined(ESSAIM_KERNELS_X86)
  return lanes_matmul_type(type) && n_rows >= lanes_min_rows(type) && lanes_enabled();
#else
  (void)type;
  (void)n_rows;
  return false;
#endif
}

// Whether matmul_rows hands these rows to the AVX-512 row-lane products (matmul_rowlanes_avx512.h).
bool rowlanes_take(GgmlType type, int64_t n_rows) {
#if defined(ESSAIM_KERNELS_X86)
  return rowlanes_take_rows(type, n_rows) && rowlanes_enabled();
#else
  (void)type;
  (void)n_rows;
  return false;
#endif
}

// The four-weight-row kernel for one activation row (decode) of w's type under the current ISA; null where
// there is none (dot_kernels.h: AVX2 Q4_K and Q5_K).
using DotW4Fn = void (*)(int64_t n, const void* w, size_t w_stride, const void* x, float* y);
DotW4Fn one_row_by_four(GgmlType type) {
#if defined(ESSAIM_KERNELS_X86)
  if (kernels_isa() == Isa::AVX2) {
    if (type == GgmlType::Q4_K) return dot_q4k_w4_avx2;
    if (type == GgmlType::Q5_K) return dot_q5k_w4_avx2;
  }
#else
  (void)type;
#endif
  return nullptr;
}

// Whole 16-row blocks where there is room for one: the AMX path computes 16 weight rows per tile pass.
int64_t tile_multiple_of_16(int64_t rows) { return rows >= 16 ? rows / 16 * 16 : rows; }

}  // namespace

bool matmul_streams(const WeightMatrix& w, int64_t n_rows) {
  return n_rows <= kDotMaxRows && !tiles_take(w.type, n_rows) && !lanes_take(w.type, n_rows) &&
         !rowlanes_take(w.type, n_rows);
}

void matmul_share(int64_t rows, size_t parts, size_t i, int64_t* begin, int64_t* end) {
  const int64_t base = rows / int64_t(parts), extra = rows % int64_t(parts), k = int64_t(i);
  *begin = k * base + std::min(k, extra);
  *end = *begin + base + (k < extra ? 1 : 0);
}

int64_t matmul_piece_rows(const WeightMatrix& w, int64_t n_rows) {
  if (!matmul_streams(w, n_rows)) return matmul_tile_rows(w, n_rows);
  constexpr uint64_t kPieceBytes = 32 * 1024;
  return std::max<int64_t>(4, int64_t(kPieceBytes / std::max<uint64_t>(w.row_stride, 1)) / 4 * 4);
}

int64_t matmul_tile_rows(const WeightMatrix& w, int64_t n_rows) {
  // The AMX tiles and the AVX2 lanes prepare their weights per 16 rows and transpose the activations once
  // per call: fewer, larger tasks.
  if (tiles_take(w.type, n_rows) || lanes_take(w.type, n_rows)) return 256;
  return tile_multiple_of_16(std::clamp<int64_t>(int64_t(kTileBytes / std::max<uint64_t>(w.row_stride, 1)), 4, 512));
}

void matmul_rows(const WeightMatrix& w, const uint8_t* xq, int64_t n_rows, int64_t o_begin, int64_t o_end,
                 float* const* y) {
  const KernelTraits& k = weight_kernels(w.type);
  const VecDotFn dot = k.dot(kernels_isa());
  const uint64_t x_stride = activation_row_bytes(w.type, w.cols);
#if defined(ESSAIM_KERNELS_X86)
  // Same bits from the tiles (matmul_amx.h); Q4_K's decline rows whose bsums are not their values' sums.
  if (tiles_take(w.type, n_rows) && amx_matmul_rows(w, xq, x_stride, n_rows, o_begin, o_end, y)) return;
  // Every row at once in the AVX-512 row lanes (matmul_rowlanes_avx512.h): no group size to pad to.
  if (rowlanes_take(w.type, n_rows)) return rowlanes_matmul_rows(w, xq, x_stride, n_rows, o_begin, o_end, y);
  // Whole groups of eight rows in the AVX2 lanes (matmul_lanes_avx2.h) — and a last group of five to seven
  // rows padded with zeros (kLanesPadFrom) — the rest on the dot kernels.
  int64_t t_begin = 0;
  if (lanes_take(w.type, n_rows)) {
    t_begin = n_rows / kLanesGroup * kLanesGroup;
    if (n_rows - t_begin >= kLanesPadFrom) t_begin = n_rows;
    lanes_matmul_rows(w, xq, x_stride, t_begin, o_begin, o_end, y);
  }
#else
  const int64_t t_begin = 0;
#endif
  const DotW4Fn by_four = one_row_by_four(w.type);
  for (int64_t t = t_begin; t < n_rows; t += kDotMaxRows) {
    const int nx = int(std::min<int64_t>(kDotMaxRows, n_rows - t));
    const uint8_t* x_rows = xq + uint64_t(t) * x_stride;
    int64_t o = o_begin;
    // One activation row: four weight rows per call where a kernel takes them (same bits as one by one).
    if (nx == 1 && by_four != nullptr)
      for (; o + 4 <= o_end; o += 4) {
        float out[4];
        by_four(w.cols, w.data + uint64_t(o) * w.row_stride, w.row_stride, x_rows, out);
        for (int r = 0; r < 4; ++r) y[t][o + r] = out[r];
      }
    for (; o < o_end; ++o) {
      // No prefetch here: the one-row kernels hint their own stream ahead where that measured faster
      // (weight_prefetch_bytes, docs/kernels.md); prefetching whole rows 4 ahead from this loop cost 10-40 %
      // of the cold one-row rate on the AMD EPYC measured and ~12 % of tg64.
      float out[kDotMaxRows];
      dot(w.cols, w.data + uint64_t(o) * w.row_stride, x_rows, x_stride, nx, out);
      for (int j = 0; j < nx; ++j) y[t + j][o] = out[j];
    }
  }
}

void matmul_preq(const WeightMatrix& w, const uint8_t* xq, int64_t n_rows, float* y, ThreadPool* pool) {
  const KernelTraits& k = weight_kernels(w.type);
  check_weights(w, k);
  ESSAIM_CHECK(n_rows >= 0);
  ESSAIM_CHECK(reinterpret_cast<uintptr_t>(xq) % activation_kernels(w.type).alignment == 0);
  if (w.rows == 0 || n_rows == 0) return;

  const uint64_t x_stride = activation_row_bytes(w.type, w.cols);
  // Kernels that read their own activation layout get it once here, not once per weight row.
  std::vector<uint8_t> prepared;
  if (const PrepareFn prepare = k.prepare_for(kernels_isa())) {
    prepared.resize(x_stride * uint64_t(n_rows));
    parallel_for(pool, size_t(n_rows), [&](size_t begin, size_t end) {
      for (size_t t = begin; t < end; ++t) prepare(xq + t * x_stride, prepared.data() + t * x_stride, w.cols);
    });
    xq = prepared.data();
  }
  std::vector<float*> y_rows(static_cast<size_t>(n_rows));
  for (int64_t t = 0; t < n_rows; ++t) y_rows[size_t(t)] = y + t * w.rows;
  // Stream pieces (matmul_piece_rows), or at most kTileBytes of weights per tile and at least four tiles per
  // thread so that the threads' ranges of whole tiles balance.
  const int64_t threads = pool != nullptr ? int64_t(pool->size()) : 1;
  const bool streams = matmul_streams(w, n_rows);
  const int64_t by_threads = (w.rows + 4 * threads - 1) / (4 * threads);
  const int64_t piece =
      streams ? matmul_piece_rows(w, n_rows)
              : tile_multiple_of_16(std::clamp<int64_t>(std::min(matmul_tile_rows(w, n_rows), by_threads), 4, 512));
  const int64_t n_pieces = (w.rows + piece - 1) / piece;

  parallel_for(pool, size_t(n_pieces), [&](size_t p_begin, size_t p_end) {
    if (streams)  // consecutive pieces are one stream
      return matmul_rows(w, xq, n_rows, int64_t(p_begin) * piece, std::min(w.rows, int64_t(p_end) * piece),
                         y_rows.data());
    for (int64_t ti = int64_t(p_begin); ti < int64_t(p_end); ++ti) {
      const int64_t o_begin = ti * piece, o_end = std::min(w.rows, o_begin + piece);
      matmul_rows(w, xq, n_rows, o_begin, o_end, y_rows.data());
    }
  });
}

void matmul(const WeightMatrix& w, const float* x, int64_t n_rows, float* y, ThreadPool* pool) {
  const KernelTraits& a = activation_kernels(w.type);
  const uint64_t row_bytes = activation_row_bytes(w.type, w.cols);
  std::vector<uint8_t> xq(row_bytes * uint64_t(n_rows));
  // Rows are converted independently, so splitting them over threads cannot change their bytes.
  parallel_for(pool, size_t(n_rows), [&](size_t begin, size_t end) {
    for (size_t t = begin; t < end; ++t) a.from_float(x + t * uint64_t(w.cols), xq.data() + t * row_bytes, w.cols);
  });
  matmul_preq(w, xq.data(), n_rows, y, pool);
}

void matmul_set(std::span<const MatmulOut> outs, const float* x, int64_t n_rows, ThreadPool* pool) {
  ESSAIM_CHECK(n_rows >= 0);
  if (outs.empty() || n_rows == 0) return;
  const int64_t cols = outs[0].w->cols;
  // Activation rows in each distinct (vec_dot format, kernel layout); matrices that read the same share one.
  struct Input {
    GgmlType weight_type;  // of the first matrix reading these rows
    std::vector<uint8_t> q, prepared;
    const uint8_t* rows = nullptr;
  };
  std::vector<Input> inputs;
  std::vector<size_t> input_of(outs.size());
  for (size_t j = 0; j < outs.size(); ++j) {
    const WeightMatrix& w = *outs[j].w;
    check_weights(w, weight_kernels(w.type));
    ESSAIM_CHECK(w.cols == cols);
    size_t i = 0;
    while (i < inputs.size() && !prepare_layout_shared(inputs[i].weight_type, w.type)) ++i;
    if (i == inputs.size()) inputs.push_back(Input{.weight_type = w.type, .q = {}, .prepared = {}, .rows = nullptr});
    input_of[j] = i;
  }
  for (Input& in : inputs) {
    const KernelTraits& a = activation_kernels(in.weight_type);
    const PrepareFn prepare = prepare_fn_for(in.weight_type);
    const uint64_t row_bytes = activation_row_bytes(in.weight_type, cols);
    // Conversion and layout are per row, so where a row is converted changes none of its bytes.
    in.q.resize(row_bytes * uint64_t(n_rows));
    if (prepare) in.prepared.resize(in.q.size());
    parallel_for(pool, size_t(n_rows), [&](size_t begin, size_t end) {
      for (size_t t = begin; t < end; ++t) {
        a.from_float(x + t * uint64_t(cols), in.q.data() + t * row_bytes, cols);
        if (prepare) prepare(in.q.data() + t * row_bytes, in.prepared.data() + t * row_bytes, cols);
      }
    });
    in.rows = prepare ? in.prepared.data() : in.q.data();
  }

  std::vector<std::vector<float*>> y_rows(outs.size());
  for (size_t j = 0; j < outs.size(); ++j) {
    y_rows[j].resize(size_t(n_rows));
    for (int64_t t = 0; t < n_rows; ++t) y_rows[j][size_t(t)] = outs[j].y + t * outs[j].w->rows;
  }
  const size_t threads = pool != nullptr ? pool->size() : 1;
  // Thread i's range is the i-th contiguous share of every matrix's rows, in pieces (matmul_piece_rows).
  // Equal shares of each matrix rather than equal bytes of their concatenation, which measured slower
  // (qwen35moe tg64 29.5 vs 31.9 tok/s against separate products, 3 rounds), likely because the types in one
  // set (Q4_K, Q6_K, F32) cost differently per byte and the byte split left one thread waiting at the end.
  struct Piece {
    uint32_t j;  // matrix
    int64_t o_begin, o_end;
  };
  std::vector<Piece> pieces;
  for (size_t i = 0; i < threads; ++i)
    for (size_t j = 0; j < outs.size(); ++j) {
      const WeightMatrix& w = *outs[j].w;
      int64_t o_begin, o_end;
      matmul_share(w.rows, threads, i, &o_begin, &o_end);
      const int64_t step = matmul_piece_rows(w, n_rows);
      for (int64_t o = o_begin; o < o_end; o += step) pieces.push_back({uint32_t(j), o, std::min(o_end, o + step)});
    }
  parallel_for(pool, pieces.size(), [&](size_t begin, size_t end) {
    for (size_t p = begin; p < end;) {
      const Piece& first = pieces[p];
      const WeightMatrix& w = *outs[first.j].w;
      int64_t o_end = first.o_end;
      // Consecutive stream pieces of one matrix run as one call (a tile stays one call: its rows are reused).
      if (matmul_streams(w, n_rows))
        while (p + 1 < end && pieces[p + 1].j == first.j && pieces[p + 1].o_begin == o_end) o_end = pieces[++p].o_end;
      ++p;
      matmul_rows(w, inputs[input_of[first.j]].rows, n_rows, first.o_begin, o_end, y_rows[first.j].data());
    }
  });
}

}  // namespace essaim
