// The dot products of the CUDA expert kernels, written once for the device and the host: every function
// here is `__host__ __device__` under nvcc and a plain inline function under a C++ compiler, so the very
// code the GPU runs is also compiled into a CPU test (tests/gpu/gpu_dot_host_test.cpp) and compared bit for
// bit with the scalar reference (src/kernels/dot_scalar.cpp) on a machine without a GPU.
//
//   float y = gpu::dot_q4k(3072, w_row, x_row);   // = vec_dot_q4k_q8k_scalar(3072, w_row, x_row, 0, 1, &y)
//
// Exactness (docs/kernels.md, "Canonical accumulation orders"): integer sums inside a block are exact in
// any order; every f32 step is one explicitly rounded operation in the reference's order — fma_rn where
// the reference calls std::fma (the K-quants: one or two per row and super-block, no f32 lanes), mul_rn for
// the products of scales, add_rn in the float formats' lane reduction — so neither nvcc's
// contraction (also disabled with -fmad=false) nor the host compiler's (-ffp-contract=off) can fuse or
// reorder anything. f16 → f32 is exact on both sides (__half2float / core/fp16.h).
//
// The loops are the scalar reference's, element for element; only the spelling of the f32 operations and
// of the scale unpacking (no memcpy on the device) differ.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/blocks.h"

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#define ESSAIM_HD __host__ __device__ __forceinline__
#else
#define ESSAIM_HD inline
#endif

#if !defined(__CUDA_ARCH__)
#include "core/fp16.h"
#endif

namespace essaim::gpu {

// --- one rounding per operation, on both sides ---------------------------------------------------------
ESSAIM_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
ESSAIM_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);  // never contracted into an FMA, whatever -fmad says
#else
  return a * b;
#endif
}
ESSAIM_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
ESSAIM_HD float half_to_f32(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#else
  return essaim::f16_to_f32(h);
#endif
}
ESSAIM_HD float bf16_bits_to_f32(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(uint32_t(h) << 16);
#else
  return essaim::bf16_to_f32(h);
#endif
}

// --- canonical reduction of the float formats (kernels/dot_kernels.h: reduce_lanes16) ------------------
ESSAIM_HD float reduce_lanes16(const float lane[16]) {
  float a[8];
  for (int i = 0; i < 8; ++i) a[i] = add_rn(lane[i], lane[i + 8]);
  for (int i = 0; i < 4; ++i) a[i] = add_rn(a[i], a[i + 4]);
  for (int i = 0; i < 2; ++i) a[i] = add_rn(a[i], a[i + 2]);
  return add_rn(a[0], a[1]);
}

// --- float formats: 16 FMA lanes, lane i % 16 in increasing i ------------------------------------------
ESSAIM_HD float dot_f32(int64_t n, const void* w, const void* x) {
  const auto* a = static_cast<const float*>(w);
  const auto* b = static_cast<const float*>(x);
  float lane[16] = {};
  for (int64_t i = 0; i < n; ++i) lane[i % 16] = fma_rn(a[i], b[i], lane[i % 16]);
  return reduce_lanes16(lane);
}

ESSAIM_HD float dot_f16(int64_t n, const void* w, const void* x) {
  const auto* a = static_cast<const uint16_t*>(w);
  const auto* b = static_cast<const uint16_t*>(x);
  float lane[16] = {};
  for (int64_t i = 0; i < n; ++i) lane[i % 16] = fma_rn(half_to_f32(a[i]), half_to_f32(b[i]), lane[i % 16]);
  return reduce_lanes16(lane);
}

ESSAIM_HD float dot_bf16(int64_t n, const void* w, const void* x) {
  const auto* a = static_cast<const uint16_t*>(w);
  const auto* b = static_cast<const uint16_t*>(x);
  float lane[16] = {};
  for (int64_t i = 0; i < n; ++i)
    lane[i % 16] = fma_rn(bf16_bits_to_f32(a[i]), bf16_bits_to_f32(b[i]), lane[i % 16]);
  return reduce_lanes16(lane);
}

// --- Q8_0 · Q8_0: acc = fma(f32(Σ qw·qx), f32(dw)·f32(dx), acc) in block order ---------------------------
ESSAIM_HD float dot_q8_0(int64_t n, const void* w, const void* x) {
  const auto* a = static_cast<const BlockQ8_0*>(w);
  const auto* b = static_cast<const BlockQ8_0*>(x);
  float acc = 0.0f;
  for (int64_t k = 0; k < n / kQK8_0; ++k) {
    int sumi = 0;
    for (int i = 0; i < kQK8_0; ++i) sumi += int(a[k].qs[i]) * int(b[k].qs[i]);
    acc = fma_rn(float(sumi), mul_rn(half_to_f32(a[k].d), half_to_f32(b[k].d)), acc);
  }
  return acc;
}

// --- K-quants -------------------------------------------------------------------------------------------
// Sub-block j's 6-bit scale and min (blocks.h q4k_scale_min, without memcpy so that it runs on the device).
ESSAIM_HD void scale_min_k4(const uint8_t* s, int j, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = uint8_t(s[j] & 63);
    *m = uint8_t(s[j + 4] & 63);
  } else {
    *sc = uint8_t((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4));
    *m = uint8_t((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

// Element i (0..31) of sub-block s: low (even s) or high (odd s) nibble of qs[32*(s/2) + i]; Q5_K adds bit
// s of qh[i] as 16 (dot_scalar.cpp q4k_value / q5k_value).
struct Q4kValue {
  ESSAIM_HD static int32_t get(const BlockQ4K& b, int s, int i) { return (b.qs[32 * (s / 2) + i] >> (4 * (s % 2))) & 0xF; }
};
struct Q5kValue {
  ESSAIM_HD static int32_t get(const BlockQ5K& b, int s, int i) {
    return ((b.qs[32 * (s / 2) + i] >> (4 * (s % 2))) & 0xF) | (((b.qh[i] >> s) & 1) << 4);
  }
};

// Q4_K / Q5_K · Q8_K: per super-block the exact integers A = Σ_s sc[s]·Σ_i q·y (one int32 for the whole
// super-block) and M = Σ_g bsums[g]·m[g/2]; acc = fma(db, f32(A), acc), then acc = fma(-dmb, f32(M), acc).
template <typename Block, typename Value>
ESSAIM_HD float dot_q45k(int64_t n, const void* w, const void* x) {
  const auto* a = static_cast<const Block*>(w);
  const auto* b = static_cast<const BlockQ8K*>(x);
  float acc = 0.0f;
  for (int64_t k = 0; k < n / kQK_K; ++k) {
    uint8_t sc[8], m[8];
    for (int j = 0; j < 8; ++j) scale_min_k4(a[k].scales, j, &sc[j], &m[j]);
    int32_t A = 0;
    for (int s = 0; s < 8; ++s) {
      const int8_t* y = b[k].qs + 32 * s;
      int32_t S = 0;
      for (int i = 0; i < 32; ++i) S += Value::get(a[k], s, i) * y[i];
      A += int32_t(sc[s]) * S;
    }
    int32_t M = 0;
    for (int g = 0; g < 16; ++g) M += int32_t(b[k].bsums[g]) * int32_t(m[g / 2]);
    const float db = mul_rn(half_to_f32(a[k].d), b[k].d);
    const float dmb = mul_rn(half_to_f32(a[k].dmin), b[k].d);
    acc = fma_rn(db, float(A), acc);
    acc = fma_rn(-dmb, float(M), acc);
  }
  return acc;
}

ESSAIM_HD float dot_q4k(int64_t n, const void* w, const void* x) { return dot_q45k<BlockQ4K, Q4kValue>(n, w, x); }
ESSAIM_HD float dot_q5k(int64_t n, const void* w, const void* x) { return dot_q45k<BlockQ5K, Q5kValue>(n, w, x); }

// Q6_K element 16s + i (i = 0..15) of a block, minus 32 (dot_scalar.cpp q6k_run): with h = s/8,
// c = (s%8)/2 and o = 16(s%2), the low nibble of ql[64h + 32(c&1) + o + i] (high nibble when c >= 2) and
// bits 2c..2c+1 of qh[32h + o + i].
ESSAIM_HD int32_t q6k_value(const BlockQ6K& b, int s, int i) {
  const int h = s / 8, c = (s % 8) / 2, o = 16 * (s % 2);
  const uint8_t ql = b.ql[64 * h + 32 * (c & 1) + o + i];
  const uint8_t qh = b.qh[32 * h + o + i];
  return (((ql >> (4 * (c / 2))) & 0xF) | (((qh >> (2 * c)) & 3) << 4)) - 32;
}

// Q6_K · Q8_K: per super-block the exact signed integer A = Σ_s scales[s]·Σ_i (q - 32)·y, then
// acc = fma(f32(d)·y.d, f32(A), acc).
ESSAIM_HD float dot_q6k(int64_t n, const void* w, const void* x) {
  const auto* a = static_cast<const BlockQ6K*>(w);
  const auto* b = static_cast<const BlockQ8K*>(x);
  float acc = 0.0f;
  for (int64_t k = 0; k < n / kQK_K; ++k) {
    int32_t A = 0;
    for (int s = 0; s < 16; ++s) {
      const int8_t* y = b[k].qs + 16 * s;
      int32_t S = 0;
      for (int i = 0; i < 16; ++i) S += q6k_value(a[k], s, i) * y[i];
      A += int32_t(a[k].scales[s]) * S;
    }
    acc = fma_rn(mul_rn(half_to_f32(a[k].d), b[k].d), float(A), acc);
  }
  return acc;
}

}  // namespace essaim::gpu
