// qwen35moe as data: presets, the tensor table of docs/reference.md 5.3 (gated attention blocks, Gated DeltaNet
// blocks, shared expert, MTP blocks) and the metadata keys of 5.1 with the exact GGUF types of section 9.
// Variants: per-layer recurrent flags instead of the interval, N appended MTP blocks, fused gate+up experts.
#include "synth/synth_arch.h"

namespace essaim {
namespace {

using Shape = std::vector<int64_t>;
using H = SynthHparams;

SynthHparams qwen35moe_preset(SynthPreset p) {
  SynthHparams h = synth_preset_shapes(p);
  h.rope_freq_base = 1e7f;
  h.ssm_conv_kernel = 4;
  h.full_attention_interval = 4;
  if (p == SynthPreset::Q35_122B) {  // Qwen3.5-122B-A10B (docs/reference.md 6)
    h.n_layer = 2;
    h.n_rot = 64;
    h.rope_sections = {11, 11, 10, 0};
    h.shared_ff = 1024;
    h.ssm_state_size = 128;
    h.ssm_group_count = 16;
    h.ssm_time_step_rank = 64;
    return h;
  }
  // Tiny: four blocks = three Gated DeltaNet + one gated attention, the real 3:1 pattern; small (the trained
  // model of models/): two rounds of it. Fs and the GDN value width are 256 (ne[0] % 256 == 0 for K-quants).
  // n_rot = D/4 as in Qwen3.5, sections sum to n_rot/2 and map every pair to t/h/w (docs/reference.md 5.5).
  h.n_layer = p == SynthPreset::SMALL ? 8 : 4;
  h.n_rot = 16;
  h.rope_sections = {3, 3, 2, 0};
  h.shared_ff = 256;
  h.ssm_state_size = 64;
  h.ssm_group_count = 2;
  h.ssm_time_step_rank = 4;
  return h;
}

// docs/reference.md 5.2: recurrent(i) = i < n_layer and (i + 1) mod interval != 0; MTP blocks are attention.
SynthLayerKind qwen35moe_layer_kind(const SynthHparams& h, uint32_t block) {
  if (block >= h.n_layer) return SynthLayerKind::NEXTN;
  return (block + 1) % h.full_attention_interval != 0 ? SynthLayerKind::RECURRENT : SynthLayerKind::ATTENTION;
}

void qwen35moe_metadata(const SynthHparams& h, SynthMetadata& m) {
  const std::string a = "qwen35moe.";
  synth_attention_metadata(a, h, m);
  m.set_array_i32(a + "rope.dimension_sections",
                  {h.rope_sections[0], h.rope_sections[1], h.rope_sections[2], h.rope_sections[3]});
  synth_expert_metadata(a, h, m);
  m.set_u32(a + "expert_shared_feed_forward_length", h.shared_ff);
  m.set_u32(a + "ssm.conv_kernel", h.ssm_conv_kernel);
  m.set_u32(a + "ssm.inner_size", h.ssm_value_dim());
  m.set_u32(a + "ssm.state_size", h.ssm_state_size);
  m.set_u32(a + "ssm.time_step_rank", h.ssm_time_step_rank);
  m.set_u32(a + "ssm.group_count", h.ssm_group_count);
  if (h.recurrent_flags) {
    // One flag per block, MTP blocks included (and false), as llama.cpp reads it with n_layer_all entries.
    std::vector<bool> flags(h.block_count());
    for (uint32_t i = 0; i < h.block_count(); ++i)
      flags[i] = qwen35moe_layer_kind(h, i) == SynthLayerKind::RECURRENT;
    m.set_array_bool(a + "attention.recurrent_layers", flags);
  } else {
    m.set_u32(a + "full_attention_interval", h.full_attention_interval);
  }
  if (h.n_nextn > 0) m.set_u32(a + "nextn_predict_layers", h.n_nextn);
}

using K = TensorName;
using W = SynthWhere;
using V = SynthVariant;
using I = SynthInit;

const SynthTensorRule kTensors[] = {
    {K::TOKEN_EMBD, W::GLOBAL, V::ALWAYS, [](const H& h) { return Shape{h.n_embd, h.n_vocab}; }, {I::EMBEDDING, 1.0f}},
    {K::OUTPUT_NORM, W::GLOBAL, V::ALWAYS, [](const H& h) { return Shape{h.n_embd}; }, {I::NORM, 0.02f}},
    {K::OUTPUT, W::GLOBAL, V::ALWAYS, [](const H& h) { return Shape{h.n_embd, h.n_vocab}; }, {I::LM_HEAD, 1.0f}},
    // Every block: norms, router, routed and shared experts.
    {K::ATTN_NORM, W::EVERY_BLOCK, V::ALWAYS, [](const H& h) { return Shape{h.n_embd}; }, {I::NORM, 0.02f}},
    {K::POST_ATTN_NORM, W::EVERY_BLOCK, V::ALWAYS, [](const H& h) { return Shape{h.n_embd}; }, {I::NORM, 0.02f}},
    {K::FFN_GATE_INP, W::EVERY_BLOCK, V::ALWAYS, [](const H& h) { return Shape{h.n_embd, h.n_expert}; },
     {I::ROUTER, 1.0f}},
    {K::FFN_GATE_EXPS, W::EVERY_BLOCK, V::SEPARATE_GATE_UP,
     [](const H& h) { return Shape{h.n_embd, h.expert_ff, h.n_expert}; }, {I::LINEAR, 1.0f}},
    {K::FFN_UP_EXPS, W::EVERY_BLOCK, V::SEPARATE_GATE_UP,
     [](const H& h) { return Shape{h.n_embd, h.expert_ff, h.n_expert}; }, {I::LINEAR, 1.0f}},
    {K::FFN_GATE_UP_EXPS, W::EVERY_BLOCK, V::FUSED_GATE_UP,
     [](const H& h) { return Shape{h.n_embd, 2 * int64_t(h.expert_ff), h.n_expert}; }, {I::LINEAR, 1.0f}},
    {K::FFN_DOWN_EXPS, W::EVERY_BLOCK, V::ALWAYS,
     [](const H& h) { return Shape{h.expert_ff, h.n_embd, h.n_expert}; }, {I::LINEAR, 0.5f}},
    {K::FFN_GATE_INP_SHEXP, W::EVERY_BLOCK, V::ALWAYS, [](const H& h) { return Shape{h.n_embd}; },
     {I::LINEAR, 1.0f}},
    {K::FFN_GATE_SHEXP, W::EVERY_BLOCK, V::ALWAYS, [](const H& h) { return Shape{h.n_embd, h.shared_ff}; },
     {I::LINEAR, 1.0f}},
    {K::FFN_UP_SHEXP, W::EVERY_BLOCK, V::ALWAYS, [](const H& h) { return Shape{h.n_embd, h.shared_ff}; },
     {I::LINEAR, 1.0f}},
    {K::FFN_DOWN_SHEXP, W::EVERY_BLOCK, V::ALWAYS, [](const H& h) { return Shape{h.shared_ff, h.n_embd}; },
     {I::LINEAR, 0.5f}},
    // Gated full attention (main attention blocks and MTP blocks): q and its gate interleaved per head.
    {K::ATTN_Q, W::ATTENTION_BLOCKS, V::ALWAYS,
     [](const H& h) { return Shape{h.n_embd, 2 * int64_t(h.n_head) * h.head_dim}; }, {I::LINEAR, 1.0f}},
    {K::ATTN_K, W::ATTENTION_BLOCKS, V::ALWAYS,
     [](const H& h) { return Shape{h.n_embd, int64_t(h.n_head_kv) * h.head_dim}; }, {I::LINEAR, 1.0f}},
    {K::ATTN_V, W::ATTENTION_BLOCKS, V::ALWAYS,
     [](const H& h) { return Shape{h.n_embd, int64_t(h.n_head_kv) * h.head_dim}; }, {I::LINEAR, 1.0f}},
    {K::ATTN_Q_NORM, W::ATTENTION_BLOCKS, V::ALWAYS, [](const H& h) { return Shape{h.head_dim}; },
     {I::NORM, 0.02f}},
    {K::ATTN_K_NORM, W::ATTENTION_BLOCKS, V::ALWAYS, [](const H& h) { return Shape{h.head_dim}; },
     {I::NORM, 0.02f}},
    {K::ATTN_OUTPUT, W::ATTENTION_BLOCKS, V::ALWAYS,
     [](const H& h) { return Shape{int64_t(h.n_head) * h.head_dim, h.n_embd}; }, {I::LINEAR, 0.5f}},
    // Gated DeltaNet blocks. ssm_conv1d's fan-in is its Kc taps.
    {K::ATTN_QKV, W::RECURRENT_BLOCKS, V::ALWAYS, [](const H& h) { return Shape{h.n_embd, h.ssm_conv_channels()}; },
     {I::LINEAR, 1.0f}},
    {K::ATTN_GATE, W::RECURRENT_BLOCKS, V::ALWAYS, [](const H& h) { return Shape{h.n_embd, h.ssm_value_dim()}; },
     {I::LINEAR, 1.0f}},
    {K::SSM_CONV1D, W::RECURRENT_BLOCKS, V::ALWAYS,
     [](const H& h) { return Shape{h.ssm_conv_kernel, h.ssm_conv_channels()}; }, {I::LINEAR, 1.0f}},
    {K::SSM_DT_BIAS, W::RECURRENT_BLOCKS, V::ALWAYS, [](const H& h) { return Shape{h.ssm_time_step_rank}; },
     {I::SSM_DT_BIAS, 1.0f}},
    {K::SSM_A, W::RECURRENT_BLOCKS, V::ALWAYS, [](const H& h) { return Shape{h.ssm_time_step_rank}; },
     {I::SSM_A, 1.0f}},
    {K::SSM_BETA, W::RECURRENT_BLOCKS, V::ALWAYS, [](const H& h) { return Shape{h.n_embd, h.ssm_time_step_rank}; },
     {I::LINEAR, 1.0f}},
    {K::SSM_ALPHA, W::RECURRENT_BLOCKS, V::ALWAYS, [](const H& h) { return Shape{h.n_embd, h.ssm_time_step_rank}; },
     {I::LINEAR, 1.0f}},
    {K::SSM_NORM, W::RECURRENT_BLOCKS, V::ALWAYS, [](const H& h) { return Shape{h.ssm_state_size}; },
     {I::NORM, 0.02f}},
    {K::SSM_OUT, W::RECURRENT_BLOCKS, V::ALWAYS, [](const H& h) { return Shape{h.ssm_value_dim(), h.n_embd}; },
     {I::LINEAR, 0.5f}},
    // MTP blocks: the attention + MoE set above plus these (embed_tokens / shared_head_head are optional and
    // Qwen3.5 files normally omit them, docs/reference.md 5.3).
    {K::NEXTN_EH_PROJ, W::NEXTN_BLOCKS, V::ALWAYS, [](const H& h) { return Shape{2 * int64_t(h.n_embd), h.n_embd}; },
     {I::LINEAR, 1.0f}},
    {K::NEXTN_ENORM, W::NEXTN_BLOCKS, V::ALWAYS, [](const H& h) { return Shape{h.n_embd}; }, {I::NORM, 0.02f}},
    {K::NEXTN_HNORM, W::NEXTN_BLOCKS, V::ALWAYS, [](const H& h) { return Shape{h.n_embd}; }, {I::NORM, 0.02f}},
    {K::NEXTN_SHARED_HEAD_NORM, W::NEXTN_BLOCKS, V::ALWAYS, [](const H& h) { return Shape{h.n_embd}; },
     {I::NORM, 0.02f}},
};

// Qwen3.5 ChatML: the generation prompt opens a think block unless enable_thinking is false (REFERENCE 7.7).
constexpr const char* kChatTemplate =
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}"
    "{{- '<think>\\n' }}"
    "{%- endif %}"
    "{%- endif %}";

}  // namespace

const SynthArchDesc& synth_arch_qwen35moe() {
  static const SynthArchDesc desc{
      .arch = SynthArch::QWEN35MOE,
      .name = "qwen35moe",
      .tokenizer_pre = "qwen35",
      .chat_template = kChatTemplate,
      .preset = qwen35moe_preset,
      .layer_kind = qwen35moe_layer_kind,
      .metadata = qwen35moe_metadata,
      .tensors = kTensors,
      .has_variants = true,
  };
  return desc;
}

}  // namespace essaim
