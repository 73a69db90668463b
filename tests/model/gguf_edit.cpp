#include "gguf_edit.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "gguf/gguf_writer.h"

namespace essaim::test {

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

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// One tensor's data in the rewritten file: spans written one after the other, or that many zero bytes.
struct TensorData {
  std::vector<std::span<const uint8_t>> bytes;
  uint64_t zeros = 0;
};

void copy_keys(const GgufFile& src, const GgufEdit& e, GgufWriter& w) {
  for (const GgufKv& kv : src.kvs()) {
    if (kv.key == "general.alignment") continue;  // the writer sets it
    if (std::find(e.drop_keys.begin(), e.drop_keys.end(), kv.key) != e.drop_keys.end()) continue;
    auto it = e.set_keys.find(kv.key);
    w.set_value(kv.key, it != e.set_keys.end() ? it->second : kv.value);
  }
  for (const auto& [key, value] : e.set_keys)
    if (!src.find_kv(key)) w.set_value(key, value);
}

// blk.N.attn_q.weight as blk.N.attn_qkv.weight holding q's rows, then k's, then v's.
TensorData fused_qkv(const GgufFile& src, const GgufTensor& q, GgufWriter& w) {
  const std::string blk = q.name.substr(0, q.name.size() - std::string("attn_q.weight").size());
  const GgufTensor* k = src.find_tensor(blk + "attn_k.weight");
  const GgufTensor* v = src.find_tensor(blk + "attn_v.weight");
  w.add_tensor(blk + "attn_qkv.weight", q.type, {q.ne[0], q.ne[1] + k->ne[1] + v->ne[1]});
  return TensorData{{q.bytes(), k->bytes(), v->bytes()}};
}

// Declares the kept, changed and added tensors in w; returns their data in file order.
std::vector<TensorData> declare_tensors(const GgufFile& src, const GgufEdit& e, GgufWriter& w) {
  std::vector<TensorData> data;
  for (const GgufTensor& t : src.tensors()) {
    if (std::find(e.drop_tensors.begin(), e.drop_tensors.end(), t.name) != e.drop_tensors.end()) continue;
    if (e.fuse_qkv && (ends_with(t.name, ".attn_k.weight") || ends_with(t.name, ".attn_v.weight"))) continue;
    if (e.fuse_qkv && ends_with(t.name, ".attn_q.weight")) {
      data.push_back(fused_qkv(src, t, w));
      continue;
    }
    std::vector<int64_t> ne(t.ne.begin(), t.ne.begin() + std::max<uint32_t>(t.n_dims, 1));
    GgmlType type = t.type;
    bool changed = false;
    if (auto it = e.reshape.find(t.name); it != e.reshape.end()) ne = it->second, changed = true;
    if (auto it = e.retype.find(t.name); it != e.retype.end()) type = it->second, changed = true;
    w.add_tensor(t.name, type, ne);
    uint64_t n = 1;
    for (int64_t d : ne) n *= uint64_t(d);
    std::span<const uint8_t> bytes = t.bytes();
    if (auto it = e.copy_data.find(t.name); it != e.copy_data.end()) bytes = src.find_tensor(it->second)->bytes();
    data.push_back(changed ? TensorData{{}, n / type_traits(type).block_size * type_traits(type).type_size}
                           : TensorData{{bytes}});
  }
  for (const NewTensor& t : e.add_tensors) {
    w.add_tensor(t.name, t.type, t.ne);
    data.push_back(TensorData{{t.bytes}});
  }
  return data;
}

}  // namespace

std::string gguf_rewrite(const std::string& src_path, const std::string& name, const GgufEdit& e) {
  Result<GgufFile> src = GgufFile::open(src_path);
  EXPECT_TRUE(src.is_ok()) << src_path;
  if (!src) return "";
  GgufWriter w;
  copy_keys(*src, e, w);
  const std::vector<TensorData> data = declare_tensors(*src, e, w);
  const std::string path = std::string(ESSAIM_BINARY_DIR) + "/" + name + ".gguf";
  EXPECT_TRUE(w.begin(path).is_ok()) << path;
  for (const TensorData& d : data) {
    if (d.zeros) {
      EXPECT_TRUE(w.write_tensor_data(std::vector<uint8_t>(d.zeros, 0)).is_ok()) << path;
    }
    for (std::span<const uint8_t> b : d.bytes) EXPECT_TRUE(w.write_tensor_data(b).is_ok()) << path;
  }
  EXPECT_TRUE(w.finish().is_ok()) << path;
  return path;
}

}  // namespace essaim::test
