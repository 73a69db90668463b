// Reading an architecture's hyperparameters from GGUF metadata with llama.cpp's strictness: a key must have
// exactly the expected GGUF type (a u32 key stored as i32 is refused, not converted — docs/reference.md 10.24),
// required keys must be present, absent optional keys take llama.cpp's defaults. Every error names the key.
//
//   HparamReader keys(file, "qwen3moe");
//   ESSAIM_ASSIGN_OR_RETURN(uint32_t n_layer, keys.u32("block_count"));           // "qwen3moe.block_count"
//   ESSAIM_ASSIGN_OR_RETURN(float base, keys.f32_or("rope.freq_base", 10000.0f));
//   ESSAIM_ASSIGN_OR_RETURN(auto heads, keys.u32_per_layer("attention.head_count", n_layer, std::nullopt));
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "gguf/gguf_file.h"

namespace essaim {

class HparamReader {
 public:
  HparamReader(const GgufFile& file, std::string arch) : file_(file), arch_(std::move(arch)) {}

  const std::string& arch() const { return arch_; }
  std::string key(std::string_view suffix) const { return arch_ + "." + std::string(suffix); }
  bool has(std::string_view suffix) const { return file_.find_kv(key(suffix)) != nullptr; }

  // Required scalars: absent or mistyped is an error naming the key.
  Result<uint32_t> u32(std::string_view suffix) const;
  Result<float> f32(std::string_view suffix) const;
  // Optional scalars: absent gives the fallback; present with another type is still an error.
  Result<uint32_t> u32_or(std::string_view suffix, uint32_t fallback) const;
  Result<float> f32_or(std::string_view suffix, float fallback) const;
  Result<std::optional<uint32_t>> u32_opt(std::string_view suffix) const;

  // A per-layer value: a UINT32 scalar broadcast to every layer, or an INT32/UINT32 array of exactly
  // n_layer non-negative values (llama.cpp's get_key_or_arr). Absent: the fallback broadcast, or an error
  // when there is none.
  Result<std::vector<uint32_t>> u32_per_layer(std::string_view suffix, uint32_t n_layer,
                                              std::optional<uint32_t> fallback) const;

  // Bounds check with an error naming the key: lo <= v <= hi.
  Status check_range(std::string_view suffix, uint64_t v, uint64_t lo, uint64_t hi) const;
  // An RMS-norm epsilon: finite and >= 0 (NaN or ±Inf would turn every logit into NaN or 0 silently).
  Result<float> rms_epsilon(std::string_view suffix) const;
  // tokenizer.ggml.tokens: a non-empty string array with exactly one entry per row of token_embd.weight
  // when that tensor is present ([n_embd, n_vocab]); the message says which side is short.
  Result<int32_t> vocab_size() const;

  // Softmax attention's heads and head dimension, as llama.cpp checks them: 1 <= head_count <= 4096,
  // 1 <= head_count_kv <= head_count and dividing it; attention.key_length (n_embd / head_count when absent)
  // in [2, 4096] and attention.value_length equal to it.
  struct AttentionHeads {
    int32_t n_head = 0;
    int32_t n_head_kv = 0;
    int32_t head_dim = 0;
  };
  Result<AttentionHeads> attention_heads(uint32_t n_head, uint32_t n_head_kv, uint32_t n_embd) const;
  // expert_count in [1, 512] and expert_used_count in [1, expert_count].
  struct ExpertCounts {
    int32_t n_expert = 0;
    int32_t n_expert_used = 0;
  };
  Result<ExpertCounts> expert_counts() const;
  // rope.scaling.type absent, "none", or "linear" with factor 1 (or 0): no stock file of these architectures
  // scales RoPE, so scaling is refused rather than silently computing something else.
  Status refuse_rope_scaling() const;

 private:
  Status type_error(const std::string& k, const GgufValue& v, std::string_view expected) const;

  const GgufFile& file_;
  std::string arch_;
};

}  // namespace essaim
