// GGUF value-type names, typed value constructors, array sizes and the tensor shape rules shared by reader and writer.
#include <limits>

#include "gguf/gguf_file.h"
#include "gguf/gguf_layout.h"

namespace essaim {

std::string_view gguf_value_type_name(GgufValueType t) {
  switch (t) {
    case GgufValueType::UINT8: return "UINT8";
    case GgufValueType::INT8: return "INT8";
    case GgufValueType::UINT16: return "UINT16";
    case GgufValueType::INT16: return "INT16";
    case GgufValueType::UINT32: return "UINT32";
    case GgufValueType::INT32: return "INT32";
    case GgufValueType::FLOAT32: return "FLOAT32";
    case GgufValueType::BOOL: return "BOOL";
    case GgufValueType::STRING: return "STRING";
    case GgufValueType::ARRAY: return "ARRAY";
    case GgufValueType::UINT64: return "UINT64";
    case GgufValueType::INT64: return "INT64";
    case GgufValueType::FLOAT64: return "FLOAT64";
    case GgufValueType::COUNT: break;
  }
  return "INVALID";
}

namespace {

GgufValue array_of(GgufValueType elem) {
  GgufValue v;
  v.type = GgufValueType::ARRAY;
  v.elem_type = elem;
  return v;
}

}  // namespace

GgufValue gguf_unsigned(GgufValueType t, uint64_t v) {
  GgufValue x;
  x.type = t;
  x.u = v;
  return x;
}

GgufValue gguf_signed(GgufValueType t, int64_t v) {
  GgufValue x;
  x.type = t;
  x.i = v;
  return x;
}

GgufValue gguf_float(GgufValueType t, double v) {
  GgufValue x;
  x.type = t;
  x.f = v;
  return x;
}

GgufValue gguf_bool(bool v) { return gguf_unsigned(GgufValueType::BOOL, v ? 1 : 0); }

GgufValue gguf_string(std::string v) {
  GgufValue x;
  x.type = GgufValueType::STRING;
  x.str = std::move(v);
  return x;
}

GgufValue gguf_array_i32(const std::vector<int32_t>& v) {
  GgufValue x = array_of(GgufValueType::INT32);
  x.ints.assign(v.begin(), v.end());
  return x;
}

GgufValue gguf_array_u32(const std::vector<uint32_t>& v) {
  GgufValue x = array_of(GgufValueType::UINT32);
  x.uints.assign(v.begin(), v.end());
  return x;
}

GgufValue gguf_array_f32(const std::vector<float>& v) {
  GgufValue x = array_of(GgufValueType::FLOAT32);
  x.floats.assign(v.begin(), v.end());
  return x;
}

GgufValue gguf_array_bool(const std::vector<bool>& v) {
  GgufValue x = array_of(GgufValueType::BOOL);
  x.uints.assign(v.begin(), v.end());
  return x;
}

GgufValue gguf_array_string(std::vector<std::string> v) {
  GgufValue x = array_of(GgufValueType::STRING);
  x.strs = std::move(v);
  return x;
}

uint64_t GgufValue::array_size() const {
  if (type != GgufValueType::ARRAY) return 0;
  switch (elem_type) {
    case GgufValueType::UINT8: case GgufValueType::UINT16: case GgufValueType::UINT32:
    case GgufValueType::UINT64: case GgufValueType::BOOL:
      return uints.size();
    case GgufValueType::INT8: case GgufValueType::INT16: case GgufValueType::INT32:
    case GgufValueType::INT64:
      return ints.size();
    case GgufValueType::FLOAT32: case GgufValueType::FLOAT64:
      return floats.size();
    case GgufValueType::STRING:
      return strs.size();
    case GgufValueType::ARRAY: case GgufValueType::COUNT:
      break;
  }
  return 0;
}

TensorShapeCheck gguf_check_tensor_shape(int64_t type_id, std::span<const int64_t> ne) {
  TensorShapeCheck c;
  auto fail = [&](TensorField field, uint32_t index, std::string msg) {
    c.field = field;
    c.ne_index = index;
    c.error = std::move(msg);
    return c;
  };
  if (ne.empty() || ne.size() > kGgufMaxDims)
    return fail(TensorField::N_DIMS, 0,
                "n_dims " + std::to_string(ne.size()) + " is outside 1.." + std::to_string(kGgufMaxDims));
  // Zero extents are refused outright: llama.cpp divides by them in its overflow test (1.8 check 11).
  for (uint32_t k = 0; k < ne.size(); ++k)
    if (ne[k] < 1)
      return fail(TensorField::NE, k, "ne[" + std::to_string(k) + "] = " + std::to_string(ne[k]) +
                                          " is not a positive extent");
  // Element count below INT64_MAX, tested by division so nothing overflows (check 12).
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  int64_t count = ne[0];
  for (uint32_t k = 1; k < ne.size(); ++k) {
    if (count > kMax / ne[k])
      return fail(TensorField::NE, k, "element count overflows at ne[" + std::to_string(k) + "] = " +
                                          std::to_string(ne[k]));
    count *= ne[k];
  }
  const std::optional<GgmlType> type = ggml_type_from_id(type_id);
  if (!type)
    return fail(TensorField::TYPE, 0, "type id " + std::to_string(type_id) + " is outside 0.." +
                                          std::to_string(int(GgmlType::COUNT) - 1));
  const TypeTraits& t = type_traits(*type);
  if (t.block_size == 0)
    return fail(TensorField::TYPE, 0, "type id " + std::to_string(type_id) + " is a removed ggml type");
  if (ne[0] % t.block_size != 0)
    return fail(TensorField::NE, 0, "ne[0] = " + std::to_string(ne[0]) + " is not a multiple of the " +
                                        std::string(t.name) + " block size " + std::to_string(t.block_size));
  // Byte size representable (check 15); kept below INT64_MAX so offsets stay comparable as signed too.
  const uint64_t blocks = uint64_t(count) / t.block_size;
  if (blocks > uint64_t(kMax) / t.type_size)
    return fail(TensorField::NE, uint32_t(ne.size() - 1), "byte size overflows (" + std::to_string(blocks) +
                                                               " blocks of " + std::to_string(t.type_size) + " bytes)");
  c.nbytes = blocks * t.type_size;
  return c;
}

}  // namespace essaim
