// Scalar reference dot products. These define the canonical accumulation order every SIMD variant
// reproduces bit for bit (docs/kernels.md):
//   F32/F16/BF16  element i goes into f32 lane i % 16 as lane = fma(w_i, x_i, lane), lanes start at +0, in
//                 increasing i (a partial last chunk follows the same rule); then reduce_lanes16.
//   Q8_0          per 32-block in block order: acc = fma(f32(sumi), f32(dw) * f32(dx), acc).
//   Q4_K/Q5_K     REFERENCE.md 2.7 eight-lane order: per super-block exact integer A[l] and M, then
//                 lane[l] = fma(db, f32(A[l]), lane[l]) and acc = fma(-dmb, f32(M), acc); fold_lanes8(acc).
//   Q6_K          the same lanes without the min term, lane[l] = lane[l] + d * f32(A[l]) (multiply, then add).
// The fused / unfused choices are those a native GCC build makes for llama.cpp's scalar kernels (REFERENCE.md
// 2.7), so on the same quantised inputs these return llama.cpp's scalar results.
#include <cmath>

#include "core/fp16.h"
#include "kernels/blocks.h"
#include "kernels/dot_kernels.h"

namespace essaim {
namespace {

template <typename LoadW, typename LoadX>
float dot_float_lanes(int64_t n, LoadW load_w, LoadX load_x) {
  float lane[16] = {};
  for (int64_t i = 0; i < n; ++i) lane[i % 16] = std::fma(load_w(i), load_x(i), lane[i % 16]);
  return reduce_lanes16(lane);
}

float dot_f32(int64_t n, const void* w, const void* x) {
  const auto* a = static_cast<const float*>(w);
  const auto* b = static_cast<const float*>(x);
  return dot_float_lanes(n, [a](int64_t i) { return a[i]; }, [b](int64_t i) { return b[i]; });
}

float dot_f16(int64_t n, const void* w, const void* x) {
  const auto* a = static_cast<const uint16_t*>(w);
  const auto* b = static_cast<const uint16_t*>(x);
  return dot_float_lanes(n, [a](int64_t i) { return f16_to_f32(a[i]); }, [b](int64_t i) { return f16_to_f32(b[i]); });
}

float dot_bf16(int64_t n, const void* w, const void* x) {
  const auto* a = static_cast<const uint16_t*>(w);
  const auto* b = static_cast<const uint16_t*>(x);
  return dot_float_lanes(n, [a](int64_t i) { return bf16_to_f32(a[i]); },
                         [b](int64_t i) { return bf16_to_f32(b[i]); });
}

float dot_q8_0(int64_t n, const void* w, const void* x) {
  const auto* a = static_cast<const BlockQ8_0*>(w);
  const auto* b = static_cast<const BlockQ8_0*>(x);
  float acc = 0.0f;
  for (int64_t k = 0; k < n / kQK8_0; ++k) {
    int sumi = 0;
    for (int i = 0; i < kQK8_0; ++i) sumi += int(a[k].qs[i]) * int(b[k].qs[i]);
    acc = std::fma(float(sumi), f16_to_f32(a[k].d) * f16_to_f32(b[k].d), acc);
  }
  return acc;
}

// Value of every element of a super-block, unpacked once (the index maps of REFERENCE.md 2.4).
void q4k_values(const BlockQ4K& b, int32_t q[kQK_K]) {
  for (int e = 0; e < kQK_K; ++e) q[e] = (b.qs[32 * (e / 64) + e % 32] >> (4 * ((e / 32) % 2))) & 0xF;
}

void q5k_values(const BlockQ5K& b, int32_t q[kQK_K]) {
  for (int e = 0; e < kQK_K; ++e) {
    const int32_t low = (b.qs[32 * (e / 64) + e % 32] >> (4 * ((e / 32) % 2))) & 0xF;
    q[e] = low | (((b.qh[e % 32] >> (e / 32)) & 1) << 4);
  }
}

void q6k_values(const BlockQ6K& b, int32_t q[kQK_K]) {
  for (int e = 0; e < kQK_K; ++e) {
    const int h = e / 128, c = (e % 128) / 32, l = e % 32;
    const uint8_t qlb = b.ql[64 * h + 32 * (c & 1) + l];
    const int32_t low4 = c < 2 ? (qlb & 0xF) : (qlb >> 4);
    q[e] = (low4 | (((b.qh[32 * h + l] >> (2 * c)) & 3) << 4)) - 32;
  }
}

// Q4_K and Q5_K differ only in how the 0..15 / 0..31 values are read.
template <typename Block, void (*Values)(const Block&, int32_t*)>
float dot_q45k(int64_t n, const void* w, const void* x) {
  const auto* a = static_cast<const Block*>(w);
  const auto* b = static_cast<const BlockQ8K*>(x);
  float acc = 0.0f;
  float lane[8] = {};
  for (int64_t k = 0; k < n / kQK_K; ++k) {
    uint8_t sc[8], m[8];
    q4k_unpack_scales(a[k].scales, sc, m);
    int32_t q[kQK_K];
    Values(a[k], q);
    int32_t A[8] = {};
    for (int s = 0; s < 8; ++s) {
      int32_t part[8] = {};
      for (int c = 0; c < 4; ++c)
        for (int l = 0; l < 8; ++l) part[l] += q[32 * s + 8 * c + l] * int32_t(b[k].qs[32 * s + 8 * c + l]);
      for (int l = 0; l < 8; ++l) A[l] += int32_t(sc[s]) * part[l];
    }
    int32_t M = 0;
    for (int g = 0; g < 16; ++g) M += int32_t(b[k].bsums[g]) * int32_t(m[g / 2]);
    const float db = f16_to_f32(a[k].d) * b[k].d;
    const float dmb = f16_to_f32(a[k].dmin) * b[k].d;
    for (int l = 0; l < 8; ++l) lane[l] = std::fma(db, float(A[l]), lane[l]);
    acc = std::fma(-dmb, float(M), acc);
  }
  return fold_lanes8(acc, lane);
}

float dot_q4k(int64_t n, const void* w, const void* x) { return dot_q45k<BlockQ4K, q4k_values>(n, w, x); }
float dot_q5k(int64_t n, const void* w, const void* x) { return dot_q45k<BlockQ5K, q5k_values>(n, w, x); }

float dot_q6k(int64_t n, const void* w, const void* x) {
  const auto* a = static_cast<const BlockQ6K*>(w);
  const auto* b = static_cast<const BlockQ8K*>(x);
  float lane[8] = {};
  for (int64_t k = 0; k < n / kQK_K; ++k) {
    int32_t q[kQK_K];
    q6k_values(a[k], q);
    int32_t A[8] = {};
    for (int s = 0; s < 16; ++s) {
      int32_t part[8] = {};
      for (int c = 0; c < 2; ++c)
        for (int l = 0; l < 8; ++l) part[l] += q[16 * s + 8 * c + l] * int32_t(b[k].qs[16 * s + 8 * c + l]);
      for (int l = 0; l < 8; ++l) A[l] += int32_t(a[k].scales[s]) * part[l];
    }
    const float d = f16_to_f32(a[k].d) * b[k].d;
    for (int l = 0; l < 8; ++l) lane[l] = lane[l] + d * float(A[l]);
  }
  return fold_lanes8(0.0f, lane);
}

template <float (*Dot)(int64_t, const void*, const void*)>
void rows(int64_t n, const void* w, const void* x, size_t x_stride, int nx, float* y) {
  for (int j = 0; j < nx; ++j) y[j] = Dot(n, w, static_cast<const uint8_t*>(x) + size_t(j) * x_stride);
}

}  // namespace

void vec_dot_f32_f32_scalar(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  rows<dot_f32>(n, w, x, xs, nx, y);
}
void vec_dot_f16_f16_scalar(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  rows<dot_f16>(n, w, x, xs, nx, y);
}
void vec_dot_bf16_bf16_scalar(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  rows<dot_bf16>(n, w, x, xs, nx, y);
}
void vec_dot_q8_0_q8_0_scalar(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  rows<dot_q8_0>(n, w, x, xs, nx, y);
}
void vec_dot_q4k_q8k_scalar(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  rows<dot_q4k>(n, w, x, xs, nx, y);
}
void vec_dot_q5k_q8k_scalar(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  rows<dot_q5k>(n, w, x, xs, nx, y);
}
void vec_dot_q6k_q8k_scalar(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y) {
  rows<dot_q6k>(n, w, x, xs, nx, y);
}

}  // namespace essaim
