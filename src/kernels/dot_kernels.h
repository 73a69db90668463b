// Internal: every dot-product kernel by type and instruction set, and the reductions they share. Only the
// kernel table (kernel_traits.cpp) and tests name these directly; everything else goes through the table.
//
// Naming follows ggml: vec_dot_<weight>_<activation>_<isa>. All share VecDotFn's contract:
// y[j] = dot(w, x + j * x_stride) for j < nx <= kDotMaxRows, n elements, bit-identical across variants.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace essaim {

#define ESSAIM_DECLARE_DOTS(name)                                                                     \
  void name##_scalar(int64_t n, const void* w, const void* x, size_t x_stride, int nx, float* y);     \
  void name##_avx2(int64_t n, const void* w, const void* x, size_t x_stride, int nx, float* y);       \
  void name##_avx512(int64_t n, const void* w, const void* x, size_t x_stride, int nx, float* y);     \
  void name##_neon(int64_t n, const void* w, const void* x, size_t x_stride, int nx, float* y);

ESSAIM_DECLARE_DOTS(vec_dot_f32_f32)
ESSAIM_DECLARE_DOTS(vec_dot_f16_f16)
ESSAIM_DECLARE_DOTS(vec_dot_bf16_bf16)
ESSAIM_DECLARE_DOTS(vec_dot_q8_0_q8_0)
ESSAIM_DECLARE_DOTS(vec_dot_q4k_q8k)
ESSAIM_DECLARE_DOTS(vec_dot_q5k_q8k)
ESSAIM_DECLARE_DOTS(vec_dot_q6k_q8k)

#undef ESSAIM_DECLARE_DOTS

// weight_prefetch_bytes() (kernel_traits.h), read by the decode kernels once per call.
extern std::atomic<int64_t> g_weight_prefetch_bytes;

// Prefetch hints for the part of a weight stream a one-row kernel reaches later: the cache lines of
// [p + ahead, p + ahead + bytes) into L1 and those of [p + 4·ahead, p + 4·ahead + bytes) into L2 (the far
// hints keep more misses in flight than the near ones alone; docs/kernels.md). The addresses are formed
// as integers, since they may lie past the buffer, where a hint is harmless.
// (always_inline: a call GCC judges free of side effects, which prefetches are to it, can be dropped.)
__attribute__((always_inline)) inline void prefetch_weights_ahead(const void* p, size_t bytes, int64_t ahead) {
  const uintptr_t near = reinterpret_cast<uintptr_t>(p) + uintptr_t(ahead), far = near + 3 * uintptr_t(ahead);
  for (uintptr_t o = 0; o < bytes; o += 64) {
    __builtin_prefetch(reinterpret_cast<const void*>(near + o), 0, 3);
    __builtin_prefetch(reinterpret_cast<const void*>(far + o), 0, 2);
  }
}

// AArch64 dot-product extension (SDOT): only where it changes the integer work; the other types use their
// NEON kernel under that ISA too (KernelTraits::dot falls back to the next narrower variant).
void vec_dot_q8_0_q8_0_dotprod(int64_t n, const void* w, const void* x, size_t x_stride, int nx, float* y);
void vec_dot_q4k_q8k_dotprod(int64_t n, const void* w, const void* x, size_t x_stride, int nx, float* y);
void vec_dot_q5k_q8k_dotprod(int64_t n, const void* w, const void* x, size_t x_stride, int nx, float* y);

// Four consecutive weight rows (w_stride bytes apart) against one prepared activation row (decode), AVX2
// Q4_K / Q5_K (q45k_avx2 layout): y[r] bit for bit vec_dot's one-row result for row r.
void dot_q4k_w4_avx2(int64_t n, const void* w, size_t w_stride, const void* x, float* y);
void dot_q5k_w4_avx2(int64_t n, const void* w, size_t w_stride, const void* x, float* y);

// Activation layouts (PrepareFn) of the SIMD K-quant kernels, on Q8_K rows:
//   q6k_avx2: qs as they are, bsums recomputed from qs (AVX2 Q6_K);
//   q45k_avx512: per super-block the 8x8 matrix of 4-byte groups transposed: group i (elements 4i..4i+3)
//   of sub-block s at byte 32i + 4s, so each 64 bytes hold two groups of all eight sub-blocks (AVX-512
//   Q4_K/Q5_K, dot_q45k_avx512.cpp; docs/kernels.md).
//   q8_0_group8 (Q8_0 rows, AVX2 and AVX-512 Q8_0): every 8 blocks as [8 x f16 d][8 x 32 qs], so the eight
//   scales are one load; blocks after the last full group of eight stay as they are.
void prepare_q8k_q6k_avx2(const void* x, void* out, int64_t n);
void prepare_q8k_q45k_avx512(const void* x, void* out, int64_t n);
//   q6k_avx512: per super-block qs as four 64-byte vectors, dword p of vector i holding elements 4i..4i+3
//   of sub-block 4(p % 4) + p / 4 (a 4x4 dword transpose in every 128-bit lane); bsums[p] = -(sum of the
//   qs of that sub-block), recomputed (AVX-512 Q6_K, dot_q6k_avx512.cpp).
void prepare_q8k_q6k_avx512(const void* x, void* out, int64_t n);
//   q45k_avx2: per 64 bytes the two 32-byte halves interleaved by 16-bit words (AVX2 Q4_K/Q5_K).
void prepare_q8k_q45k_avx2(const void* x, void* out, int64_t n);
void prepare_q8_0_group8(const void* x, void* out, int64_t n);

// quantize_row_q8k on AVX2 (quant_q8k_avx2.cpp): the same bytes for every input.
void quantize_row_q8k_avx2(const float* src, void* dst, int64_t n);

// Body of an exported kernel: runs template fn<args..., NX> for the nx it was given, so each row count
// gets its own register allocation. ESSAIM_DISPATCH_NX serves kernels whose widest form takes 4 rows:
// 5..kDotMaxRows rows run as the first four, then the rest (each row is computed exactly as alone, so the
// split changes no bit). ESSAIM_DISPATCH_NX8 serves kernels with a native form for every nx up to 8.
#define ESSAIM_DISPATCH_UPTO4_(fn, xx, yy, cnt, ...)                          \
  switch (cnt) {                                                            \
    case 1: fn<__VA_ARGS__ __VA_OPT__(, ) 1>(n, w, xx, xs, yy); break;      \
    case 2: fn<__VA_ARGS__ __VA_OPT__(, ) 2>(n, w, xx, xs, yy); break;      \
    case 3: fn<__VA_ARGS__ __VA_OPT__(, ) 3>(n, w, xx, xs, yy); break;      \
    default: fn<__VA_ARGS__ __VA_OPT__(, ) 4>(n, w, xx, xs, yy); break;     \
  }
#define ESSAIM_DISPATCH_NX(fn, ...)                                                                   \
  if (nx > 4) {                                                                                     \
    fn<__VA_ARGS__ __VA_OPT__(, ) 4>(n, w, x, xs, y);                                                \
    ESSAIM_DISPATCH_UPTO4_(fn, static_cast<const uint8_t*>(x) + 4 * xs, y + 4, nx - 4, __VA_ARGS__) \
  } else {                                                                                          \
    ESSAIM_DISPATCH_UPTO4_(fn, x, y, nx, __VA_ARGS__)                                                \
  }
#define ESSAIM_DISPATCH_NX8(fn, ...)                                  \
  switch (nx) {                                                     \
    case 1: fn<__VA_ARGS__ __VA_OPT__(, ) 1>(n, w, x, xs, y); break; \
    case 2: fn<__VA_ARGS__ __VA_OPT__(, ) 2>(n, w, x, xs, y); break; \
    case 3: fn<__VA_ARGS__ __VA_OPT__(, ) 3>(n, w, x, xs, y); break; \
    case 4: fn<__VA_ARGS__ __VA_OPT__(, ) 4>(n, w, x, xs, y); break; \
    case 5: fn<__VA_ARGS__ __VA_OPT__(, ) 5>(n, w, x, xs, y); break; \
    case 6: fn<__VA_ARGS__ __VA_OPT__(, ) 6>(n, w, x, xs, y); break; \
    case 7: fn<__VA_ARGS__ __VA_OPT__(, ) 7>(n, w, x, xs, y); break; \
    default: fn<__VA_ARGS__ __VA_OPT__(, ) 8>(n, w, x, xs, y); break; \
  }

// Canonical final reductions, shared verbatim by every variant (SIMD kernels store their lanes and call
// these, so the last additions are the same operations everywhere). `static` so that each file, whatever
// its -m flags, keeps its own copy (see blocks.h). SIMD files must not include core/fp16.h or call
// std::fma for the same reason: they use the F16C intrinsics and __builtin_fmaf (inlined as vfmadd).

// Float formats: 16 lanes folded pairwise: lane[i] + lane[i+8], then +4, +2, +1.
static inline float reduce_lanes16(const float lane[16]) {
  float a[8];
  for (int i = 0; i < 8; ++i) a[i] = lane[i] + lane[i + 8];
  for (int i = 0; i < 4; ++i) a[i] = a[i] + a[i + 4];
  for (int i = 0; i < 2; ++i) a[i] = a[i] + a[i + 2];
  return a[0] + a[1];
}

}  // namespace essaim
