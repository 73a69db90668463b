#include "model/qwen35moe_hparams.h"

#include <algorithm>
#include <optional>
#include <string>

#include "model/hparams_reader.h"

namespace essaim {
namespace {

constexpr const char* kArch = "qwen35moe";
constexpr uint64_t kMaxRecurrentStateFloats = uint64_t(1) << 28;  // 1 GiB per layer

std::string str(uint64_t v) { return std::to_string(v); }

// Which executed layers are recurrent (docs/reference.md 5.2): the per-layer flag array when present (BOOL,
// INT32 or UINT32, one entry per block), else every layer but each `interval`-th. MTP blocks are always
// gated-attention blocks; their entries of the array, if any, are not consulted.
Result<std::vector<bool>> read_recurrent_layers(const GgufFile& f, const HparamReader& keys, uint32_t n_block,
                                                uint32_t n_layer) {
  std::vector<bool> rec(n_block, false);
  const std::string k = keys.key("attention.recurrent_layers");
  if (const GgufValue* v = f.find_kv(k)) {
    if (v->type != GgufValueType::ARRAY ||
        (v->elem_type != GgufValueType::BOOL && v->elem_type != GgufValueType::INT32 &&
         v->elem_type != GgufValueType::UINT32))
      return Status::error("metadata key '" + k + "' has type " + std::string(gguf_value_type_name(v->type)) +
                           ", expected an array of BOOL, INT32 or UINT32");
    if (v->array_size() != n_block)
      return Status::error("metadata key '" + k + "' has " + str(v->array_size()) +
                           " entries, expected one per block (" + str(n_block) + ")");
    for (uint32_t i = 0; i < n_layer; ++i)
      rec[i] = v->elem_type == GgufValueType::INT32 ? v->ints[i] != 0 : v->uints[i] != 0;
    return rec;
  }
  ESSAIM_ASSIGN_OR_RETURN(uint32_t interval, keys.u32_or("full_attention_interval", 4));
  ESSAIM_RETURN_IF_ERROR(keys.check_range("full_attention_interval", interval, 1, UINT32_MAX));
  for (uint32_t i = 0; i < n_layer; ++i) rec[i] = (i + 1) % interval != 0;
  return rec;
}

// rope.dimension_sections: an INT32/UINT32 array of exactly 4, or one INT32/UINT32 broadcast to all four.
Result<std::array<int32_t, 4>> read_rope_sections(const GgufFile& f, const HparamReader& keys) {
  const std::string k = keys.key("rope.dimension_sections");
  const GgufValue* v = f.find_kv(k);
  if (!v) return Status::error("required metadata key '" + k + "' is missing");
  std::array<int64_t, 4> s{};
  if (v->type == GgufValueType::INT32 || v->type == GgufValueType::UINT32) {
    s.fill(v->type == GgufValueType::INT32 ? v->i : int64_t(v->u));
  } else if (v->type == GgufValueType::ARRAY &&
             (v->elem_type == GgufValueType::INT32 || v->elem_type == GgufValueType::UINT32)) {
    if (v->array_size() != 4)
      return Status::error("metadata key '" + k + "' has " + str(v->array_size()) + " entries, expected 4");
    for (size_t i = 0; i < 4; ++i) s[i] = v->elem_type == GgufValueType::INT32 ? v->ints[i] : int64_t(v->uints[i]);
  } else {
    return Status::error("metadata key '" + k + "' has type " + std::string(gguf_value_type_name(v->type)) +
                         ", expected an INT32 or UINT32 array of 4");
  }
  std::array<int32_t, 4> out{};
  int64_t sum = 0;
  for (size_t i = 0; i < 4; ++i) {
    if (s[i] < 0 || s[i] > 65536)
      return Status::error("metadata key '" + k + "' entry " + str(i) + " = " + std::to_string(s[i]) +
                           " is outside [0, 65536]");
    out[i] = int32_t(s[i]);
    sum += s[i];
  }
  // Pair i uses section slot i mod (s0+s1+s2+s3): an all-zero layout has no slots at all.
  if (sum == 0) return Status::error("metadata key '" + k + "' has all sections 0");
  return out;
}

// Gated attention. Head counts may be per-layer arrays; recurrent layers may carry anything there (they have no
// softmax heads), every attention block (MTP blocks included) must agree.
Status read_attention(const HparamReader& keys, uint32_t n_block, Qwen35Hparams& hp) {
  const uint32_t n_embd = uint32_t(hp.n_embd);
  ESSAIM_ASSIGN_OR_RETURN(std::vector<uint32_t> heads, keys.u32_per_layer("attention.head_count", n_block, {}));
  std::optional<uint32_t> kv_fallback;
  for (uint32_t i = 0; i < n_block && !kv_fallback; ++i)
    if (!hp.recurrent[i]) kv_fallback = heads[i];
  ESSAIM_ASSIGN_OR_RETURN(std::vector<uint32_t> heads_kv,
                          keys.u32_per_layer("attention.head_count_kv", n_block, kv_fallback.value_or(1)));
  // The first attention block's counts (block 0's when every block is recurrent) must hold for all of them.
  const uint32_t first = kv_fallback ? uint32_t(std::find(hp.recurrent.begin(), hp.recurrent.end(), false) -
                                                hp.recurrent.begin())
                                     : 0;
  hp.n_head = int32_t(std::min<uint32_t>(heads[first], 1u << 20));
  hp.n_head_kv = int32_t(std::min<uint32_t>(heads_kv[first], 1u << 20));
  for (uint32_t i = 0; i < n_block; ++i)
    if (!hp.recurrent[i] && (heads[i] != heads[first] || heads_kv[i] != heads_kv[first]))
      return Status::error("qwen35moe: head counts that vary between attention layers are not supported");
  ESSAIM_ASSIGN_OR_RETURN(const HparamReader::AttentionHeads ah,
                          keys.attention_heads(uint32_t(hp.n_head), uint32_t(hp.n_head_kv), n_embd));
  hp.head_dim = ah.head_dim;
  return Status::ok();
}

// Rotary embedding: its width (even, at most the head dimension), base and M-RoPE sections; no scaling.
Status read_rope(const GgufFile& f, const HparamReader& keys, Qwen35Hparams& hp) {
  const uint32_t key_len = uint32_t(hp.head_dim);
  ESSAIM_ASSIGN_OR_RETURN(uint32_t n_rot, keys.u32_or("rope.dimension_count", key_len));
  if (n_rot > key_len || n_rot % 2 != 0)
    return Status::error("metadata key 'qwen35moe.rope.dimension_count' = " + str(n_rot) +
                         " must be even and at most the head dimension (" + str(key_len) + ")");
  hp.n_rot = int32_t(n_rot);
  ESSAIM_ASSIGN_OR_RETURN(hp.rope_base, keys.f32_or("rope.freq_base", 10000.0f));
  if (!(hp.rope_base > 0.0f)) return Status::error("metadata key 'qwen35moe.rope.freq_base' must be positive");
  ESSAIM_ASSIGN_OR_RETURN(hp.rope_sections, read_rope_sections(f, keys));
  ESSAIM_RETURN_IF_ERROR(keys.refuse_rope_scaling());
  return Status::ok();
}

// Gated DeltaNet (docs/reference.md 5.1: all five keys required, Dv = inner_size / Hv = state_size = Dk).
Status read_gated_deltanet(const HparamReader& keys, Qwen35Hparams& hp) {
  ESSAIM_ASSIGN_OR_RETURN(uint32_t kc, keys.u32("ssm.conv_kernel"));
  ESSAIM_RETURN_IF_ERROR(keys.check_range("ssm.conv_kernel", kc, 1, 64));
  ESSAIM_ASSIGN_OR_RETURN(uint32_t d_inner, keys.u32("ssm.inner_size"));
  ESSAIM_ASSIGN_OR_RETURN(uint32_t d_state, keys.u32("ssm.state_size"));
  ESSAIM_RETURN_IF_ERROR(keys.check_range("ssm.state_size", d_state, 1, 4096));
  ESSAIM_ASSIGN_OR_RETURN(uint32_t n_v_heads, keys.u32("ssm.time_step_rank"));
  ESSAIM_RETURN_IF_ERROR(keys.check_range("ssm.time_step_rank", n_v_heads, 1, 4096));
  ESSAIM_ASSIGN_OR_RETURN(uint32_t n_k_heads, keys.u32("ssm.group_count"));
  ESSAIM_RETURN_IF_ERROR(keys.check_range("ssm.group_count", n_k_heads, 1, n_v_heads));
  if (uint64_t(n_v_heads) * d_state != d_inner)
    return Status::error("qwen35moe: ssm.inner_size (" + str(d_inner) + ") must equal ssm.time_step_rank (" +
                         str(n_v_heads) + ") x ssm.state_size (" + str(d_state) + ")");
  // Value head h reads key head h mod Hk (tiled, docs/reference.md 5.6); llama.cpp repeats the key heads Hv/Hk
  // times, which needs a whole multiple.
  if (n_v_heads % n_k_heads != 0)
    return Status::error("qwen35moe: ssm.time_step_rank (" + str(n_v_heads) +
                         ") is not a multiple of ssm.group_count (" + str(n_k_heads) + ")");
  // The per-sequence state is Hv·Dk·Dk floats per GDN layer (4 MiB for Qwen3.5): refuse sizes no model has
  // before a cache allocation could fail on them.
  if (uint64_t(d_inner) * d_state > kMaxRecurrentStateFloats)
    return Status::error("qwen35moe: a recurrent state of ssm.inner_size x ssm.state_size = " +
                         str(uint64_t(d_inner) * d_state) + " floats per layer exceeds the limit of " +
                         str(kMaxRecurrentStateFloats));
  hp.ssm_conv_kernel = int32_t(kc);
  hp.ssm_n_k_heads = int32_t(n_k_heads);
  hp.ssm_n_v_heads = int32_t(n_v_heads);
  hp.ssm_head_dim = int32_t(d_state);

  return Status::ok();
}

// MoE: routed experts and the shared expert.
Status read_experts(const HparamReader& keys, uint32_t n_block, Qwen35Hparams& hp) {
  ESSAIM_ASSIGN_OR_RETURN(const HparamReader::ExpertCounts experts, keys.expert_counts());
  hp.n_expert = experts.n_expert;
  hp.n_expert_used = experts.n_expert_used;
  const uint32_t n_used = uint32_t(experts.n_expert_used);
  ESSAIM_ASSIGN_OR_RETURN(std::vector<uint32_t> ff, keys.u32_per_layer("feed_forward_length", n_block, 0u));
  ESSAIM_ASSIGN_OR_RETURN(uint32_t n_ff_exp, keys.u32_or("expert_feed_forward_length", ff[0] / n_used));
  if (n_ff_exp == 0)
    return Status::error("qwen35moe: expert width unknown: 'qwen35moe.expert_feed_forward_length' is missing "
                         "and 'qwen35moe.feed_forward_length' gives 0");
  ESSAIM_ASSIGN_OR_RETURN(uint32_t n_ff_shexp, keys.u32_or("expert_shared_feed_forward_length", ff[0]));
  if (n_ff_shexp == 0)
    return Status::error("qwen35moe: shared expert width unknown: "
                         "'qwen35moe.expert_shared_feed_forward_length' is missing and "
                         "'qwen35moe.feed_forward_length' gives 0");
  hp.n_ff_exp = int32_t(n_ff_exp);
  hp.n_ff_shexp = int32_t(n_ff_shexp);

  return Status::ok();
}

}  // namespace

Result<Qwen35Hparams> qwen35moe_read_hparams(const GgufFile& f) {
  HparamReader keys(f, kArch);
  Qwen35Hparams hp;

  ESSAIM_ASSIGN_OR_RETURN(uint32_t n_block, keys.u32("block_count"));
  ESSAIM_RETURN_IF_ERROR(keys.check_range("block_count", n_block, 1, 512));
  ESSAIM_ASSIGN_OR_RETURN(uint32_t n_nextn, keys.u32_or("nextn_predict_layers", 0));
  if (n_nextn >= n_block)
    return Status::error("metadata key 'qwen35moe.nextn_predict_layers' = " + str(n_nextn) +
                         " leaves no executed layer (block_count " + str(n_block) + ")");
  hp.n_block = int32_t(n_block);
  hp.n_nextn = int32_t(n_nextn);
  hp.n_layer = int32_t(n_block - n_nextn);
  ESSAIM_ASSIGN_OR_RETURN(uint32_t ctx, keys.u32("context_length"));
  hp.n_ctx_train = int32_t(std::min<uint32_t>(ctx, INT32_MAX));
  ESSAIM_ASSIGN_OR_RETURN(uint32_t n_embd, keys.u32("embedding_length"));
  ESSAIM_RETURN_IF_ERROR(keys.check_range("embedding_length", n_embd, 1, 1 << 20));
  hp.n_embd = int32_t(n_embd);
  ESSAIM_ASSIGN_OR_RETURN(hp.eps, keys.rms_epsilon("attention.layer_norm_rms_epsilon"));
  ESSAIM_ASSIGN_OR_RETURN(hp.recurrent, read_recurrent_layers(f, keys, n_block, uint32_t(hp.n_layer)));

  ESSAIM_RETURN_IF_ERROR(read_attention(keys, n_block, hp));
  ESSAIM_RETURN_IF_ERROR(read_rope(f, keys, hp));
  ESSAIM_RETURN_IF_ERROR(read_gated_deltanet(keys, hp));
  ESSAIM_RETURN_IF_ERROR(read_experts(keys, n_block, hp));
  ESSAIM_ASSIGN_OR_RETURN(hp.n_vocab, keys.vocab_size());
  return hp;
}

}  // namespace essaim
