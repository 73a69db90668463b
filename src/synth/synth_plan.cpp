// Lays a synthetic file out: checks the options, derives the hparams from the preset, expands the
// architecture's tensor table over the blocks, sorts in llama-quantize order, applies the type mix, and
// plans the metadata (general.*, architecture keys, tokenizer keys) with their exact GGUF types.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/status.h"
#include "synth/synth.h"
#include "synth/synth_quant_rule.h"
#include "synth/synth_vocab.h"

namespace essaim {
namespace {

constexpr uint32_t kMaxBlocks = 512;  // llama.cpp's LLAMA_MAX_LAYERS

Status check_options(const SynthOptions& o, const SynthArchDesc& arch) {
  if (!(o.router_skew >= 0.0f) || !std::isfinite(o.router_skew))
    return Status::error("--router-skew must be a finite number >= 0");
  if (!(o.logits_scale > 0.0f) || !std::isfinite(o.logits_scale))
    return Status::error("--logits-scale must be a finite number > 0");
  if (!arch.has_variants && (o.recurrent_flags || o.nextn > 0 || o.fused_gate_up))
    return Status::error(std::string("--recurrent-flags, --nextn and --fused-gate-up apply to qwen35moe, not ") +
                         arch.name);
  if (o.layers && *o.layers == 0) return Status::error("--layers must be at least 1");
  if (o.layers && *o.layers > kMaxBlocks)
    return Status::error("--layers must be at most " + std::to_string(kMaxBlocks) + " (llama.cpp's limit)");
  if (o.nextn >= kMaxBlocks) return Status::error("--nextn is too large");
  return Status::ok();
}

int block_of(const std::string& name) {
  int layer = -1;
  if (std::sscanf(name.c_str(), "blk.%d.", &layer) != 1) return -1;
  return layer;
}

bool rule_applies(const SynthTensorRule& r, const SynthHparams& hp, SynthLayerKind kind) {
  if (r.variant == SynthVariant::SEPARATE_GATE_UP && hp.fused_gate_up) return false;
  if (r.variant == SynthVariant::FUSED_GATE_UP && !hp.fused_gate_up) return false;
  switch (r.where) {
    case SynthWhere::GLOBAL: return false;  // handled separately
    case SynthWhere::EVERY_BLOCK: return true;
    case SynthWhere::ATTENTION_BLOCKS: return kind == SynthLayerKind::ATTENTION || kind == SynthLayerKind::NEXTN;
    case SynthWhere::RECURRENT_BLOCKS: return kind == SynthLayerKind::RECURRENT;
    case SynthWhere::NEXTN_BLOCKS: return kind == SynthLayerKind::NEXTN;
  }
  return false;
}

void plan_tokenizer_metadata(const Vocab& v, SynthMetadata& m) {
  m.set_string("tokenizer.ggml.model", v.model);
  m.set_string("tokenizer.ggml.pre", v.pre);
  m.set_array_string("tokenizer.ggml.tokens", v.tokens);
  std::vector<int32_t> types(v.types.size());
  std::transform(v.types.begin(), v.types.end(), types.begin(), [](TokenType t) { return int32_t(t); });
  m.set_array_i32("tokenizer.ggml.token_type", types);
  m.set_array_string("tokenizer.ggml.merges", v.merges);
  if (v.bos_id) m.set_u32("tokenizer.ggml.bos_token_id", *v.bos_id);
  if (v.eos_id) m.set_u32("tokenizer.ggml.eos_token_id", *v.eos_id);
  if (v.pad_id) m.set_u32("tokenizer.ggml.padding_token_id", *v.pad_id);
  if (v.unk_id) m.set_u32("tokenizer.ggml.unknown_token_id", *v.unk_id);
  if (v.eot_id) m.set_u32("tokenizer.ggml.eot_token_id", *v.eot_id);
  m.set_bool("tokenizer.ggml.add_bos_token", v.add_bos);
  if (v.add_eos) m.set_bool("tokenizer.ggml.add_eos_token", true);
  if (!v.chat_template.empty()) m.set_string("tokenizer.chat_template", v.chat_template);
}

}  // namespace

uint64_t SynthTensor::rows() const {
  uint64_t r = 1;
  for (size_t i = 1; i < ne.size(); ++i) r *= uint64_t(ne[i]);
  return r;
}

uint64_t SynthPlan::tensor_bytes() const {
  uint64_t sum = 0;
  for (const SynthTensor& t : tensors) sum += t.nbytes;
  return sum;
}

bool synth_tensor_order_less(const std::string& a, const std::string& b) {
  const int la = block_of(a), lb = block_of(b);
  if (la != lb) return la < lb;
  return a < b;
}

// More routed experts than any model essaim targets (Qwen3.5 has 256 or 512), so a typo cannot ask for a
// file of terabytes.
constexpr uint32_t kMaxSynthExperts = 1024;

Result<SynthPlan> synth_plan(const SynthOptions& options) {
  if (options.arch >= SynthArch::COUNT || options.preset >= SynthPreset::COUNT ||
      options.types >= SynthTypeMix::COUNT)
    return Status::error("unknown architecture, preset or type mix");
  const SynthArchDesc& arch = synth_arch(options.arch);
  ESSAIM_RETURN_IF_ERROR(check_options(options, arch));

  SynthPlan plan;
  plan.options = options;
  plan.arch = &arch;
  ESSAIM_ASSIGN_OR_RETURN(plan.vocab, synth_vocab_for(arch, options.tokenizer_json));
  SynthHparams& hp = plan.hp;
  hp = arch.preset(options.preset);
  if (options.layers) hp.n_layer = *options.layers;
  if (options.experts) {
    if (*options.experts < hp.n_expert_used || *options.experts > kMaxSynthExperts)
      return Status::error("experts must be in [" + std::to_string(hp.n_expert_used) + ", " +
                           std::to_string(kMaxSynthExperts) + "] (the preset routes to " +
                           std::to_string(hp.n_expert_used) + " per token)");
    hp.n_expert = *options.experts;
  }
  hp.n_nextn = options.nextn;
  hp.recurrent_flags = options.recurrent_flags;
  hp.fused_gate_up = options.fused_gate_up;
  if (hp.block_count() > kMaxBlocks)
    return Status::error("--layers + --nextn = " + std::to_string(hp.block_count()) +
                         " blocks; llama.cpp loads at most " + std::to_string(kMaxBlocks));
  hp.n_vocab = uint32_t(plan.vocab.tokens.size());
  if (plan.vocab.tokens.size() > uint64_t(INT32_MAX)) return Status::error("tokenizer has too many tokens");

  // Expand the table: global tensors once, the others once per block that carries them.
  for (const SynthTensorRule& r : arch.tensors) {
    if (r.where != SynthWhere::GLOBAL) continue;
    ESSAIM_CHECK(!tensor_name_is_per_layer(r.kind));
    plan.tensors.push_back({.name = tensor_name(r.kind), .kind = r.kind, .layer = -1,
                            .ne = r.shape(hp), .init = r.init});
  }
  for (uint32_t il = 0; il < hp.block_count(); ++il) {
    const SynthLayerKind kind = arch.layer_kind(hp, il);
    for (const SynthTensorRule& r : arch.tensors)
      if (rule_applies(r, hp, kind))
        plan.tensors.push_back({.name = tensor_name(r.kind, int32_t(il)), .kind = r.kind, .layer = int32_t(il),
                                .ne = r.shape(hp), .init = r.init});
  }
  std::sort(plan.tensors.begin(), plan.tensors.end(),
            [](const SynthTensor& a, const SynthTensor& b) { return synth_tensor_order_less(a.name, b.name); });

  // Type mix. attn_v-like tensors are counted in file order, as llama-quantize walks them.
  uint32_t attn_v_count = 0;
  bool has_output = false;
  for (const SynthTensor& t : plan.tensors) {
    if (t.kind == TensorName::ATTN_V || t.kind == TensorName::ATTN_QKV) ++attn_v_count;
    if (t.kind == TensorName::OUTPUT) has_output = true;
  }
  uint32_t attn_v_ordinal = 0;
  for (SynthTensor& t : plan.tensors) {
    const SynthTypeQuery q{.kind = t.kind, .n_dims = uint32_t(t.ne.size()), .ne0 = t.ne[0],
                           .layer = t.layer < 0 ? 0u : uint32_t(t.layer), .block_count = hp.block_count(),
                           .attn_v_ordinal = attn_v_ordinal, .attn_v_count = attn_v_count,
                           .has_output = has_output};
    if (t.kind == TensorName::ATTN_V || t.kind == TensorName::ATTN_QKV) ++attn_v_ordinal;
    t.type = synth_tensor_type(options.types, q);
    const TypeTraits& tt = type_traits(t.type);
    // Every quantised row is a whole number of blocks (the rule falls back to Q8_0 where 256 does not divide).
    if (t.ne[0] % tt.block_size != 0)
      return Status::error(t.name + ": rows of " + std::to_string(t.ne[0]) + " elements are not whole " +
                           std::string(type_traits(t.type).name) + " blocks");
    t.nbytes = tt.row_bytes(uint64_t(t.ne[0])) * t.rows();
  }

  // Metadata: general.*, the architecture's keys, the tokenizer.
  SynthMetadata& m = plan.metadata;
  m.set_string("general.architecture", arch.name);
  m.set_string("general.name", !options.name.empty() ? options.name
                                                     : "essaim-synth " + std::string(arch.name) + " " +
                                                           std::string(synth_preset_name(options.preset)));
  m.set_u32("general.file_type", synth_file_type(options.types));
  if (options.types != SynthTypeMix::F32) m.set_u32("general.quantization_version", 2);
  arch.metadata(hp, m);
  plan_tokenizer_metadata(plan.vocab, m);
  return plan;
}

}  // namespace essaim
