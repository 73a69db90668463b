// The precision expert outputs are kept in between the expert FFN and the backbone's weighted combine
// (docs/dispatch.md, "Lean wire"). F32 (the default) keeps the FFN's result as it is; BF16 rounds every
// output value to bfloat16 (round to nearest even) wherever it is computed — a worker, the backbone's
// replica, the monolithic run — so the sharded result still equals the monolithic one bit for bit under
// that mode, while a worker's answer takes 2 bytes per value on the wire instead of 4.
//
//   ExpertOutput mode = *expert_output_from_name("bf16");
//   float y = round_expert_output(mode, 1.00390625f);          // 1.0f under BF16, unchanged under F32
//   uint16_t wire = bf16_bits_of_rounded(y);                    // exact: y is already a bf16 value
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "core/fp16.h"

namespace essaim {

// The values double as the protocol's `output_format` byte (docs/protocol.md): append only.
enum class ExpertOutput : uint8_t { F32 = 0, BF16 = 1, COUNT = 2 };

inline std::string_view expert_output_name(ExpertOutput m) { return m == ExpertOutput::BF16 ? "bf16" : "f32"; }
inline std::optional<ExpertOutput> expert_output_from_name(std::string_view s) {
  if (s == "f32") return ExpertOutput::F32;
  if (s == "bf16") return ExpertOutput::BF16;
  return std::nullopt;
}
inline uint64_t expert_output_value_bytes(ExpertOutput m) { return m == ExpertOutput::BF16 ? 2 : 4; }

// The one rounding every place uses, so that they agree on every input, NaN included: a value whose low
// 16 bits are already zero is a bf16 value and is kept exactly (a signalling NaN stays signalling, so a
// bf16 row decoded from the wire re-encodes to the same bytes); anything else is rounded to nearest even
// (f32_to_bf16; NaN becomes quiet). Idempotent: rounding a rounded value changes nothing.
inline uint16_t round_to_bf16_bits(float f) {
  const uint32_t x = f32_bits(f);
  return (x & 0xFFFFu) == 0 ? uint16_t(x >> 16) : f32_to_bf16(f);
}
inline float round_expert_output(ExpertOutput m, float f) {
  return m == ExpertOutput::BF16 ? bf16_to_f32(round_to_bf16_bits(f)) : f;
}
// Rounds rows in place (a no-op under F32).
inline void round_expert_outputs(ExpertOutput m, std::span<float> values) {
  if (m != ExpertOutput::BF16) return;
  for (float& v : values) v = bf16_to_f32(round_to_bf16_bits(v));
}

}  // namespace essaim
