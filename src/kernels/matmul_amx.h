// Q4_K and Q6_K products of many activation rows on Intel AMX tiles (x86 builds only; docs/kernels.md,
// "AMX tiles").
//
//   if (amx_matmul_type(w.type) && n_rows >= kAmxMinRows && amx_enabled())
//     done = amx_matmul_rows(w, xprep, x_stride, n_rows, o_begin, o_end, y);   // false: use the dot kernels
//
// Same contract and same bits as matmul_rows over the dot kernels: y[t][o] = dot(w row o, row t) in the
// canonical order (per super-block the exact integer A — and Q4_K's M — then the fused f32 steps). The
// tiles only form exact int32 sums whatever their order; how A and M are rebuilt from them is in
// matmul_amx.cpp. Q4_K's M comes from the q8 values, which equals the reference's Σ bsums·m only when every
// bsum is the sum of its sixteen values: true for every row essaim quantises; rows received from elsewhere
// are checked, and a call with one inconsistent row returns false without writing anything. (Q6_K's
// reference reads only the q8 values.)
#pragma once

#include <cstdint>

#include "core/ggml_type.h"
#include "kernels/matmul.h"

namespace essaim {

// Fewer activation rows than this go to the dot kernels: a tile pass costs as much for 1 row as for 16.
inline constexpr int64_t kAmxMinRows = 4;

inline bool amx_matmul_type(GgmlType t) { return t == GgmlType::Q4_K || t == GgmlType::Q6_K; }

// xprep: n_rows activation rows of w.cols values in w.type's AVX-512 layout (prepare_q8k_q45k_avx512,
// prepare_q8k_q6k_avx512), x_stride bytes apart. Requires amx_supported() (kernel_traits.h) and
// amx_matmul_type(w.type).
bool amx_matmul_rows(const WeightMatrix& w, const uint8_t* xprep, uint64_t x_stride, int64_t n_rows,
                     int64_t o_begin, int64_t o_end, float* const* y);

// For benchmarks: 4·iters tdpbusd on the calling thread, register tiles only (the tiles' int8 peak is
// 4·iters·16·16·64·2 operations over the time it takes).
void amx_tile_peak_loop(int64_t iters);

}  // namespace essaim
