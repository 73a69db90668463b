// Q4_K and Q6_K products of several activation rows on AVX-512 VNNI with one WEIGHT row per 32-bit lane (x86 builds
// only; docs/kernels.md, "AVX-512 row-lane products").
//
//   if (rowlanes_take_rows(w.type, n_rows) && rowlanes_enabled())
//     rowlanes_matmul_rows(w, xprep, x_stride, n_rows, o_begin, o_end, y);
//
// Same contract and same bits as matmul_rows over the dot kernels: y[t][o] = dot(w row o, row t) in the
// canonical order (per super-block the exact integers A and M, then the two fused f32 steps). Sixteen
// weight rows are transposed into the sixteen lanes of a vector once per call, and every activation dword
// is broadcast against all of them, so each lane's sums are one weight row's: no horizontal reduction, no
// padding of the activation rows (any count runs at full width), and each activation row's sixteen results
// are one contiguous store.
#pragma once

#include <cstdint>

#include "core/ggml_type.h"
#include "kernels/matmul.h"

namespace essaim {

inline bool rowlanes_matmul_type(GgmlType t) { return t == GgmlType::Q4_K || t == GgmlType::Q6_K; }

// Whether the row lanes take a product of n_rows activation rows. With a few rows the transposition of the
// weights (once per call) and the dot kernels' cheaper streams of cold weights leave them level or behind
// (paired cold runs on the AMD EPYC, Zen 5, dot kernels' time / row lanes': Q4_K 0.92-1.05 at 2-8 rows, 1.3
// from 12; Q6_K, whose preparation costs more, 0.78 at 8, 1.04 at 12-16, 1.16 at 24, 1.3 at 64). One Q4_K
// row (decode) has a form of its own that stores nothing and streams ahead: 1.5x the one-row dot kernel.
// docs/kernels.md has the measurements.
inline bool rowlanes_take_rows(GgmlType t, int64_t n_rows) {
  if (t == GgmlType::Q4_K) return n_rows == 1 || n_rows >= 8;
  return t == GgmlType::Q6_K && n_rows >= 16;
}

// xprep: n_rows Q8_K activation rows of w.cols values in w.type's AVX-512 layout (prepare_q8k_q45k_avx512,
// prepare_q8k_q6k_avx512), x_stride bytes apart; rowlanes_matmul_type(w.type). Requires AVX-512 F/BW/VL/VNNI and F16C.
void rowlanes_matmul_rows(const WeightMatrix& w, const uint8_t* xprep, uint64_t x_stride, int64_t n_rows,
                          int64_t o_begin, int64_t o_end, float* const* y);

}  // namespace essaim
