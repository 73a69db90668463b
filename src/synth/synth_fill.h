// Tensor data for synthetic models: F32 values and valid random Q4_K / Q6_K blocks emitted directly (no
// quantiser), row by row, each row from its own seeded stream so rows can be generated in any order on any
// number of threads with identical bytes.
//
//   SynthFillContext ctx = synth_fill_context(plan);
//   std::vector<uint8_t> buf(rows * row_bytes);
//   synth_fill_rows(ctx, plan.tensors[i], row_begin, row_begin + rows, buf.data());
//
// Distributions (dequantised values for quantised types):
//   LINEAR      N(0, gain^2 / ne[0])
//   NORM        1 + gain * N(0, 1)
//   EMBEDDING   gain * N(0, 1) + m * u            (m = kSynthSkewCarrier when router skew > 0, else 0)
//   LM_HEAD     N(0, (logits_scale / sqrt(E))^2); rows of special tokens and of tokens that are not plain
//               printable text (stray bytes) x 0.25
//   ROUTER      LINEAR + skew * zipf(rank of the expert) * u / (E * c)
//   SSM_A       -uniform[1, 16];  SSM_DT_BIAS  uniform[-6.9, -2.3]
// u is the shared direction: a random sign per 32-element sub-block, so it is also exact in Q4_K blocks
// (a per-sub-block shift of the min). c = m / sqrt(1 + m^2) is the projection of an RMS-normalised hidden
// state on u / E, so the most popular expert's router logit rises by about `skew`.
#pragma once

#include <cstdint>
#include <vector>

#include "synth/synth.h"

namespace essaim {

inline constexpr float kSynthSkewCarrier = 0.5f;  // m: weight of the shared direction in the embeddings
inline constexpr float kSynthDampedRowScale = 0.25f;

struct SynthFillContext {
  uint64_t seed = 0;
  uint32_t n_embd = 0;
  float router_skew = 0;
  float logits_scale = 0;
  std::vector<int8_t> direction;                  // [n_embd / 32] signs of u
  std::vector<uint8_t> damped_row;                // [n_vocab] 1 for special and non-plain-text tokens
  std::vector<std::vector<uint32_t>> expert_rank;  // [block][expert] popularity rank, 0 = most popular
};

SynthFillContext synth_fill_context(const SynthPlan& plan);

// Fills rows [row_begin, row_end) of tensor t (rows of ne[0] elements, t.type's row bytes each) into out.
void synth_fill_rows(const SynthFillContext& ctx, const SynthTensor& t, uint64_t row_begin, uint64_t row_end,
                     uint8_t* out);

}  // namespace essaim
