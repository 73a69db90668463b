// The small helpers every architecture file shares (tensor names come from gguf/tensor_names.h).
#include "synth/synth_arch.h"

#include <cstdio>
#include <iterator>

#include "core/status.h"

namespace essaim {

std::string_view synth_arch_name(SynthArch a) {
  switch (a) {
    case SynthArch::QWEN3MOE: return "qwen3moe";
    case SynthArch::QWEN35MOE: return "qwen35moe";
    case SynthArch::COUNT: break;
  }
  return "";
}

std::string_view synth_preset_name(SynthPreset p) {
  switch (p) {
    case SynthPreset::TINY: return "tiny";
    case SynthPreset::SMALL: return "small";
    case SynthPreset::Q35_122B: return "q35-122b";
    case SynthPreset::COUNT: break;
  }
  return "";
}

std::string_view synth_type_mix_name(SynthTypeMix t) {
  switch (t) {
    case SynthTypeMix::F32: return "f32";
    case SynthTypeMix::BF16: return "bf16";
    case SynthTypeMix::Q8_0: return "q8_0";
    case SynthTypeMix::Q4_K_M: return "q4_k_m";
    case SynthTypeMix::COUNT: break;
  }
  return "";
}

void SynthMetadata::set_u32(const std::string& key, uint32_t v) {
  kvs.push_back({key, gguf_unsigned(GgufValueType::UINT32, v)});
}
void SynthMetadata::set_f32(const std::string& key, float v) { kvs.push_back({key, gguf_float(GgufValueType::FLOAT32, v)}); }
void SynthMetadata::set_bool(const std::string& key, bool v) { kvs.push_back({key, gguf_bool(v)}); }
void SynthMetadata::set_string(const std::string& key, const std::string& v) { kvs.push_back({key, gguf_string(v)}); }
void SynthMetadata::set_array_i32(const std::string& key, const std::vector<int32_t>& v) {
  kvs.push_back({key, gguf_array_i32(v)});
}
void SynthMetadata::set_array_bool(const std::string& key, const std::vector<bool>& v) {
  kvs.push_back({key, gguf_array_bool(v)});
}
void SynthMetadata::set_array_string(const std::string& key, const std::vector<std::string>& v) {
  kvs.push_back({key, gguf_array_string(v)});
}

SynthHparams synth_preset_shapes(SynthPreset p) {
  SynthHparams h;
  h.rms_eps = 1e-6f;
  if (p == SynthPreset::Q35_122B) {  // Qwen3.5-122B-A10B's per-layer shapes (docs/reference.md 6)
    h.n_embd = 3072;
    h.context_length = 262144;
    h.n_head = 32;
    h.n_head_kv = 2;
    h.head_dim = 256;
    h.n_expert = 256;
    h.n_expert_used = 8;
    h.expert_ff = 1024;
    return h;
  }
  // Every K-quant tensor needs ne[0] % 256 == 0, so E, F and H*D are 256; 6 experts (not 8: llama-quantize
  // special-cases n_expert == 8, which docs/reference.md 3 excludes) keep the files small.
  h.n_embd = 256;
  h.context_length = 4096;
  h.n_head = 4;
  h.n_head_kv = 2;
  h.head_dim = 64;
  h.n_expert = 6;
  h.n_expert_used = 2;
  h.expert_ff = 256;
  if (p == SynthPreset::SMALL) {
    // The trained model of models/ (models/README.md): the real router's fan-out, 32 experts top-8, each 32
    // wide (so the expert down projections, ne[0] = 32, take the Q8_0 fallback in the K-quant mixes).
    h.n_expert = 32;
    h.n_expert_used = 8;
    h.expert_ff = 32;
  }
  return h;
}

void synth_attention_metadata(const std::string& a, const SynthHparams& h, SynthMetadata& m) {
  m.set_u32(a + "context_length", h.context_length);
  m.set_u32(a + "embedding_length", h.n_embd);
  m.set_u32(a + "block_count", h.block_count());
  m.set_u32(a + "attention.head_count", h.n_head);
  m.set_u32(a + "attention.head_count_kv", h.n_head_kv);
  m.set_u32(a + "attention.key_length", h.head_dim);
  m.set_u32(a + "attention.value_length", h.head_dim);
  m.set_f32(a + "attention.layer_norm_rms_epsilon", h.rms_eps);
  m.set_f32(a + "rope.freq_base", h.rope_freq_base);
  m.set_u32(a + "rope.dimension_count", h.n_rot);
}

void synth_expert_metadata(const std::string& a, const SynthHparams& h, SynthMetadata& m) {
  m.set_u32(a + "expert_count", h.n_expert);
  m.set_u32(a + "expert_used_count", h.n_expert_used);
  m.set_u32(a + "expert_feed_forward_length", h.expert_ff);
}

const GgufValue* SynthMetadata::find(std::string_view key) const {
  for (const GgufKv& kv : kvs)
    if (kv.key == key) return &kv.value;
  return nullptr;
}

const SynthArchDesc& synth_arch(SynthArch a) {
  switch (a) {
    case SynthArch::QWEN3MOE: return synth_arch_qwen3moe();
    case SynthArch::QWEN35MOE: return synth_arch_qwen35moe();
    case SynthArch::COUNT: break;
  }
  ESSAIM_CHECK(false && "unknown synth architecture");
  return synth_arch_qwen3moe();
}

}  // namespace essaim
