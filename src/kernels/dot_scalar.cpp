// Scalar reference dot products. These define the canonical accumulation order every SIMD variant
// reproduces bit for bit (docs/kernels.md):
//   F32/F16/BF16  element i goes into f32 lane i % 16 as lane = fma(w_i, x_i, lane), lanes start at +0, in
//                 increasing i (a partial last chunk follows the same rule); then reduce_lanes16.
//   Q8_0          per 32-block in block order: acc = fma(f32(sumi), f32(dw) * f32(dx), acc).
//   Q4_K/Q5_K     per super-block the exact integers A = Σ_s sc[s]·Σ_i q·q8 and M = Σ_g bsums[g]·m[g/2],
//                 then acc = fma(db, f32(A), acc), acc = fma(-dmb, f32(M), acc), super-block after super-block.
//   Q6_K          per super-block the exact integer A = Σ_s sc[s]·Σ_i (q - 32)·q8, then
//                 acc = fma(d·y.d, f32(A), acc).
// The K-quant orders keep no per-lane f32 state: how a kernel forms the integers is free (they are exact),
// so the only f32 work is two (Q6_K: one) fused steps per row and super-block (docs/kernels.md).
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

// The quantised value of element i (0..31) of sub-block s of a Q4_K / Q5_K block (docs/reference.md 2.4):
// qs[32*(s/2) + i] holds it in its low (even s) or high (odd s) nibble; Q5_K adds bit s of qh[i] as 16.
int32_t q4k_value(const BlockQ4K& b, int s, int i) { return (b.qs[32 * (s / 2) + i] >> (4 * (s % 2))) & 0xF; }

int32_t q5k_value(const BlockQ5K& b, int s, int i) {
  return ((b.qs[32 * (s / 2) + i] >> (4 * (s % 2))) & 0xF) | (((b.qh[i] >> s) & 1) << 4);
}

// Q4_K and Q5_K differ only in how the 0..15 / 0..31 values are read.
template <typename Block, int32_t (*Value)(const Block&, int, int)>
float dot_q45k(int64_t n, const void* w, const void* x) {
  const auto* a = static_cast<const Block*>(w);
  const auto* b = static_cast<const BlockQ8K*>(x);
  float acc = 0.0f;
  for (int64_t k = 0; k < n / kQK_K; ++k) {
    uint8_t sc[8], m[8];
    q4k_unpack_scales(a[k].scales, sc, m);
    int32_t A = 0;
    for (int s = 0; s < 8; ++s) {
      const int8_t* y = b[k].qs + 32 * s;
      int32_t S = 0;
      for (int i = 0; i < 32; ++i) S += Value(a[k], s, i) * y[i];
      A += int32_t(sc[s]) * S;
    }
    int32_t M = 0;
    for (int g = 0; g < 16; ++g) M += int32_t(b[k].bsums[g]) * int32_t(m[g / 2]);
    const float db = f16_to_f32(a[k].d) * b[k].d;
    const float dmb = f16_to_f32(a[k].dmin) * b[k].d;
    acc = std::fma(db, float(A), acc);
    acc = std::fma(-dmb, float(M), acc);
  }
  return acc;
}

float dot_q4k(int64_t n, const void* w, const void* x) { return dot_q45k<BlockQ4K, q4k_value>(n, w, x); }
float dot_q5k(int64_t n, const void* w, const void* x) { return dot_q45k<BlockQ5K, q5k_value>(n, w, x); }

// Sub-block s (16 elements) of a Q6_K block, as pointers and shifts: element 16s + i has the low nibble
// of ql[i] (high nibble when `nibble` is 4) and bits `pair`..`pair`+1 of qh[i], minus 32. With h = s/8,
// c = (s%8)/2 and o = 16(s%2) this is docs/reference.md 2.4's element 128h + 32c + o + i.
struct Q6kRun {
  const uint8_t* ql;
  const uint8_t* qh;
  int nibble, pair;
  int32_t value(int i) const { return (((ql[i] >> nibble) & 0xF) | (((qh[i] >> pair) & 3) << 4)) - 32; }
};

Q6kRun q6k_run(const BlockQ6K& b, int s) {
  const int h = s / 8, c = (s % 8) / 2, o = 16 * (s % 2);
  return Q6kRun{.ql = b.ql + 64 * h + 32 * (c & 1) + o, .qh = b.qh + 32 * h + o, .nibble = 4 * (c / 2), .pair = 2 * c};
}

float dot_q6k(int64_t n, const void* w, const void* x) {
  const auto* a = static_cast<const BlockQ6K*>(w);
  const auto* b = static_cast<const BlockQ8K*>(x);
  float acc = 0.0f;
  for (int64_t k = 0; k < n / kQK_K; ++k) {
    int32_t A = 0;
    for (int s = 0; s < 16; ++s) {
      const Q6kRun q = q6k_run(a[k], s);
      const int8_t* y = b[k].qs + 16 * s;
      int32_t S = 0;
      for (int i = 0; i < 16; ++i) S += q.value(i) * y[i];
      A += int32_t(a[k].scales[s]) * S;
    }
    acc = std::fma(f16_to_f32(a[k].d) * b[k].d, float(A), acc);
  }
  return acc;
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
