// NEON dot products of the float formats (F32, F16, BF16), bit-identical to dot_scalar.cpp: sixteen f32
// lanes as four q registers (lanes 0..3, 4..7, 8..11, 12..15), element i into lane i % 16 by a fused
// multiply-add (vfmaq_f32 rounds once, like std::fma); the tail that does not fill 16 elements continues
// the same rule lane by lane; then reduce_lanes16. Baseline AArch64 (NEON is always there).
#include <arm_neon.h>

#include <cstdint>

#include "kernels/dot_kernels.h"

namespace essaim {
namespace {

struct F32 {
  using T = float;
  static float32x4_t load4(const T* p) { return vld1q_f32(p); }
  static float one(const T* p) { return *p; }
};

// f16 -> f32 is exact for every finite value and infinity (the conversion instruction, as F16C on x86).
struct F16 {
  using T = uint16_t;
  static float32x4_t load4(const T* p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
  static float one(const T* p) { return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(*p))), 0); }
};

struct BF16 {
  using T = uint16_t;
  static float32x4_t load4(const T* p) { return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16)); }
  static float one(const T* p) { return vgetq_lane_f32(vreinterpretq_f32_u32(vshll_n_u16(vdup_n_u16(*p), 16)), 0); }
};

template <typename Fmt, int NX>
void dot_rows(int64_t n, const void* wv, const void* xv, size_t x_stride, float* y) {
  using T = typename Fmt::T;
  const T* w = static_cast<const T*>(wv);
  const T* x[NX];
  for (int j = 0; j < NX; ++j) x[j] = reinterpret_cast<const T*>(static_cast<const uint8_t*>(xv) + j * x_stride);
  float32x4_t acc[NX][4];
  for (int j = 0; j < NX; ++j)
    for (int q = 0; q < 4; ++q) acc[j][q] = vdupq_n_f32(0.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    float32x4_t wq[4];
    for (int q = 0; q < 4; ++q) wq[q] = Fmt::load4(w + i + 4 * q);
    for (int j = 0; j < NX; ++j)
      for (int q = 0; q < 4; ++q) acc[j][q] = vfmaq_f32(acc[j][q], wq[q], Fmt::load4(x[j] + i + 4 * q));
  }
  for (int j = 0; j < NX; ++j) {
    float lane[16];
    for (int q = 0; q < 4; ++q) vst1q_f32(lane + 4 * q, acc[j][q]);
    for (int64_t k = i; k < n; ++k) lane[k % 16] = __builtin_fmaf(Fmt::one(w + k), Fmt::one(x[j] + k), lane[k % 16]);
    y[j] = reduce_lanes16(lane);
  }
}

}  // namespace

void vec_dot_f32_f32_neon(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  ESSAIM_DISPATCH_NX(dot_rows, F32)
}
void vec_dot_f16_f16_neon(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  ESSAIM_DISPATCH_NX(dot_rows, F16)
}
void vec_dot_bf16_bf16_neon(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  ESSAIM_DISPATCH_NX(dot_rows, BF16)
}

}  // namespace essaim
