#include "gguf_edit.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "gguf/gguf_writer.h"

namespace essaim::test {

GgufValue gguf_u32(uint32_t v) {
  GgufValue x;
  x.type = GgufValueType::UINT32;
  x.u = v;
  return x;
}

GgufValue gguf_i32(int32_t v) {
  GgufValue x;
  x.type = GgufValueType::INT32;
  x.i = v;
  return x;
}

GgufValue gguf_string(const std::string& s) {
  GgufValue x;
  x.type = GgufValueType::STRING;
  x.str = s;
  return x;
}

GgufValue gguf_array(GgufValueType elem, const std::vector<int64_t>& values) {
  GgufValue x;
  x.type = GgufValueType::ARRAY;
  x.elem_type = elem;
  const bool is_signed = elem == GgufValueType::INT8 || elem == GgufValueType::INT16 ||
                         elem == GgufValueType::INT32 || elem == GgufValueType::INT64;
  for (int64_t v : values) {
    if (is_signed) x.ints.push_back(v);
    else x.uints.push_back(uint64_t(v));
  }
  return x;
}

std::string gguf_rewrite(const std::string& src_path, const std::string& name, const GgufEdit& e) {
  Result<GgufFile> src = GgufFile::open(src_path);
  EXPECT_TRUE(src.is_ok()) << src_path;
  if (!src) return "";
  GgufWriter w;
  for (const GgufKv& kv : src->kvs()) {
    if (kv.key == "general.alignment") continue;  // the writer sets it
    if (std::find(e.drop_keys.begin(), e.drop_keys.end(), kv.key) != e.drop_keys.end()) continue;
    auto it = e.set_keys.find(kv.key);
    w.set_value(kv.key, it != e.set_keys.end() ? it->second : kv.value);
  }
  for (const auto& [key, value] : e.set_keys)
    if (!src->find_kv(key)) w.set_value(key, value);

  std::vector<std::vector<uint8_t>> zeros;   // owned zero-filled data of changed tensors
  std::vector<std::span<const uint8_t>> data;
  for (const GgufTensor& t : src->tensors()) {
    if (std::find(e.drop_tensors.begin(), e.drop_tensors.end(), t.name) != e.drop_tensors.end()) continue;
    std::vector<int64_t> ne(t.ne.begin(), t.ne.begin() + std::max<uint32_t>(t.n_dims, 1));
    GgmlType type = t.type;
    bool changed = false;
    if (auto it = e.reshape.find(t.name); it != e.reshape.end()) ne = it->second, changed = true;
    if (auto it = e.retype.find(t.name); it != e.retype.end()) type = it->second, changed = true;
    w.add_tensor(t.name, type, ne);
    if (!changed) {
      data.push_back(t.bytes());
      continue;
    }
    uint64_t n = 1;
    for (int64_t d : ne) n *= uint64_t(d);
    zeros.emplace_back(n / type_traits(type).block_size * type_traits(type).type_size, 0);
  }
  for (const NewTensor& t : e.add_tensors) w.add_tensor(t.name, t.type, t.ne);

  const std::string path = std::string(ESSAIM_BINARY_DIR) + "/" + name + ".gguf";
  EXPECT_TRUE(w.begin(path).is_ok()) << path;
  size_t next_zero = 0, next_data = 0;
  for (const GgufTensor& t : src->tensors()) {
    if (std::find(e.drop_tensors.begin(), e.drop_tensors.end(), t.name) != e.drop_tensors.end()) continue;
    const bool changed = e.reshape.count(t.name) || e.retype.count(t.name);
    EXPECT_TRUE(w.write_tensor_data(changed ? std::span<const uint8_t>(zeros[next_zero++]) : data[next_data++]).is_ok());
  }
  for (const NewTensor& t : e.add_tensors) EXPECT_TRUE(w.write_tensor_data(t.bytes).is_ok()) << t.name;
  EXPECT_TRUE(w.finish().is_ok()) << path;
  return path;
}

}  // namespace essaim::test
