// Element formats (F32, F16, BF16) and the 8-bit block formats (Q8_0, Q8_K): conversion to and from f32.
// All scalar and ISA-independent, so every machine produces the same bytes (docs/reference.md 2.2, 2.3, 2.6).
#include <cmath>
#include <cstring>

#include "core/fp16.h"
#include "core/status.h"
#include "kernels/blocks.h"
#include "kernels/dot_kernels.h"
#include "kernels/quantize.h"

namespace essaim {

void quantize_row_f32(const float* src, void* dst, int64_t n) { std::memcpy(dst, src, size_t(n) * 4); }

void dequantize_row_f32(const void* src, float* dst, int64_t n) { std::memcpy(dst, src, size_t(n) * 4); }

void quantize_row_f16(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) out[i] = f32_to_f16(src[i]);
}

void dequantize_row_f16(const void* src, float* dst, int64_t n) {
  const auto* in = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(in[i]);
}

void quantize_row_bf16(const float* src, void* dst, int64_t n) {
  auto* out = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(src[i]);
}

void dequantize_row_bf16(const void* src, float* dst, int64_t n) {
  const auto* in = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(in[i]);
}

// llama.cpp's quantize_row_q8_0_ref: d = amax / 127 (f32), id = 1 / d, qs = roundf(x * id) (half away from
// zero). The stored d is f16(d), but id comes from the unrounded d.
void quantize_row_q8_0(const float* src, void* dst, int64_t n) {
  ESSAIM_CHECK(n % kQK8_0 == 0);
  auto* y = static_cast<BlockQ8_0*>(dst);
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    const float* x = src + b * kQK8_0;
    float amax = 0.0f;
    for (int i = 0; i < kQK8_0; ++i) {
      const float ax = std::fabs(x[i]);
      amax = amax > ax ? amax : ax;  // ggml's MAX(), including what it does with NaN
    }
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = f32_to_f16(d);
    for (int i = 0; i < kQK8_0; ++i) y[b].qs[i] = int8_t(std::roundf(x[i] * id));
  }
}

void dequantize_row_q8_0(const void* src, float* dst, int64_t n) {
  ESSAIM_CHECK(n % kQK8_0 == 0);
  const auto* x = static_cast<const BlockQ8_0*>(src);
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    const float d = f16_to_f32(x[b].d);
    for (int i = 0; i < kQK8_0; ++i) dst[b * kQK8_0 + i] = float(x[b].qs[i]) * d;
  }
}

// Layout q8_0_group8 of the SIMD Q8_0 kernels (dot_kernels.h): same bytes, the scales of every eight blocks
// gathered in front of their quants.
void prepare_q8_0_group8(const void* x, void* out, int64_t n) {
  const auto* in = static_cast<const BlockQ8_0*>(x);
  auto* o = static_cast<uint8_t*>(out);
  const int64_t nb = n / kQK8_0;
  int64_t k = 0;
  for (; k + 8 <= nb; k += 8, o += 8 * sizeof(BlockQ8_0)) {
    for (int q = 0; q < 8; ++q) {
      std::memcpy(o + 2 * q, &in[k + q].d, 2);
      std::memcpy(o + 16 + 32 * q, in[k + q].qs, 32);
    }
  }
  std::memcpy(o, in + k, size_t(nb - k) * sizeof(BlockQ8_0));
}

// docs/reference.md 2.6. mx is the first element whose magnitude is strictly larger than every earlier one, so
// ties keep the earlier element; the minus sign makes mx quantise to -127 (d < 0 when mx > 0).
void quantize_row_q8k(const float* src, void* dst, int64_t n) {
  ESSAIM_CHECK(n % kQK_K == 0);
  auto* y = static_cast<BlockQ8K*>(dst);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float* x = src + b * kQK_K;
    float amax = 0.0f, mx = 0.0f;
    for (int i = 0; i < kQK_K; ++i) {
      const float ax = std::fabs(x[i]);
      if (ax > amax) {
        amax = ax;
        mx = x[i];
      }
    }
    if (amax == 0.0f) {
      // llama.cpp leaves bsums untouched here; they are multiplied by d = 0 anyway, but zeroing them keeps
      // the bytes deterministic.
      std::memset(&y[b], 0, sizeof(BlockQ8K));
      continue;
    }
    const float iscale = -127.0f / mx;
    for (int i = 0; i < kQK_K; ++i) {
      const int v = nearest_int(iscale * x[i]);
      y[b].qs[i] = int8_t(v < 127 ? v : 127);
    }
    for (int g = 0; g < kQK_K / 16; ++g) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += y[b].qs[16 * g + i];
      y[b].bsums[g] = int16_t(sum);
    }
    y[b].d = 1.0f / iscale;
  }
}

void dequantize_row_q8k(const void* src, float* dst, int64_t n) {
  ESSAIM_CHECK(n % kQK_K == 0);
  const auto* x = static_cast<const BlockQ8K*>(src);
  for (int64_t b = 0; b < n / kQK_K; ++b)
    for (int i = 0; i < kQK_K; ++i) dst[b * kQK_K + i] = x[b].d * float(x[b].qs[i]);
}

}  // namespace essaim
