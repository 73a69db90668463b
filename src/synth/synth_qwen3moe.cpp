// qwen3moe as data: presets, the tensor table of docs/reference.md 4.2 (separate q/k/v, per-head q/k RMSNorm,
// routed experts only) and the metadata keys of 4.1 with the exact GGUF types of section 9.
#include "synth/synth_arch.h"

namespace essaim {
namespace {

using Shape = std::vector<int64_t>;
using H = SynthHparams;

// The shared preset shapes in a plain qwen3moe stack: two layers (eight for small, qwen35moe's small preset).
SynthHparams qwen3moe_preset(SynthPreset p) {
  SynthHparams h = synth_preset_shapes(p);
  h.n_layer = p == SynthPreset::SMALL ? 8 : 2;
  h.n_rot = h.head_dim;  // qwen3moe requires rope.dimension_count == D
  h.rope_freq_base = p == SynthPreset::Q35_122B ? 1e7f : 1e6f;
  return h;
}

SynthLayerKind qwen3moe_layer_kind(const SynthHparams&, uint32_t) { return SynthLayerKind::ATTENTION; }

void qwen3moe_metadata(const SynthHparams& h, SynthMetadata& m) {
  const std::string a = "qwen3moe.";
  synth_attention_metadata(a, h, m);
  synth_expert_metadata(a, h, m);
}

using K = TensorName;
using W = SynthWhere;
using V = SynthVariant;
using I = SynthInit;

// Output projections get gain 0.5 so each block adds less than the residual it reads (sane activations over
// a few random layers); norms carry +-2% noise around 1.
const SynthTensorRule kTensors[] = {
    {K::TOKEN_EMBD, W::GLOBAL, V::ALWAYS, [](const H& h) { return Shape{h.n_embd, h.n_vocab}; }, {I::EMBEDDING, 1.0f}},
    {K::OUTPUT_NORM, W::GLOBAL, V::ALWAYS, [](const H& h) { return Shape{h.n_embd}; }, {I::NORM, 0.02f}},
    {K::OUTPUT, W::GLOBAL, V::ALWAYS, [](const H& h) { return Shape{h.n_embd, h.n_vocab}; }, {I::LM_HEAD, 1.0f}},
    {K::ATTN_NORM, W::EVERY_BLOCK, V::ALWAYS, [](const H& h) { return Shape{h.n_embd}; }, {I::NORM, 0.02f}},
    {K::ATTN_Q, W::EVERY_BLOCK, V::ALWAYS,
     [](const H& h) { return Shape{h.n_embd, int64_t(h.n_head) * h.head_dim}; }, {I::LINEAR, 1.0f}},
    {K::ATTN_K, W::EVERY_BLOCK, V::ALWAYS,
     [](const H& h) { return Shape{h.n_embd, int64_t(h.n_head_kv) * h.head_dim}; }, {I::LINEAR, 1.0f}},
    {K::ATTN_V, W::EVERY_BLOCK, V::ALWAYS,
     [](const H& h) { return Shape{h.n_embd, int64_t(h.n_head_kv) * h.head_dim}; }, {I::LINEAR, 1.0f}},
    {K::ATTN_Q_NORM, W::EVERY_BLOCK, V::ALWAYS, [](const H& h) { return Shape{h.head_dim}; }, {I::NORM, 0.02f}},
    {K::ATTN_K_NORM, W::EVERY_BLOCK, V::ALWAYS, [](const H& h) { return Shape{h.head_dim}; }, {I::NORM, 0.02f}},
    {K::ATTN_OUTPUT, W::EVERY_BLOCK, V::ALWAYS,
     [](const H& h) { return Shape{int64_t(h.n_head) * h.head_dim, h.n_embd}; }, {I::LINEAR, 0.5f}},
    {K::FFN_NORM, W::EVERY_BLOCK, V::ALWAYS, [](const H& h) { return Shape{h.n_embd}; }, {I::NORM, 0.02f}},
    {K::FFN_GATE_INP, W::EVERY_BLOCK, V::ALWAYS, [](const H& h) { return Shape{h.n_embd, h.n_expert}; },
     {I::ROUTER, 1.0f}},
    {K::FFN_GATE_EXPS, W::EVERY_BLOCK, V::ALWAYS,
     [](const H& h) { return Shape{h.n_embd, h.expert_ff, h.n_expert}; }, {I::LINEAR, 1.0f}},
    {K::FFN_UP_EXPS, W::EVERY_BLOCK, V::ALWAYS,
     [](const H& h) { return Shape{h.n_embd, h.expert_ff, h.n_expert}; }, {I::LINEAR, 1.0f}},
    {K::FFN_DOWN_EXPS, W::EVERY_BLOCK, V::ALWAYS,
     [](const H& h) { return Shape{h.expert_ff, h.n_embd, h.n_expert}; }, {I::LINEAR, 0.5f}},
};

// The Qwen3 ChatML template: thinking on by default; enable_thinking=false pre-fills an empty think block.
constexpr const char* kChatTemplate =
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}";

}  // namespace

const SynthArchDesc& synth_arch_qwen3moe() {
  static const SynthArchDesc desc{
      .arch = SynthArch::QWEN3MOE,
      .name = "qwen3moe",
      .tokenizer_pre = "qwen2",
      .chat_template = kChatTemplate,
      .preset = qwen3moe_preset,
      .layer_kind = qwen3moe_layer_kind,
      .metadata = qwen3moe_metadata,
      .tensors = kTensors,
      .has_variants = false,
  };
  return desc;
}

}  // namespace essaim
