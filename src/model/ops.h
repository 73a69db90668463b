// Shared numeric primitives of the forward pass, exactly as docs/reference.md 4.3 specifies them. Every
// function computes each output from its own row with a fixed operation order, so results never depend
// on batching or threads (docs/invariants.md invariant 2). Architecture files call these; they never re-derive them.
//
//   rms_norm_rows(x, w, n_rows, n, eps, y);                 // y[r] = (x[r] * r) * w
//   rope_cos_sin(pos, n_rot, base, cs.data());              // [n_rot/2 cos | n_rot/2 sin]
//   rope_neox(head, n_rot, cs.data());                      // rotates head[0..n_rot), pairs (i, i + n_rot/2)
//   float d = dot_f32(a, b, n);                             // fixed 8-lane order
#pragma once

#include <cstdint>

#include "core/thread_pool.h"

namespace essaim {

// RMSNorm of one vector: s = Σ x_i² (squares in f32, sum in f64); mean = f32(s / n);
// r = 1 / sqrtf(mean + eps); y_i = (x_i · r) · w_i. x and y may alias.
void rms_norm(const float* x, const float* w, int64_t n, float eps, float* y);
// Row-wise operations over fewer values than this (n_rows · n) run on the calling thread: a parallel loop
// costs a wake-up and a barrier, more than normalising a decode step's heads (a few thousand floats).
constexpr int64_t kParallelFloats = int64_t(1) << 15;

// n_rows independent rows of n values ([n_rows][n]), parallel over rows when a pool is given and there are
// at least kParallelFloats values.
void rms_norm_rows(const float* x, const float* w, int64_t n_rows, int64_t n, float eps, float* y,
                   ThreadPool* pool = nullptr);

// RoPE angles for one position: θs = powf(base, -2 / n_rot); t_0 = f32(pos); t_{i+1} = t_i · θs (f32,
// iterative); cs[i] = cosf(t_i), cs[n_rot/2 + i] = sinf(t_i) for i < n_rot/2. cs holds n_rot floats.
void rope_cos_sin(int32_t pos, int32_t n_rot, float base, float* cs);
// NEOX rotation of one head vector in place: pair i with i + n_rot/2 for i < n_rot/2; dimensions ≥ n_rot
// are untouched (partial rotary). x'[i] = a·c − b·s, x'[i + n_rot/2] = a·s + b·c, each product rounded.
void rope_neox(float* x, int32_t n_rot, const float* cs);

// Σ a_i·b_i in f32 with a fixed order: lane l (0..7) sums the products of indices ≡ l (mod 8) in index
// order, then ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)). Products and sums are separately rounded (no FMA), so
// every ISA gives the same bits.
float dot_f32(const float* a, const float* b, int64_t n);

// y[i] += a · x[i] (product rounded, then the sum), for n values.
void axpy_f32(float a, const float* x, float* y, int64_t n);

// out[r] = dot_f32(a, b + r·stride, n) for r < n_b, bit for bit: several independent dots at once, so one
// dot's chain of dependent adds no longer bounds the speed (attention's scores of a query against a block of
// keys).
void dot_f32_rows(const float* a, const float* b, int64_t stride, int64_t n_b, int64_t n, float* out);

// axpy_f32(s[r], x + r·stride, y, n) for r = 0 .. n_x - 1 in that order, bit for bit, with y held in
// registers across the rows (attention's o += p_j · v_j over a block of values).
void axpy_f32_rows(const float* s, const float* x, int64_t stride, int64_t n_x, float* y, int64_t n);

// dot_f32_rows for two queries against the same rows (out0 from a0, out1 from a1), bit for bit: each
// row's load serves both (attention's query heads that share a KV head).
void dot_f32_rows2(const float* a0, const float* a1, const float* b, int64_t stride, int64_t n_b, int64_t n,
                   float* out0, float* out1);

// axpy_f32_rows for two outputs over the same rows (y0 with s0, y1 with s1), bit for bit.
void axpy_f32_rows2(const float* s0, const float* s1, const float* x, int64_t stride, int64_t n_x, float* y0,
                    float* y1, int64_t n);

// dot_f32_rows for four queries against the same rows (out[q] from a[q]), bit for bit.
void dot_f32_rows4(const float* const a[4], const float* b, int64_t stride, int64_t n_b, int64_t n, float* const out[4]);

// axpy_f32_rows for four outputs over the same rows (y[q] with s[q]), bit for bit: each row's load of x
// serves four outputs (attention's heads of one KV head, four at a time).
void axpy_f32_rows4(const float* const s[4], const float* x, int64_t stride, int64_t n_x, float* const y[4], int64_t n);

// y[i] = y[i] + x[i]: residual additions.
void add_f32(float* y, const float* x, int64_t n);

}  // namespace essaim
