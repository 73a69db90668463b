#include "model/hparams_reader.h"

#include <climits>
#include <cmath>

namespace essaim {

Status HparamReader::type_error(const std::string& k, const GgufValue& v, std::string_view expected) const {
  std::string got(gguf_value_type_name(v.type));
  if (v.type == GgufValueType::ARRAY) got += " of " + std::string(gguf_value_type_name(v.elem_type));
  return Status::error("metadata key '" + k + "' has type " + got + ", expected " + std::string(expected));
}

Result<std::optional<uint32_t>> HparamReader::u32_opt(std::string_view suffix) const {
  const std::string k = key(suffix);
  const GgufValue* v = file_.find_kv(k);
  if (!v) return std::optional<uint32_t>();
  if (v->type != GgufValueType::UINT32) return type_error(k, *v, "UINT32");
  return std::optional<uint32_t>(uint32_t(v->u));
}

Result<uint32_t> HparamReader::u32(std::string_view suffix) const {
  ESSAIM_ASSIGN_OR_RETURN(std::optional<uint32_t> v, u32_opt(suffix));
  if (!v) return Status::error("required metadata key '" + key(suffix) + "' is missing");
  return *v;
}

Result<uint32_t> HparamReader::u32_or(std::string_view suffix, uint32_t fallback) const {
  ESSAIM_ASSIGN_OR_RETURN(std::optional<uint32_t> v, u32_opt(suffix));
  return v.value_or(fallback);
}

Result<float> HparamReader::f32_or(std::string_view suffix, float fallback) const {
  const std::string k = key(suffix);
  const GgufValue* v = file_.find_kv(k);
  if (!v) return fallback;
  if (v->type != GgufValueType::FLOAT32) return type_error(k, *v, "FLOAT32");
  return float(v->f);
}

Result<float> HparamReader::f32(std::string_view suffix) const {
  if (!file_.find_kv(key(suffix))) return Status::error("required metadata key '" + key(suffix) + "' is missing");
  return f32_or(suffix, 0.0f);
}

Result<std::vector<uint32_t>> HparamReader::u32_per_layer(std::string_view suffix, uint32_t n_layer,
                                                          std::optional<uint32_t> fallback) const {
  const std::string k = key(suffix);
  const GgufValue* v = file_.find_kv(k);
  if (!v) {
    if (!fallback) return Status::error("required metadata key '" + k + "' is missing");
    return std::vector<uint32_t>(n_layer, *fallback);
  }
  if (v->type == GgufValueType::UINT32) return std::vector<uint32_t>(n_layer, uint32_t(v->u));
  if (v->type != GgufValueType::ARRAY ||
      (v->elem_type != GgufValueType::INT32 && v->elem_type != GgufValueType::UINT32))
    return type_error(k, *v, "UINT32 or an INT32/UINT32 array");
  if (v->array_size() != n_layer)
    return Status::error("metadata key '" + k + "' has " + std::to_string(v->array_size()) +
                         " entries, expected one per layer (" + std::to_string(n_layer) + ")");
  std::vector<uint32_t> out(n_layer);
  for (uint32_t i = 0; i < n_layer; ++i) {
    const int64_t x = v->elem_type == GgufValueType::INT32 ? v->ints[i] : int64_t(v->uints[i]);
    if (x < 0 || x > int64_t(UINT32_MAX))
      return Status::error("metadata key '" + k + "' entry " + std::to_string(i) + " is out of range");
    out[i] = uint32_t(x);
  }
  return out;
}

Status HparamReader::check_range(std::string_view suffix, uint64_t v, uint64_t lo, uint64_t hi) const {
  if (v < lo || v > hi)
    return Status::error("metadata key '" + key(suffix) + "' = " + std::to_string(v) + " is outside [" +
                         std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return Status::ok();
}

Result<float> HparamReader::rms_epsilon(std::string_view suffix) const {
  ESSAIM_ASSIGN_OR_RETURN(const float eps, f32(suffix));
  if (!std::isfinite(eps))
    return Status::error("metadata key '" + key(suffix) + "' is " + (std::isnan(eps) ? "NaN" : eps > 0 ? "+Inf" : "-Inf") +
                         ", not a finite number (models use about 1e-6)");
  if (eps < 0.0f) return Status::error("metadata key '" + key(suffix) + "' is negative (" + std::to_string(eps) + ")");
  return eps;
}

Result<int32_t> HparamReader::vocab_size() const {
  const std::vector<std::string>* tokens = file_.get_string_array("tokenizer.ggml.tokens");
  if (!tokens) return Status::error("required metadata key 'tokenizer.ggml.tokens' is missing or not a string array");
  if (tokens->empty()) return Status::error("'tokenizer.ggml.tokens' is empty");
  if (tokens->size() > size_t(INT32_MAX))
    return Status::error("'tokenizer.ggml.tokens' lists " + std::to_string(tokens->size()) + " tokens, more than 2^31-1");
  // Checked here, before any tensor is bound, so the message blames the side that is short instead of
  // reporting token_embd.weight's shape as wrong.
  if (const GgufTensor* embd = file_.find_tensor("token_embd.weight"); embd && embd->n_dims == 2) {
    const int64_t rows = embd->ne[1];
    if (rows != int64_t(tokens->size())) {
      const std::string n = std::to_string(tokens->size()), r = std::to_string(rows);
      return Status::error(rows > int64_t(tokens->size())
                               ? "'tokenizer.ggml.tokens' lists " + n + " tokens but token_embd.weight has " + r +
                                     " rows (one per token): the token list is short of " +
                                     std::to_string(rows - int64_t(tokens->size())) + " entries"
                               : "token_embd.weight has " + r + " rows but 'tokenizer.ggml.tokens' lists " + n +
                                     " tokens: the embedding is short of " +
                                     std::to_string(int64_t(tokens->size()) - rows) + " rows");
    }
  }
  return int32_t(tokens->size());
}

Result<HparamReader::AttentionHeads> HparamReader::attention_heads(uint32_t n_head, uint32_t n_head_kv,
                                                                 uint32_t n_embd) const {
  ESSAIM_RETURN_IF_ERROR(check_range("attention.head_count", n_head, 1, 4096));
  ESSAIM_RETURN_IF_ERROR(check_range("attention.head_count_kv", n_head_kv, 1, n_head));
  if (n_head % n_head_kv != 0)
    return Status::error(arch_ + ": attention.head_count (" + std::to_string(n_head) +
                         ") is not a multiple of attention.head_count_kv (" + std::to_string(n_head_kv) + ")");
  ESSAIM_ASSIGN_OR_RETURN(uint32_t key_len, u32_or("attention.key_length", n_embd / n_head));
  ESSAIM_ASSIGN_OR_RETURN(uint32_t value_len, u32_or("attention.value_length", n_embd / n_head));
  ESSAIM_RETURN_IF_ERROR(check_range("attention.key_length", key_len, 2, 4096));
  if (value_len != key_len)
    return Status::error(arch_ + ": attention.value_length (" + std::to_string(value_len) +
                         ") must equal attention.key_length (" + std::to_string(key_len) + ")");
  return AttentionHeads{.n_head = int32_t(n_head), .n_head_kv = int32_t(n_head_kv), .head_dim = int32_t(key_len)};
}

Result<HparamReader::ExpertCounts> HparamReader::expert_counts() const {
  ESSAIM_ASSIGN_OR_RETURN(uint32_t n_expert, u32("expert_count"));
  ESSAIM_RETURN_IF_ERROR(check_range("expert_count", n_expert, 1, 512));
  ESSAIM_ASSIGN_OR_RETURN(uint32_t n_used, u32("expert_used_count"));
  ESSAIM_RETURN_IF_ERROR(check_range("expert_used_count", n_used, 1, n_expert));
  return ExpertCounts{.n_expert = int32_t(n_expert), .n_expert_used = int32_t(n_used)};
}

Status HparamReader::refuse_rope_scaling() const {
  const GgufValue* s = file_.find_kv(key("rope.scaling.type"));
  if (!s) return Status::ok();
  if (s->type != GgufValueType::STRING || (s->str != "none" && s->str != "linear"))
    return Status::error(arch_ + ": rope scaling " + gguf_quote_string(s->str) + " is not supported");
  ESSAIM_ASSIGN_OR_RETURN(float factor, f32_or("rope.scaling.factor", 1.0f));
  if (s->str == "linear" && factor != 1.0f && factor != 0.0f)
    return Status::error(arch_ + ": linear rope scaling (factor " + std::to_string(factor) + ") is not supported");
  return Status::ok();
}

}  // namespace essaim
