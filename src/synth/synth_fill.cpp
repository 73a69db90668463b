// Random rows for synthetic tensors. Quantised blocks are built field by field (docs/reference.md 2.4) with
// scales chosen so the dequantised values have the intended mean and standard deviation; any such bytes
// are a valid block as long as the f16 fields are finite (docs/reference.md 3, last paragraph).
#include "synth/synth_fill.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/fp16.h"
#include "core/status.h"
#include "synth/synth_random.h"
#include "synth/synth_vocab.h"

namespace essaim {
namespace {

// Standard deviation of a uniform 4-bit quant (0..15) and of a uniform 6-bit one (-32..31).
constexpr float kQ4StdQ = 4.6097722f;   // sqrt((16^2 - 1) / 12)
constexpr float kQ6StdQ = 18.472953f;   // sqrt((64^2 - 1) / 12)
// Sub-block scale ranges. RMS of uniform_int(12, 20) = 16.21, of uniform_int(8, 16) = 12.27; small scales
// keep d in f16's normal range for the small standard deviations of wide layers.
constexpr int32_t kQ4ScaleLo = 12, kQ4ScaleHi = 20;
constexpr float kQ4ScaleRms = 16.207f;
constexpr int32_t kQ6ScaleLo = 8, kQ6ScaleHi = 16;
constexpr float kQ6ScaleRms = 12.274f;

struct Q4KBlock {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};
static_assert(sizeof(Q4KBlock) == 144);

struct Q6KBlock {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
static_assert(sizeof(Q6KBlock) == 210);

// The low byte of `bits` mapped onto [lo, hi] by multiply-shift (no division in the per-block path).
int32_t byte_in_range(uint64_t bits, int32_t lo, int32_t hi) {
  return lo + int32_t(((bits & 0xFF) * uint64_t(hi - lo + 1)) >> 8);
}

void fill_random_bytes(SynthRng& rng, uint8_t* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t r = rng.next();
    std::memcpy(out + i, &r, 8);
  }
  if (i < n) {
    const uint64_t r = rng.next();
    std::memcpy(out + i, &r, n - i);
  }
}

// Values (f32(d)*sc[s]) * q - f32(dmin)*m[s] with q uniform: mean 7.5*d*sc - dmin*m, which is set to
// mean[s] (0 unless the embedding carries the shared direction); std d*sc*4.61 ~ sigma.
void fill_q4k_block(SynthRng& rng, float sigma, const float* mean, uint8_t* out) {
  Q4KBlock b;
  uint8_t sc[8], mn[8];
  const float jitter = 0.9f + 0.2f * rng.uniform();  // blocks differ in scale, as real ones do
  b.d = f32_to_f16(sigma * jitter / (kQ4StdQ * kQ4ScaleRms));
  const float d = f16_to_f32(b.d);
  float target[8];
  float target_max = 0;
  const uint64_t scale_bits = rng.next();  // one byte per sub-block scale
  for (int s = 0; s < 8; ++s) {
    sc[s] = uint8_t(byte_in_range(scale_bits >> (8 * s), kQ4ScaleLo, kQ4ScaleHi));
    target[s] = 7.5f * d * float(sc[s]) - (mean ? mean[s] : 0.0f);
    target_max = std::max(target_max, target[s]);
  }
  // dmin spreads the largest needed offset over 60 of the 63 min steps.
  b.dmin = f32_to_f16(target_max / 60.0f);
  const float dmin = f16_to_f32(b.dmin);
  for (int s = 0; s < 8; ++s) {
    // Round half up by truncation after clamping to [0, 63]: no libm call on the per-block path.
    const float m = dmin > 0 ? std::clamp(target[s] / dmin, 0.0f, 63.0f) : 0.0f;
    mn[s] = uint8_t(m + 0.5f);
  }
  for (int j = 0; j < 4; ++j) {
    b.scales[j] = uint8_t((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    b.scales[j + 4] = uint8_t((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
    b.scales[j + 8] = uint8_t((sc[j + 4] & 0x0F) | ((mn[j + 4] & 0x0F) << 4));
  }
  fill_random_bytes(rng, b.qs, sizeof(b.qs));
  std::memcpy(out, &b, sizeof(b));
}

// Values d * scales[s] * (q - 32), q uniform 0..63; scale signs are random so the -0.5 mean of q - 32
// cancels across sub-blocks.
void fill_q6k_block(SynthRng& rng, float sigma, uint8_t* out) {
  Q6KBlock b;
  fill_random_bytes(rng, b.ql, sizeof(b.ql));
  fill_random_bytes(rng, b.qh, sizeof(b.qh));
  const uint64_t signs = rng.next(), mags[2] = {rng.next(), rng.next()};
  for (int s = 0; s < 16; ++s) {
    const int32_t mag = byte_in_range(mags[s / 8] >> (8 * (s % 8)), kQ6ScaleLo, kQ6ScaleHi);
    b.scales[s] = int8_t(((signs >> s) & 1) ? -mag : mag);
  }
  const float jitter = 0.9f + 0.2f * rng.uniform();
  b.d = f32_to_f16(sigma * jitter / (kQ6StdQ * kQ6ScaleRms));
  std::memcpy(out, &b, sizeof(b));
}

// Standard deviation of row `row` of tensor t, for the Gaussian-like kinds.
float row_sigma(const SynthFillContext& ctx, const SynthTensor& t, uint64_t row) {
  switch (t.init.kind) {
    case SynthInit::LINEAR:
    case SynthInit::ROUTER:
      return t.init.gain / std::sqrt(float(t.ne[0]));
    case SynthInit::EMBEDDING:
      return t.init.gain;
    case SynthInit::LM_HEAD: {
      const float s = ctx.logits_scale / std::sqrt(float(t.ne[0]));
      return row < ctx.damped_row.size() && ctx.damped_row[row] ? s * kSynthDampedRowScale : s;
    }
    default:
      return 0.0f;
  }
}

// The shared-direction offset of each 32-element sub-block of a row (all zero when there is none).
void row_offsets(const SynthFillContext& ctx, const SynthTensor& t, uint64_t row, std::vector<float>& off) {
  const size_t n_sub = size_t(t.ne[0] / 32);
  off.assign(n_sub, 0.0f);
  if (ctx.router_skew <= 0.0f || int64_t(ctx.n_embd) != t.ne[0]) return;
  if (t.init.kind == SynthInit::EMBEDDING) {
    for (size_t s = 0; s < n_sub; ++s) off[s] = kSynthSkewCarrier * float(ctx.direction[s]);
  } else if (t.init.kind == SynthInit::ROUTER) {
    ESSAIM_CHECK(t.layer >= 0 && size_t(t.layer) < ctx.expert_rank.size());
    const std::vector<uint32_t>& rank = ctx.expert_rank[size_t(t.layer)];
    ESSAIM_CHECK(row < rank.size());
    const float c = kSynthSkewCarrier / std::sqrt(1.0f + kSynthSkewCarrier * kSynthSkewCarrier);
    const float zipf = 1.0f / float(rank[row] + 1);
    const float a = ctx.router_skew * zipf / (float(ctx.n_embd) * c);
    for (size_t s = 0; s < n_sub; ++s) off[s] = a * float(ctx.direction[s]);
  }
}

void fill_f32_row(const SynthFillContext& ctx, const SynthTensor& t, uint64_t row, SynthRng& rng,
                  std::vector<float>& off, float* out) {
  const int64_t n = t.ne[0];
  switch (t.init.kind) {
    case SynthInit::NORM:
      for (int64_t i = 0; i < n; ++i) out[i] = 1.0f + t.init.gain * rng.gaussian();
      return;
    case SynthInit::SSM_A:  // -exp(A_log) for A uniform in [1, 16], Mamba-2's initialisation
      for (int64_t i = 0; i < n; ++i) out[i] = -(1.0f + 15.0f * rng.uniform());
      return;
    case SynthInit::SSM_DT_BIAS:  // softplus(dt_bias) = dt, log-uniform in [1e-3, 1e-1]
      for (int64_t i = 0; i < n; ++i) out[i] = -6.9f + 4.6f * rng.uniform();
      return;
    default: {
      const float sigma = row_sigma(ctx, t, row);
      if (n % 32 == 0) {
        row_offsets(ctx, t, row, off);
        for (int64_t i = 0; i < n; ++i) out[i] = sigma * rng.gaussian() + off[size_t(i / 32)];
      } else {  // 1-D vectors such as ffn_gate_inp_shexp of odd widths carry no direction
        for (int64_t i = 0; i < n; ++i) out[i] = sigma * rng.gaussian();
      }
      return;
    }
  }
}

}  // namespace

SynthFillContext synth_fill_context(const SynthPlan& plan) {
  SynthFillContext ctx;
  ctx.seed = plan.options.seed;
  ctx.n_embd = plan.hp.n_embd;
  ctx.router_skew = plan.options.router_skew;
  ctx.logits_scale = plan.options.logits_scale;
  ESSAIM_CHECK(ctx.n_embd % 32 == 0);
  SynthRng dir(synth_stream_seed(ctx.seed, synth_name_hash("essaim.synth.direction"), 0));
  ctx.direction.resize(ctx.n_embd / 32);
  for (int8_t& s : ctx.direction) s = (dir.next() >> 63) ? int8_t(-1) : int8_t(1);
  // Greedy text from random weights should neither stop on a special token by chance nor fill up with stray
  // bytes (lone UTF-8 continuation bytes, control characters): damp the LM-head rows of every token that is
  // not plain printable text.
  ctx.damped_row.resize(plan.vocab.types.size());
  for (size_t i = 0; i < plan.vocab.types.size(); ++i)
    ctx.damped_row[i] = plan.vocab.types[i] != TokenType::NORMAL || !synth_token_is_plain_text(plan.vocab.tokens[i]);
  // A random popularity order per block, so the popular experts differ from layer to layer.
  ctx.expert_rank.resize(plan.hp.block_count());
  for (uint32_t il = 0; il < plan.hp.block_count(); ++il) {
    SynthRng rng(synth_stream_seed(ctx.seed, synth_name_hash("essaim.synth.expert_rank"), il));
    std::vector<uint32_t> order(plan.hp.n_expert);
    for (uint32_t e = 0; e < order.size(); ++e) order[e] = e;
    for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[size_t(rng.next() % i)]);
    std::vector<uint32_t>& rank = ctx.expert_rank[il];
    rank.resize(order.size());
    for (uint32_t r = 0; r < order.size(); ++r) rank[order[r]] = r;
  }
  return ctx;
}

void synth_fill_rows(const SynthFillContext& ctx, const SynthTensor& t, uint64_t row_begin, uint64_t row_end,
                     uint8_t* out) {
  const TypeTraits& tt = type_traits(t.type);
  const uint64_t row_bytes = tt.row_bytes(uint64_t(t.ne[0]));
  const uint64_t name_hash = synth_name_hash(t.name);
  std::vector<float> off, vals;
  for (uint64_t row = row_begin; row < row_end; ++row) {
    uint8_t* dst = out + (row - row_begin) * row_bytes;
    SynthRng rng(synth_stream_seed(ctx.seed, name_hash, row));
    if (t.type == GgmlType::F32) {
      vals.resize(size_t(t.ne[0]));
      fill_f32_row(ctx, t, row, rng, off, vals.data());
      std::memcpy(dst, vals.data(), row_bytes);
      continue;
    }
    const float sigma = row_sigma(ctx, t, row);
    ESSAIM_CHECK(sigma > 0.0f);
    const uint64_t n_blocks = uint64_t(t.ne[0]) / tt.block_size;
    if (t.type == GgmlType::Q4_K) {
      row_offsets(ctx, t, row, off);
      for (uint64_t b = 0; b < n_blocks; ++b) fill_q4k_block(rng, sigma, off.data() + 8 * b, dst + b * tt.type_size);
    } else {
      ESSAIM_CHECK(t.type == GgmlType::Q6_K);
      ESSAIM_CHECK(t.init.kind != SynthInit::EMBEDDING || ctx.router_skew <= 0.0f);  // no offsets in Q6_K
      for (uint64_t b = 0; b < n_blocks; ++b) fill_q6k_block(rng, sigma, dst + b * tt.type_size);
    }
  }
}

}  // namespace essaim
