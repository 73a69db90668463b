// Hyperparameters of architecture `qwen35moe` (Qwen3.5 / Qwen3.6 MoE) read from GGUF metadata with
// llama.cpp's rules (docs/reference.md 5.1, 5.2): generic attention/MoE keys, the Gated DeltaNet `ssm.*` keys,
// which layers are recurrent, IMRoPE sections, the shared-expert width and the MTP (nextn) block count.
//
//   ESSAIM_ASSIGN_OR_RETURN(Qwen35Hparams hp, qwen35moe_read_hparams(file));
//   for (int32_t il = 0; il < hp.n_layer; ++il) hp.recurrent[il] ? ...GDN... : ...gated attention...;
//
// Every error names the key and what was expected; nothing here trusts the file.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "core/status.h"
#include "gguf/gguf_file.h"

namespace essaim {

struct Qwen35Hparams {
  int32_t n_block = 0;      // block_count: executed layers + MTP blocks
  int32_t n_nextn = 0;      // nextn_predict_layers: MTP blocks appended after the main stack
  int32_t n_layer = 0;      // L = n_block - n_nextn, the layers the forward pass executes
  int32_t n_ctx_train = 0;
  int32_t n_embd = 0;       // E
  int32_t n_vocab = 0;      // V
  float eps = 0.0f;         // RMSNorm eps (also the GDN L2-norm eps)
  std::vector<bool> recurrent;  // [n_block]: Gated DeltaNet layer (true) or gated full attention (false)

  // Gated full attention.
  int32_t n_head = 0;       // H
  int32_t n_head_kv = 0;    // Hkv
  int32_t head_dim = 0;     // D (key_length = value_length)
  int32_t n_rot = 0;        // rope.dimension_count: rotated leading dimensions of each head (even, ≤ D)
  float rope_base = 10000.0f;
  std::array<int32_t, 4> rope_sections{};  // IMRoPE sections [t, h, w, e], sum > 0

  // Gated DeltaNet.
  int32_t ssm_conv_kernel = 0;  // Kc
  int32_t ssm_n_k_heads = 0;    // Hk (ssm.group_count)
  int32_t ssm_n_v_heads = 0;    // Hv (ssm.time_step_rank), a multiple of Hk
  int32_t ssm_head_dim = 0;     // Dk = Dv (ssm.state_size; ssm.inner_size = Hv·Dv)

  // MoE.
  int32_t n_expert = 0;       // X
  int32_t n_expert_used = 0;  // K
  int32_t n_ff_exp = 0;       // F, routed expert width
  int32_t n_ff_shexp = 0;     // Fs, shared expert width
};

Result<Qwen35Hparams> qwen35moe_read_hparams(const GgufFile& file);

}  // namespace essaim
