#include "gguf/tensor_names.h"

#include <array>

#include "core/status.h"

namespace essaim {
namespace {

struct Row {
  TensorName id;
  std::string_view format;
};

// The table (docs/reference.md 4.2 and 5.3). Order must follow the enum; checked below.
constexpr std::array<Row, size_t(TensorName::COUNT)> kNames{{
    {TensorName::TOKEN_EMBD, "token_embd.weight"},
    {TensorName::OUTPUT_NORM, "output_norm.weight"},
    {TensorName::OUTPUT, "output.weight"},
    {TensorName::ATTN_NORM, "blk.%d.attn_norm.weight"},
    {TensorName::ATTN_Q, "blk.%d.attn_q.weight"},
    {TensorName::ATTN_K, "blk.%d.attn_k.weight"},
    {TensorName::ATTN_V, "blk.%d.attn_v.weight"},
    {TensorName::ATTN_QKV, "blk.%d.attn_qkv.weight"},
    {TensorName::ATTN_Q_NORM, "blk.%d.attn_q_norm.weight"},
    {TensorName::ATTN_K_NORM, "blk.%d.attn_k_norm.weight"},
    {TensorName::ATTN_OUTPUT, "blk.%d.attn_output.weight"},
    {TensorName::ATTN_Q_BIAS, "blk.%d.attn_q.bias"},
    {TensorName::ATTN_K_BIAS, "blk.%d.attn_k.bias"},
    {TensorName::ATTN_V_BIAS, "blk.%d.attn_v.bias"},
    {TensorName::ATTN_GATE, "blk.%d.attn_gate.weight"},
    {TensorName::POST_ATTN_NORM, "blk.%d.post_attention_norm.weight"},
    {TensorName::FFN_NORM, "blk.%d.ffn_norm.weight"},
    {TensorName::FFN_GATE_INP, "blk.%d.ffn_gate_inp.weight"},
    {TensorName::FFN_GATE_EXPS, "blk.%d.ffn_gate_exps.weight"},
    {TensorName::FFN_UP_EXPS, "blk.%d.ffn_up_exps.weight"},
    {TensorName::FFN_DOWN_EXPS, "blk.%d.ffn_down_exps.weight"},
    {TensorName::FFN_GATE_UP_EXPS, "blk.%d.ffn_gate_up_exps.weight"},
    {TensorName::FFN_GATE_INP_SHEXP, "blk.%d.ffn_gate_inp_shexp.weight"},
    {TensorName::FFN_GATE_SHEXP, "blk.%d.ffn_gate_shexp.weight"},
    {TensorName::FFN_UP_SHEXP, "blk.%d.ffn_up_shexp.weight"},
    {TensorName::FFN_DOWN_SHEXP, "blk.%d.ffn_down_shexp.weight"},
    {TensorName::SSM_CONV1D, "blk.%d.ssm_conv1d.weight"},
    {TensorName::SSM_DT_BIAS, "blk.%d.ssm_dt.bias"},
    {TensorName::SSM_A, "blk.%d.ssm_a"},
    {TensorName::SSM_BETA, "blk.%d.ssm_beta.weight"},
    {TensorName::SSM_ALPHA, "blk.%d.ssm_alpha.weight"},
    {TensorName::SSM_NORM, "blk.%d.ssm_norm.weight"},
    {TensorName::SSM_OUT, "blk.%d.ssm_out.weight"},
    {TensorName::NEXTN_EH_PROJ, "blk.%d.nextn.eh_proj.weight"},
    {TensorName::NEXTN_ENORM, "blk.%d.nextn.enorm.weight"},
    {TensorName::NEXTN_HNORM, "blk.%d.nextn.hnorm.weight"},
    {TensorName::NEXTN_EMBED_TOKENS, "blk.%d.nextn.embed_tokens.weight"},
    {TensorName::NEXTN_SHARED_HEAD_HEAD, "blk.%d.nextn.shared_head_head.weight"},
    {TensorName::NEXTN_SHARED_HEAD_NORM, "blk.%d.nextn.shared_head_norm.weight"},
}};

constexpr bool table_in_enum_order() {
  for (size_t i = 0; i < kNames.size(); ++i)
    if (size_t(kNames[i].id) != i) return false;
  return true;
}
static_assert(table_in_enum_order(), "tensor name table must follow the TensorName enum");

}  // namespace

std::string_view tensor_name_format(TensorName t) {
  ESSAIM_CHECK(size_t(t) < kNames.size());
  return kNames[size_t(t)].format;
}

bool tensor_name_is_per_layer(TensorName t) { return tensor_name_format(t).starts_with("blk.%d."); }

std::string tensor_name(TensorName t, int32_t layer) {
  const std::string_view f = tensor_name_format(t);
  if (!tensor_name_is_per_layer(t)) return std::string(f);
  ESSAIM_CHECK(layer >= 0);
  return "blk." + std::to_string(layer) + std::string(f.substr(6));  // f = "blk.%d" + rest
}

}  // namespace essaim
