// GGUF metadata: decoding values from untrusted bytes (docs/reference.md 1.3, checks 5, 7, 21) and the strict
// typed getters.
#include <cstdio>

#include "gguf/gguf_cursor.h"

namespace essaim {
namespace {

// Smallest encoded size of one element: what `count` must be checked against before allocating.
uint64_t min_encoded_size(GgufValueType t) {
  switch (t) {
    case GgufValueType::UINT8: case GgufValueType::INT8: case GgufValueType::BOOL: return 1;
    case GgufValueType::UINT16: case GgufValueType::INT16: return 2;
    case GgufValueType::UINT32: case GgufValueType::INT32: case GgufValueType::FLOAT32: return 4;
    case GgufValueType::UINT64: case GgufValueType::INT64: case GgufValueType::FLOAT64: return 8;
    case GgufValueType::STRING: return 8;  // the length prefix
    case GgufValueType::ARRAY: case GgufValueType::COUNT: break;
  }
  return 0;
}

// Reads one scalar of type t into the widened payloads.
Status read_scalar(GgufCursor& c, GgufValueType t, uint64_t* u, int64_t* i, double* f, std::string* s,
                   std::string_view field) {
  switch (t) {
    case GgufValueType::UINT8: { uint8_t v = 0; ESSAIM_RETURN_IF_ERROR(c.read(&v, field)); *u = v; break; }
    case GgufValueType::INT8: { int8_t v = 0; ESSAIM_RETURN_IF_ERROR(c.read(&v, field)); *i = v; break; }
    case GgufValueType::UINT16: { uint16_t v = 0; ESSAIM_RETURN_IF_ERROR(c.read(&v, field)); *u = v; break; }
    case GgufValueType::INT16: { int16_t v = 0; ESSAIM_RETURN_IF_ERROR(c.read(&v, field)); *i = v; break; }
    case GgufValueType::UINT32: { uint32_t v = 0; ESSAIM_RETURN_IF_ERROR(c.read(&v, field)); *u = v; break; }
    case GgufValueType::INT32: { int32_t v = 0; ESSAIM_RETURN_IF_ERROR(c.read(&v, field)); *i = v; break; }
    case GgufValueType::FLOAT32: { float v = 0; ESSAIM_RETURN_IF_ERROR(c.read(&v, field)); *f = v; break; }
    // Any non-zero byte means true to llama.cpp; normalising keeps one representation (check 21).
    case GgufValueType::BOOL: { uint8_t v = 0; ESSAIM_RETURN_IF_ERROR(c.read(&v, field)); *u = v != 0; break; }
    case GgufValueType::STRING: ESSAIM_CHECK(s != nullptr); ESSAIM_RETURN_IF_ERROR(c.read_string(s, field)); break;
    case GgufValueType::UINT64: ESSAIM_RETURN_IF_ERROR(c.read(u, field)); break;
    case GgufValueType::INT64: ESSAIM_RETURN_IF_ERROR(c.read(i, field)); break;
    case GgufValueType::FLOAT64: ESSAIM_RETURN_IF_ERROR(c.read(f, field)); break;
    case GgufValueType::ARRAY: case GgufValueType::COUNT: ESSAIM_CHECK(false && "caller validated the type");
  }
  return Status::ok();
}

}  // namespace

Status GgufCursor::truncated(std::string_view field, uint64_t need) const {
  return Status::error(std::string(field) + gguf_at(pos_) + " is truncated: needs " + std::to_string(need) +
                       " bytes, the file has " + std::to_string(remaining()) + " left");
}

Status GgufCursor::read_string(std::string* out, std::string_view field) {
  const uint64_t at = pos_;
  uint64_t len = 0;
  if (remaining() < sizeof(len)) return truncated(std::string(field) + " length", sizeof(len));
  ESSAIM_CHECK(read(&len, field).is_ok());
  if (len > kGgufMaxStringBytes)
    return Status::error(std::string(field) + " length " + std::to_string(len) + gguf_at(at) +
                         " exceeds the 1 GiB string limit");
  if (len > remaining())
    return Status::error(std::string(field) + " length " + std::to_string(len) + gguf_at(at) +
                         " runs past the end of the file (" + std::to_string(remaining()) + " bytes left)");
  out->assign(reinterpret_cast<const char*>(bytes_.data() + pos_), size_t(len));
  pos_ += len;
  return Status::ok();
}

Status GgufMetadataBudget::charge(uint64_t bytes, uint64_t at) {
  if (bytes > kGgufMaxMetadataMemory - used)
    return Status::error("metadata" + gguf_at(at) + " would need more than " +
                         std::to_string(kGgufMaxMetadataMemory >> 20) + " MiB of memory once decoded");
  used += bytes;
  return Status::ok();
}

Status gguf_read_value(GgufCursor& c, GgufValueType type, GgufValue* out, GgufMetadataBudget& budget) {
  out->type = type;
  if (type != GgufValueType::ARRAY) {
    if (type == GgufValueType::STRING) {
      ESSAIM_RETURN_IF_ERROR(c.read_string(&out->str, "string value"));
      return budget.charge(sizeof(std::string) + out->str.size(), c.pos());
    }
    return read_scalar(c, type, &out->u, &out->i, &out->f, nullptr, "value");
  }
  const uint64_t elem_at = c.pos();
  int32_t elem_id = 0;
  ESSAIM_RETURN_IF_ERROR(c.read(&elem_id, "array element type"));
  if (elem_id < 0 || elem_id >= int32_t(GgufValueType::COUNT))
    return Status::error("array element type " + std::to_string(elem_id) + gguf_at(elem_at) +
                         " is not a GGUF value type (0..12)");
  if (elem_id == int32_t(GgufValueType::ARRAY))
    return Status::error("array element type ARRAY" + gguf_at(elem_at) + ": nested arrays are not allowed");
  const GgufValueType elem = GgufValueType(elem_id);
  out->elem_type = elem;
  const uint64_t count_at = c.pos();
  uint64_t count = 0;
  ESSAIM_RETURN_IF_ERROR(c.read(&count, "array count"));
  if (count > kGgufMaxArrayCount)
    return Status::error("array count " + std::to_string(count) + gguf_at(count_at) +
                         " exceeds the limit of 2^30 elements");
  // count <= 2^30 and min size <= 8, so the product cannot overflow; it must fit in what is left.
  if (count * min_encoded_size(elem) > c.remaining())
    return Status::error("array count " + std::to_string(count) + gguf_at(count_at) + " needs at least " +
                         std::to_string(count * min_encoded_size(elem)) + " bytes, the file has " +
                         std::to_string(c.remaining()) + " left");
  const uint64_t per_elem = elem == GgufValueType::STRING ? sizeof(std::string) : 8;
  ESSAIM_RETURN_IF_ERROR(budget.charge(count * per_elem, count_at));
  constexpr std::string_view field = "array element";
  switch (elem) {
    case GgufValueType::STRING: out->strs.resize(size_t(count)); break;
    case GgufValueType::FLOAT32: case GgufValueType::FLOAT64: out->floats.resize(size_t(count)); break;
    case GgufValueType::INT8: case GgufValueType::INT16: case GgufValueType::INT32: case GgufValueType::INT64:
      out->ints.resize(size_t(count));
      break;
    default: out->uints.resize(size_t(count)); break;
  }
  for (uint64_t k = 0; k < count; ++k) {
    uint64_t u = 0;
    int64_t i = 0;
    double f = 0;
    switch (elem) {
      case GgufValueType::STRING: {
        if (Status s = c.read_string(&out->strs[k], "array string"); !s)
          return s.with_context("element " + std::to_string(k));
        ESSAIM_RETURN_IF_ERROR(budget.charge(out->strs[k].size(), c.pos()));
        break;
      }
      case GgufValueType::FLOAT32: case GgufValueType::FLOAT64:
        ESSAIM_RETURN_IF_ERROR(read_scalar(c, elem, &u, &i, &f, nullptr, field));
        out->floats[k] = f;
        break;
      case GgufValueType::INT8: case GgufValueType::INT16: case GgufValueType::INT32: case GgufValueType::INT64:
        ESSAIM_RETURN_IF_ERROR(read_scalar(c, elem, &u, &i, &f, nullptr, field));
        out->ints[k] = i;
        break;
      default:
        ESSAIM_RETURN_IF_ERROR(read_scalar(c, elem, &u, &i, &f, nullptr, field));
        out->uints[k] = u;
        break;
    }
  }
  return Status::ok();
}

std::string gguf_quote(std::string_view name) {
  constexpr size_t kMax = 64;
  std::string out = "'";
  for (size_t k = 0; k < name.size() && k < kMax; ++k) {
    const unsigned char ch = static_cast<unsigned char>(name[k]);
    if (ch >= 0x20 && ch < 0x7f && ch != '\'' && ch != '\\') {
      out += char(ch);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", ch);
      out += buf;
    }
  }
  if (name.size() > kMax) out += "...";
  out += "'";
  return out;
}

const GgufValue* GgufFile::find_kv(std::string_view key) const {
  const auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kvs_[it->second].value;
}

const GgufTensor* GgufFile::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {
const GgufValue* typed(const GgufFile& f, std::string_view key, GgufValueType t) {
  const GgufValue* v = f.find_kv(key);
  return v != nullptr && v->type == t ? v : nullptr;
}
}  // namespace

std::optional<uint32_t> GgufFile::get_u32(std::string_view key) const {
  const GgufValue* v = typed(*this, key, GgufValueType::UINT32);
  return v ? std::optional<uint32_t>(uint32_t(v->u)) : std::nullopt;
}
std::optional<int32_t> GgufFile::get_i32(std::string_view key) const {
  const GgufValue* v = typed(*this, key, GgufValueType::INT32);
  return v ? std::optional<int32_t>(int32_t(v->i)) : std::nullopt;
}
std::optional<uint64_t> GgufFile::get_u64(std::string_view key) const {
  const GgufValue* v = typed(*this, key, GgufValueType::UINT64);
  return v ? std::optional<uint64_t>(v->u) : std::nullopt;
}
std::optional<float> GgufFile::get_f32(std::string_view key) const {
  const GgufValue* v = typed(*this, key, GgufValueType::FLOAT32);
  return v ? std::optional<float>(float(v->f)) : std::nullopt;
}
std::optional<bool> GgufFile::get_bool(std::string_view key) const {
  const GgufValue* v = typed(*this, key, GgufValueType::BOOL);
  return v ? std::optional<bool>(v->u != 0) : std::nullopt;
}
std::optional<std::string> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = typed(*this, key, GgufValueType::STRING);
  return v ? std::optional<std::string>(v->str) : std::nullopt;
}
const std::vector<std::string>* GgufFile::get_string_array(std::string_view key) const {
  const GgufValue* v = typed(*this, key, GgufValueType::ARRAY);
  return v != nullptr && v->elem_type == GgufValueType::STRING ? &v->strs : nullptr;
}

}  // namespace essaim
