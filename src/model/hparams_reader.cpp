#include "model/hparams_reader.h"

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

}  // namespace essaim
