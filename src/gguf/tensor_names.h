// Every GGUF tensor name the architectures use, from ONE enum→format table (llama.cpp's LLM_TENSOR_NAMES
// idea): code names tensors by enum, never by string literals scattered around.
//
//   std::string n = tensor_name(TensorName::ATTN_Q, 3);     // "blk.3.attn_q.weight"
//   std::string e = tensor_name(TensorName::TOKEN_EMBD);    // "token_embd.weight"
//
// Per-layer names take the layer index; global names ignore it. Adding an architecture's tensors is adding
// rows here.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace essaim {

enum class TensorName : int32_t {
  // Global.
  TOKEN_EMBD,
  OUTPUT_NORM,
  OUTPUT,
  // Attention (qwen3moe, qwen35moe full-attention layers).
  ATTN_NORM,
  ATTN_Q,
  ATTN_K,
  ATTN_V,
  ATTN_QKV,          // fused q|k|v (qwen3moe alternative) or the GDN mixed projection (qwen35moe)
  ATTN_Q_NORM,
  ATTN_K_NORM,
  ATTN_OUTPUT,
  ATTN_Q_BIAS,
  ATTN_K_BIAS,
  ATTN_V_BIAS,
  ATTN_GATE,         // qwen35moe GDN z projection
  POST_ATTN_NORM,    // qwen35moe pre-FFN norm
  // FFN / MoE.
  FFN_NORM,
  FFN_GATE_INP,      // router
  FFN_GATE_EXPS,
  FFN_UP_EXPS,
  FFN_DOWN_EXPS,
  FFN_GATE_UP_EXPS,  // fused gate|up experts (qwen35moe)
  FFN_GATE_INP_SHEXP,
  FFN_GATE_SHEXP,
  FFN_UP_SHEXP,
  FFN_DOWN_SHEXP,
  // Gated DeltaNet (qwen35moe).
  SSM_CONV1D,
  SSM_DT_BIAS,
  SSM_A,
  SSM_BETA,
  SSM_ALPHA,
  SSM_NORM,
  SSM_OUT,
  // Multi-token prediction block (qwen35moe): the first one drafts for speculative decoding.
  NEXTN_EH_PROJ,
  NEXTN_ENORM,
  NEXTN_HNORM,
  NEXTN_EMBED_TOKENS,
  NEXTN_SHARED_HEAD_HEAD,
  NEXTN_SHARED_HEAD_NORM,
  COUNT,
};

// The printf-style format of a name ("blk.%d.attn_q.weight"), and whether it is per layer.
std::string_view tensor_name_format(TensorName t);
bool tensor_name_is_per_layer(TensorName t);

// The name of tensor t (of layer `layer` when per layer).
std::string tensor_name(TensorName t, int32_t layer = -1);

}  // namespace essaim
