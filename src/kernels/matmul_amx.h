// Q4_K products of many activation rows on Intel AMX tiles (x86 builds only; docs/kernels.md, "AMX tiles").
//
//   if (amx_enabled() && n_rows >= kAmxMinRows)
//     done = q4k_matmul_rows_amx(w, xprep, x_stride, n_rows, o_begin, o_end, y);   // false: use the dot kernels
//
// Same contract and same bits as matmul_rows over the Q4_K dot kernels: y[t][o] = dot(w row o, row t) in the
// canonical order (per super-block the exact integers A and M, then two fused f32 steps). The tiles only
// form the integers: A = 8·Σ (q·(sc >> 3))·q8 + Σ (q·(sc & 7))·q8 and M = Σ m·q8, exact int32 sums whatever
// their order. M from the q8 values equals the reference's Σ bsums·m only when every bsum is the sum of its
// sixteen values, which holds for every row essaim quantises; rows received from elsewhere are checked, and
// a call with one inconsistent row returns false without writing anything.
#pragma once

#include <cstdint>

#include "kernels/matmul.h"

namespace essaim {

// Fewer activation rows than this go to the dot kernels: a tile pass costs as much for 1 row as for 16.
inline constexpr int64_t kAmxMinRows = 4;

// xprep: n_rows activation rows of w.cols values in the AVX-512 Q4_K layout (prepare_q8k_q45k_avx512),
// x_stride bytes apart. Requires amx_supported() (kernel_traits.h).
bool q4k_matmul_rows_amx(const WeightMatrix& w, const uint8_t* xprep, uint64_t x_stride, int64_t n_rows,
                         int64_t o_begin, int64_t o_end, float* const* y);

}  // namespace essaim
