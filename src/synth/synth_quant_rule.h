// The per-tensor type rule of a type mix: everything F32; BF16 or Q8_0 for every weight llama.cpp's converter
// and llama-quantize would convert (norms, routers, conv taps, ssm_a and dt bias stay F32); or llama-quantize's
// Q4_K_M choices exactly as docs/reference.md 3 states them (without the n_expert == 8 special cases).
//
//   SynthTypeQuery q{.kind = TensorName::FFN_DOWN_EXPS, .n_dims = 3, .ne0 = 1024, .layer = 5, .block_count = 48};
//   GgmlType t = synth_tensor_type(SynthTypeMix::Q4_K_M, q);   // Q6_K: more_bits(5, 48)
//
// Decisions are taken on the tensor kind, never by matching names as strings. A K-quant choice for a tensor
// whose rows are not whole 256-element super-blocks falls back to Q8_0 (llama-quantize takes Q8_0 for Q6_K and
// Q5_0 for Q4_K there; essaim has no Q5_0 kernel, so both become Q8_0).
#pragma once

#include <cstdint>

#include "core/ggml_type.h"
#include "synth/synth_arch.h"

namespace essaim {

struct SynthTypeQuery {
  TensorName kind = TensorName::COUNT;
  uint32_t n_dims = 1;
  int64_t ne0 = 256;             // row length: K-quants need whole 256-element super-blocks
  uint32_t layer = 0;            // block index of a blk.N tensor
  uint32_t block_count = 0;      // including MTP blocks
  uint32_t attn_v_ordinal = 0;   // position among attn_v / attn_qkv tensors, in file order
  uint32_t attn_v_count = 0;     // how many attn_v / attn_qkv tensors the file has
  bool has_output = true;        // output.weight present (untied LM head)
};

// llama-quantize's use_more_bits: i < n/8 or i >= 7n/8 or (i - n/8) mod 3 == 2, integer division.
bool q4_k_m_more_bits(int64_t i, int64_t n);

GgmlType synth_tensor_type(SynthTypeMix mix, const SynthTypeQuery& q);

// general.file_type of a mix: 0 (ALL_F32), 32 (MOSTLY_BF16), 7 (MOSTLY_Q8_0) or 15 (MOSTLY_Q4_K_M).
uint32_t synth_file_type(SynthTypeMix mix);

}  // namespace essaim
