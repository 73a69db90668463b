// Architectures as data for the synthetic model writer: hyperparameters (a preset is one SynthHparams value),
// the tensor kinds with their llama.cpp names, and per architecture a table of tensor rules (which layers
// carry the tensor, its shape, how to initialise it) plus the metadata keys it writes.
//
//   const SynthArchDesc& a = synth_arch(SynthArch::QWEN35MOE);
//   SynthHparams hp = a.preset(SynthPreset::TINY);
//   for (const SynthTensorRule& r : a.tensors) ... r.shape(hp) ...
//
// Adding an architecture is one file (synth_<arch>.cpp) defining its presets, its tensor table and its
// metadata function, plus one line in synth_arch(). docs/synth.md walks through it.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf_file.h"
#include "gguf/tensor_names.h"

namespace essaim {

enum class SynthArch { QWEN3MOE, QWEN35MOE, COUNT };
enum class SynthPreset { TINY, SMALL, Q35_122B, COUNT };
enum class SynthTypeMix { F32, BF16, Q8_0, Q4_K_M, COUNT };

std::string_view synth_arch_name(SynthArch a);       // "qwen3moe"
std::string_view synth_preset_name(SynthPreset p);   // "tiny", "small", "q35-122b"
std::string_view synth_type_mix_name(SynthTypeMix t);  // "f32", "bf16", "q8_0", "q4_k_m"

struct SynthHparams {
  uint32_t n_embd = 0;          // E
  uint32_t n_layer = 0;         // executed layers = block_count - n_nextn
  uint32_t n_nextn = 0;         // MTP blocks appended after the main stack (qwen35moe)
  uint32_t n_vocab = 0;         // V, set from the tokenizer
  uint32_t context_length = 0;
  uint32_t n_head = 0;          // H
  uint32_t n_head_kv = 0;       // Hkv
  uint32_t head_dim = 0;        // D (key_length = value_length)
  uint32_t n_rot = 0;           // rope.dimension_count
  std::array<int32_t, 4> rope_sections{};  // qwen35moe IMRoPE sections (sum = n_rot / 2)
  float rope_freq_base = 0;
  float rms_eps = 0;
  uint32_t n_expert = 0;        // X
  uint32_t n_expert_used = 0;   // K
  uint32_t expert_ff = 0;       // F
  uint32_t shared_ff = 0;       // Fs (qwen35moe)
  uint32_t ssm_conv_kernel = 0;     // Kc
  uint32_t ssm_state_size = 0;      // Dk = Dv
  uint32_t ssm_group_count = 0;     // Hk
  uint32_t ssm_time_step_rank = 0;  // Hv
  uint32_t full_attention_interval = 0;  // qwen35moe: every n-th layer is softmax attention
  bool recurrent_flags = false;  // write attention.recurrent_layers instead of full_attention_interval
  bool fused_gate_up = false;    // ffn_gate_up_exps [E, 2F, X] instead of ffn_gate_exps + ffn_up_exps

  uint32_t block_count() const { return n_layer + n_nextn; }
  uint32_t ssm_key_dim() const { return ssm_group_count * ssm_state_size; }
  uint32_t ssm_value_dim() const { return ssm_time_step_rank * ssm_state_size; }  // = ssm.inner_size
  uint32_t ssm_conv_channels() const { return 2 * ssm_key_dim() + ssm_value_dim(); }
};

// The role of one block; the tensor rules say which roles carry each tensor.
enum class SynthLayerKind { ATTENTION, RECURRENT, NEXTN, COUNT };


// How a tensor's values are drawn (synth_fill.h gives the exact distributions).
enum class SynthInit {
  LINEAR,       // Gaussian, std = gain / sqrt(ne[0]) (fan-in)
  NORM,         // 1 + gain * Gaussian (RMSNorm weights, ssm_norm, Qwen3.5's stored 1 + w)
  EMBEDDING,    // Gaussian std gain, plus the shared direction that router skew rides on
  LM_HEAD,      // Gaussian std logits_scale / sqrt(E); special-token rows damped
  ROUTER,       // LINEAR plus the Zipf-weighted skew component along the shared direction
  SSM_A,        // -uniform[1, 16]: already -exp(A_log), as the converter stores it
  SSM_DT_BIAS,  // uniform[-6.9, -2.3]: softplus^-1 of dt in [1e-3, 1e-1]
  COUNT
};

struct SynthInitSpec {
  SynthInit kind = SynthInit::LINEAR;
  float gain = 1.0f;
};

// Which blocks carry a tensor.
enum class SynthWhere { GLOBAL, EVERY_BLOCK, ATTENTION_BLOCKS, RECURRENT_BLOCKS, NEXTN_BLOCKS };
// Variant flags a rule depends on.
enum class SynthVariant { ALWAYS, SEPARATE_GATE_UP, FUSED_GATE_UP };

struct SynthTensorRule {
  TensorName kind;
  SynthWhere where;
  SynthVariant variant;
  std::vector<int64_t> (*shape)(const SynthHparams& hp);  // ggml order, ne[0] contiguous
  SynthInitSpec init;
};

// Metadata is planned as GGUF values so tests can check keys and types without writing a file.
struct SynthMetadata {
  std::vector<GgufKv> kvs;
  void set_u32(const std::string& key, uint32_t v);
  void set_f32(const std::string& key, float v);
  void set_bool(const std::string& key, bool v);
  void set_string(const std::string& key, const std::string& v);
  void set_array_i32(const std::string& key, const std::vector<int32_t>& v);
  void set_array_bool(const std::string& key, const std::vector<bool>& v);
  void set_array_string(const std::string& key, const std::vector<std::string>& v);
  const GgufValue* find(std::string_view key) const;
};

// The attention and routed-expert shapes every architecture's preset starts from (rms_eps, n_embd, context,
// heads, head_dim, experts, fan-out, expert width); the architecture adds its layer count, RoPE and own parts.
SynthHparams synth_preset_shapes(SynthPreset p);

// The keys every architecture writes the same way, under its prefix `a` ("qwen3moe."): the attention and rope
// shape (context_length .. rope.dimension_count), and the routed experts' count, fan-out and width.
void synth_attention_metadata(const std::string& a, const SynthHparams& h, SynthMetadata& m);
void synth_expert_metadata(const std::string& a, const SynthHparams& h, SynthMetadata& m);

struct SynthArchDesc {
  SynthArch arch;
  const char* name;            // general.architecture and the key prefix
  const char* tokenizer_pre;   // tokenizer.ggml.pre
  const char* chat_template;   // default ChatML template for this family
  SynthHparams (*preset)(SynthPreset p);  // the preset's hparams, n_vocab left 0
  SynthLayerKind (*layer_kind)(const SynthHparams& hp, uint32_t block);
  void (*metadata)(const SynthHparams& hp, SynthMetadata& out);  // architecture keys only
  std::span<const SynthTensorRule> tensors;
  bool has_variants;           // accepts --recurrent-flags / --nextn / --fused-gate-up
};

const SynthArchDesc& synth_arch(SynthArch a);
const SynthArchDesc& synth_arch_qwen3moe();
const SynthArchDesc& synth_arch_qwen35moe();

}  // namespace essaim
