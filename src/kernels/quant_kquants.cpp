// K-quant super-blocks (Q4_K, Q5_K, Q6_K): dequantisation and the reference quantisers.
//
// The quantisers reproduce llama.cpp's quantize_row_q{4,5,6}_K_ref byte for byte (ggml-quants.c, no
// importance matrix), which is what llama-quantize writes. That code searches for scales in f32, so every
// expression below keeps ggml's evaluation order and operand types (an int promoted to float at the same
// point, no fused multiply-add: ggml-base is compiled without FMA and this build uses -ffp-contract=off).
// Changing `a*b*c` into `a*(b*c)` here changes output bytes.
#include <cmath>
#include <cstring>

#include "core/fp16.h"
#include "core/status.h"
#include "kernels/blocks.h"
#include "kernels/quantize.h"

namespace essaim {
namespace {

constexpr float kGroupMaxEps = 1e-15f;  // ggml's GROUP_MAX_EPS: below it a group counts as all zero

int clamp_int(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// ggml's make_qkx2_quants: asymmetric quantisation of n values to 0..nmax with a non-positive min. Starts
// from the min/max fit, then tries nstep+1 scales (rmin + rdelta*is + nmax) / (max - min), refitting scale
// and min by weighted least squares, and keeps the fit of smallest weighted error. Returns the scale;
// *the_min receives -min (>= 0).
float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* the_min,
                       uint8_t* Laux, float rmin, float rdelta, int nstep, bool use_mad) {
  float min = x[0];
  float max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.0f;
  }
  float iscale = float(nmax) / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = uint8_t(clamp_int(l, 0, nmax));
    float diff = scale * float(L[i]) + min - x[i];
    diff = use_mad ? std::fabs(diff) : diff * diff;
    best_error += weights[i] * diff;
  }
  if (nstep < 1) {
    *the_min = -min;
    return scale;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * float(is) + float(nmax)) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = clamp_int(nearest_int(iscale * (x[i] - min)), 0, nmax);
      Laux[i] = uint8_t(l);
      const float w = weights[i];
      sum_l += w * float(l);
      sum_l2 += w * float(l) * float(l);
      sum_xl += w * float(l) * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * float(Laux[i]) + this_min - x[i];
        diff = use_mad ? std::fabs(diff) : diff * diff;
        cur_error += weights[i] * diff;
      }
      if (cur_error < best_error) {
        for (int i = 0; i < n; ++i) L[i] = Laux[i];
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// ggml's make_qx_quants with rmse_type 1 and no importance weights (the only form Q6_K's reference uses):
// symmetric quantisation to -nmax..nmax-1, weights x^2, scale refined by least squares over 19 trial
// iscales -(nmax + 0.1*is) / max. L receives values + nmax (0..2*nmax-1). Returns the scale.
float make_qx_quants_rmse1(int n, int nmax, const float* x, int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.0f;
  }
  float iscale = float(-nmax) / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    L[i] = int8_t(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * float(l);
    suml2 += w * float(l) * float(l);
  }
  float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(float(nmax) + 0.1f * float(is)) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
      const float w = x[i] * x[i];
      sumlx += w * x[i] * float(l);
      suml2 += w * float(l) * float(l);
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) L[i] = int8_t(nmax + clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Shared by Q4_K and Q5_K: per sub-block of 32, fit (scale, min) with make_qkx2_quants, quantise the eight
// scales and mins to 6 bits against their maxima, pack them, then requantise every element against the
// rounded scales. L receives the final 0..nmax values.
void quantize_superblock_q45k(const float* x, int nmax, float rmin, float rdelta, int nstep, uint16_t* d_out,
                              uint16_t* dmin_out, uint8_t packed[12], uint8_t L[kQK_K]) {
  uint8_t Laux[32];
  float weights[32];
  float mins[8];
  float scales[8];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32.0f);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, rdelta, nstep,
                                 false);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  for (int j = 0; j < 8; ++j) {
    uint8_t ls = uint8_t(nearest_int(inv_scale * scales[j]));
    uint8_t lm = uint8_t(nearest_int(inv_min * mins[j]));
    ls = ls < 63 ? ls : 63;
    lm = lm < 63 ? lm : 63;
    if (j < 4) {
      packed[j] = ls;
      packed[j + 4] = lm;
    } else {
      packed[j + 4] = uint8_t((ls & 0xF) | ((lm & 0xF) << 4));
      packed[j - 4] |= uint8_t((ls >> 4) << 6);
      packed[j] |= uint8_t((lm >> 4) << 6);
    }
  }
  *d_out = f32_to_f16(max_scale / 63.0f);
  *dmin_out = f32_to_f16(max_min / 63.0f);
  const float d_all = f16_to_f32(*d_out), dmin_all = f16_to_f32(*dmin_out);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    q4k_scale_min(packed, j, &sc, &m);
    const float d = d_all * float(sc);
    if (d == 0.0f) continue;  // keeps the search's L for this sub-block, as ggml does
    const float dm = dmin_all * float(m);
    for (int i = 0; i < 32; ++i) L[32 * j + i] = uint8_t(clamp_int(nearest_int((x[32 * j + i] + dm) / d), 0, nmax));
  }
}

}  // namespace

void quantize_row_q4k(const float* src, void* dst, int64_t n) {
  ESSAIM_CHECK(n % kQK_K == 0);
  auto* y = static_cast<BlockQ4K*>(dst);
  uint8_t L[kQK_K];
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    quantize_superblock_q45k(src + b * kQK_K, 15, -1.0f, 0.1f, 20, &y[b].d, &y[b].dmin, y[b].scales, L);
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < 32; ++l) y[b].qs[32 * j + l] = uint8_t(L[64 * j + l] | (L[64 * j + 32 + l] << 4));
  }
}

void quantize_row_q5k(const float* src, void* dst, int64_t n) {
  ESSAIM_CHECK(n % kQK_K == 0);
  auto* y = static_cast<BlockQ5K*>(dst);
  uint8_t L[kQK_K];
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    quantize_superblock_q45k(src + b * kQK_K, 31, -0.5f, 0.1f, 15, &y[b].d, &y[b].dmin, y[b].scales, L);
    std::memset(y[b].qh, 0, sizeof(y[b].qh));
    for (int j = 0; j < 4; ++j) {
      for (int l = 0; l < 32; ++l) {
        int l1 = L[64 * j + l], l2 = L[64 * j + 32 + l];
        if (l1 > 15) { l1 -= 16; y[b].qh[l] |= uint8_t(1 << (2 * j)); }
        if (l2 > 15) { l2 -= 16; y[b].qh[l] |= uint8_t(2 << (2 * j)); }
        y[b].qs[32 * j + l] = uint8_t(l1 | (l2 << 4));
      }
    }
  }
}

void quantize_row_q6k(const float* src, void* dst, int64_t n) {
  ESSAIM_CHECK(n % kQK_K == 0);
  auto* y = static_cast<BlockQ6K*>(dst);
  int8_t L[kQK_K];
  float scales[16];
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float* x = src + b * kQK_K;
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < 16; ++ib) {
      scales[ib] = make_qx_quants_rmse1(16, 32, x + 16 * ib, L + 16 * ib);
      const float abs_scale = std::fabs(scales[ib]);
      if (abs_scale > max_abs_scale) {
        max_abs_scale = abs_scale;
        max_scale = scales[ib];
      }
    }
    if (max_abs_scale < kGroupMaxEps) {
      std::memset(&y[b], 0, sizeof(BlockQ6K));
      continue;
    }
    const float iscale = -128.0f / max_scale;
    y[b].d = f32_to_f16(1 / iscale);
    for (int ib = 0; ib < 16; ++ib) {
      const int v = nearest_int(iscale * scales[ib]);
      y[b].scales[ib] = int8_t(v < 127 ? v : 127);
    }
    const float d_all = f16_to_f32(y[b].d);
    for (int j = 0; j < 16; ++j) {
      const float d = d_all * float(y[b].scales[j]);
      if (d == 0.0f) continue;  // keeps the search's L, as ggml does
      for (int i = 0; i < 16; ++i) L[16 * j + i] = int8_t(clamp_int(nearest_int(x[16 * j + i] / d), -32, 31) + 32);
    }
    // Element 128h + 32c + l: low nibble in ql[64h + 32(c&1) + l] (high nibble for c >= 2), 2 high bits at
    // bit 2c of qh[32h + l].
    for (int h = 0; h < 2; ++h) {
      const int8_t* Lh = L + 128 * h;
      for (int l = 0; l < 32; ++l) {
        y[b].ql[64 * h + l] = uint8_t((Lh[l] & 0xF) | ((Lh[l + 64] & 0xF) << 4));
        y[b].ql[64 * h + 32 + l] = uint8_t((Lh[l + 32] & 0xF) | ((Lh[l + 96] & 0xF) << 4));
        y[b].qh[32 * h + l] = uint8_t((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) | ((Lh[l + 64] >> 4) << 4) |
                                      ((Lh[l + 96] >> 4) << 6));
      }
    }
  }
}

// Dequantisation: the value shapes of docs/reference.md 2.4 (products formed in f32, in that order).
namespace {

// Q4_K and Q5_K: element l of sub-block s is ds·v − ms, with ds and ms from the packed 6-bit scale and min
// and v's low four bits in byte l of chunk s/2 (low nibble for even s); high(block, s, l) gives the bits
// above them (Q5_K's fifth bit; none for Q4_K).
template <typename Block, typename HighBits>
inline __attribute__((always_inline)) void dequantize_row_scale_min(const void* src, float* dst, int64_t n,
                                                                    HighBits high) {
  ESSAIM_CHECK(n % kQK_K == 0);
  const auto* x = static_cast<const Block*>(src);
  for (int64_t b = 0; b < n / kQK_K; ++b, dst += kQK_K) {
    const float d = f16_to_f32(x[b].d), dmin = f16_to_f32(x[b].dmin);
    for (int s = 0; s < 8; ++s) {
      uint8_t sc, m;
      q4k_scale_min(x[b].scales, s, &sc, &m);
      const float ds = d * float(sc), ms = dmin * float(m);
      const uint8_t* q = x[b].qs + 32 * (s / 2);
      const int shift = 4 * (s % 2);
      for (int l = 0; l < 32; ++l) {
        const int v = ((q[l] >> shift) & 0xF) | high(x[b], s, l);
        dst[32 * s + l] = ds * float(v) - ms;
      }
    }
  }
}

}  // namespace

void dequantize_row_q4k(const void* src, float* dst, int64_t n) {
  dequantize_row_scale_min<BlockQ4K>(src, dst, n, [](const BlockQ4K&, int, int) { return 0; });
}

void dequantize_row_q5k(const void* src, float* dst, int64_t n) {
  dequantize_row_scale_min<BlockQ5K>(src, dst, n,
                                     [](const BlockQ5K& x, int s, int l) { return ((x.qh[l] >> s) & 1) << 4; });
}

void dequantize_row_q6k(const void* src, float* dst, int64_t n) {
  ESSAIM_CHECK(n % kQK_K == 0);
  const auto* x = static_cast<const BlockQ6K*>(src);
  for (int64_t b = 0; b < n / kQK_K; ++b, dst += kQK_K) {
    const float d = f16_to_f32(x[b].d);
    for (int e = 0; e < kQK_K; ++e) {
      const int h = e / 128, c = (e % 128) / 32, l = e % 32;
      const uint8_t qlb = x[b].ql[64 * h + 32 * (c & 1) + l];
      const int low4 = c < 2 ? (qlb & 0xF) : (qlb >> 4);
      const int hi2 = (x[b].qh[32 * h + l] >> (2 * c)) & 3;
      dst[e] = d * float(x[b].scales[e / 16]) * float((low4 | (hi2 << 4)) - 32);
    }
  }
}

}  // namespace essaim
