// Matrix products of a quantised weight matrix with f32 activation rows — the only way model and expert
// code multiply by weights.
//
//   WeightMatrix w{.type = GgmlType::Q4_K, .cols = 3072, .rows = 1024, .data = bytes, .row_stride = rb};
//   matmul(w, x /* [n_tok][3072] f32 */, n_tok, y /* [n_tok][1024] */, &pool);
//
// Semantics (docs/reference.md 2.5 / 4.3): each activation row is converted to w's vec_dot type on its own
// (quantise_activations), then y[t][o] = dot(w row o, x row t). Every output element is computed by the same
// code in the same order whatever the batch size, the row's position in the batch, the thread count or the
// ISA chosen: results are bit-identical across all of them (docs/invariants.md invariant 2).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/ggml_type.h"
#include "core/thread_pool.h"

namespace essaim {

struct WeightMatrix {
  GgmlType type = GgmlType::F32;
  int64_t cols = 0;              // ne[0]: input width
  int64_t rows = 0;              // ne[1]: output width
  const uint8_t* data = nullptr; // row o at data + o * row_stride
  uint64_t row_stride = 0;       // bytes; = type_traits(type).row_bytes(cols)
};

// True when weights of this type can be multiplied (F32 F16 BF16 Q8_0 Q4_K Q5_K Q6_K); Q8_K, an
// activation-only format, and types without kernels are not. Validate file tensors with this before
// building a WeightMatrix: the functions below treat a wrong type as a programming error.
bool matmul_type_supported(GgmlType weight_type);

// Bytes one activation row of `cols` floats occupies in w.type's vec_dot format.
uint64_t activation_row_bytes(GgmlType weight_type, int64_t cols);

// Converts n_rows f32 rows of `cols` values into weight_type's vec_dot format, row after row
// (dst holds n_rows * activation_row_bytes). Per row and per block, so independent of batching.
void quantize_activations(GgmlType weight_type, const float* x, int64_t n_rows, int64_t cols, uint8_t* dst);

// y[n_rows][w.rows] = x[n_rows][w.cols] * w^T, activations already in w's vec_dot format.
void matmul_preq(const WeightMatrix& w, const uint8_t* xq, int64_t n_rows, float* y, ThreadPool* pool);

// The two halves of matmul_preq, for callers that schedule several products as one set of tasks (the
// expert FFN runs every expert of a layer that way, with no barrier per matrix):
//
//   std::vector<uint8_t> scratch;
//   const uint8_t* xp = prepare_rows(w.type, xq, n, w.cols, scratch);     // once per set of rows
//   matmul_rows(w, xp, n, o_begin, o_end, y_rows);                         // any range, any thread
//
// prepare_rows returns the rows in the layout the current ISA's kernel reads (xq itself, or `scratch`
// filled). matmul_rows computes weight rows [o_begin, o_end) for all n rows on the calling thread:
// y_rows[t][o] = dot(w row o, row t), by exactly the code matmul_preq runs, so any split of the output
// rows over tasks gives the same bits.
const uint8_t* prepare_rows(GgmlType weight_type, const uint8_t* xq, int64_t n_rows, int64_t cols,
                            std::vector<uint8_t>& scratch);
void matmul_rows(const WeightMatrix& w, const uint8_t* xprep, int64_t n_rows, int64_t o_begin, int64_t o_end,
                 float* const* y_rows);
// The activation layout function the current ISA's kernel for weight_type reads (null: the plain format),
// and whether two weight types read their activations in one layout (so one prepared copy serves both).
using PrepareRowFn = void (*)(const void* x, void* out, int64_t n);
PrepareRowFn prepare_fn_for(GgmlType weight_type);
bool prepare_layout_shared(GgmlType a, GgmlType b);
// Weight rows per task that keep a tile of w in L2 while n_rows activation rows pass over it (the AMX
// path, which prepares 16 weight rows at a time whatever the tile, takes 256 to prepare its activation
// tiles fewer times). A multiple of 16 from 16 rows on.
int64_t matmul_tile_rows(const WeightMatrix& w, int64_t n_rows = 1);
// Weight rows per piece of a parallel product (ThreadPool::parallel_for balances pieces between threads).
// matmul_tile_rows where activation rows reuse a tile from cache. Where they cannot — a few activation
// rows on the dot kernels, decode — each weight byte is read once and tiles buy nothing: then pieces of
// about 32 KiB (a multiple of 4 rows), so a thread done early can take small pieces of another's share,
// and callers run consecutive pieces of one matrix as one matmul_rows call (one stream, no per-piece cost).
int64_t matmul_piece_rows(const WeightMatrix& w, int64_t n_rows);
// Whether matmul_piece_rows gives stream pieces (true) or cache tiles for these rows.
bool matmul_streams(const WeightMatrix& w, int64_t n_rows);
// Share i of `parts` contiguous shares of rows [0, rows) (the first rows % parts shares one row longer):
// [*begin, *end). The products give thread i share i of every matrix.
void matmul_share(int64_t rows, size_t parts, size_t i, int64_t* begin, int64_t* end);

// Convenience: quantise_activations + matmul_preq.
void matmul(const WeightMatrix& w, const float* x, int64_t n_rows, float* y, ThreadPool* pool);

// Several products of the same activation rows as ONE parallel task set (one wake-up and one barrier
// instead of one per matrix): the q, k and v projections, Gated DeltaNet's input projections, a shared
// expert's gate and up.
//
//   const MatmulOut outs[] = {{&wq, q}, {&wk, k}, {&wv, v}};
//   matmul_set(outs, x, n_tok, &pool);      // same bits as matmul(wq, x, n_tok, q, &pool), etc.
//
// x is converted once per distinct activation format. Thread i's range is the i-th contiguous share of
// every matrix's weight rows, in pieces, so each thread streams its own stretch of each matrix, the shares
// cost the same whatever the types, and a thread done early takes pieces from the end of another's range.
// Each y[t][o] is computed by matmul_rows exactly as matmul computes it.
struct MatmulOut {
  const WeightMatrix* w;
  float* y;  // [n_rows][w->rows]
};
void matmul_set(std::span<const MatmulOut> outs, const float* x, int64_t n_rows, ThreadPool* pool);

}  // namespace essaim
