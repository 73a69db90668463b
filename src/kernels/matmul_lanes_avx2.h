// Q4_K and Q6_K products of several activation rows on AVX2 with one activation row per 32-bit lane (x86
// builds only; docs/kernels.md, "AVX2 lane-per-row products").
//
//   if (lanes_matmul_type(w.type) && n_rows >= lanes_min_rows(w.type) && lanes_enabled())
//     lanes_matmul_rows(w, xprep, x_stride, n_rows / 8 * 8, o_begin, o_end, y);   // then the rest
//     (or all n_rows where the last group has kLanesPadFrom rows or more)
//
// Same contract and same bits as matmul_rows over the dot kernels: y[t][o] = dot(w row o, row t) in the
// canonical order (per super-block the exact integer A — and Q4_K's M — then the fused f32 steps). Eight
// activation rows sit in the eight lanes of a vector and each weight dword meets them all, so every lane's
// sums are one row's and need no horizontal reduction.
#pragma once

#include <cstdint>

#include "core/ggml_type.h"
#include "kernels/matmul.h"

namespace essaim {

inline bool lanes_matmul_type(GgmlType t) { return t == GgmlType::Q4_K || t == GgmlType::Q6_K; }

// Products take groups of eight activation rows, from 8 rows for Q4_K and 16 for Q6_K: below that the dot
// kernels were faster (the weights are unpacked once per call and the activations transposed into lanes,
// which a few rows do not repay; Q6_K's eight-row dot kernel needs fewer operations than Q4_K's). Q6_K from
// 8 rows measured faster for its 3072 x 1024 products alone (kernels_bench: 107 -> 128 GFLOP/s at 8 rows)
// but made a whole pp512 of the qwen3moe file 2.7 % slower (alternating binaries, AMD EPYC Zen 5), so it
// stays at 16. Groups run in pairs (sixteen rows at once). A last partial group pads its lanes with zeros;
// matmul_rows gives it to the lanes from five rows on (pp512 1-2 % faster on the AMD EPYC, Zen 3, than the
// dot kernels for those rows; four or fewer: no gain).
inline constexpr int64_t kLanesGroup = 8;
inline constexpr int64_t kLanesPadFrom = 5;
inline int64_t lanes_min_rows(GgmlType t) { return t == GgmlType::Q6_K ? 16 : 8; }

// xprep: n_rows Q8_K activation rows of w.cols values in w.type's AVX2 layout (prepare_q8k_q45k_avx2,
// prepare_q8k_q6k_avx2), x_stride bytes apart; lanes_matmul_type(w.type). Requires AVX2, FMA and F16C.
void lanes_matmul_rows(const WeightMatrix& w, const uint8_t* xprep, uint64_t x_stride, int64_t n_rows,
                       int64_t o_begin, int64_t o_end, float* const* y);

}  // namespace essaim
