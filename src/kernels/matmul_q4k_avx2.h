// Q4_K products of several activation rows on AVX2 with one activation row per 32-bit lane (x86 builds
// only; docs/kernels.md, "AVX2 lane-per-row Q4_K products").
//
//   if (kernels_isa() == Isa::AVX2 && w.type == GgmlType::Q4_K && n_rows >= kQ4kLanesMinRows)
//     q4k_lanes_matmul_rows(w, xprep, x_stride, n_rows / 8 * 8, o_begin, o_end, y);   // then the rest
//
// Same contract and same bits as matmul_rows over the dot kernels: y[t][o] = dot(w row o, row t) in the
// canonical order (per super-block the exact integers A and M, then acc = fma(d·y.d, A, acc) and
// acc = fma(-dmin·y.d, M, acc)). Eight activation rows sit in the eight lanes of a vector and each weight
// dword is broadcast against them, so every lane's sums are one row's and need no horizontal reduction.
#pragma once

#include <cstdint>

#include "kernels/matmul.h"

namespace essaim {

// Products take whole groups of eight activation rows (a partial group would pad its lanes with zeros, which
// measured slower than the dot kernels for the rest); fewer go to the dot kernels: the weights are unpacked
// once per call and the activations transposed into lanes, which a few rows do not repay.
inline constexpr int64_t kQ4kLanesMinRows = 8;

// xprep: n_rows Q8_K activation rows of w.cols values in the AVX2 Q4_K layout (prepare_q8k_q45k_avx2),
// x_stride bytes apart; w.type must be Q4_K. Requires AVX2, FMA and F16C.
void q4k_lanes_matmul_rows(const WeightMatrix& w, const uint8_t* xprep, uint64_t x_stride, int64_t n_rows,
                           int64_t o_begin, int64_t o_end, float* const* y);

}  // namespace essaim
