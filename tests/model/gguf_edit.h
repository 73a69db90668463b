// Test helper: rewrite a GGUF file with edits (keys dropped/replaced, tensors dropped, reshaped, retyped, given
// another's bytes, q/k/v fused, or added with given bytes) through GgufWriter, to build files a loader must accept or refuse.
//
//   std::string path = gguf_rewrite(src, "q35_missing_conv", {.drop_tensors = {"blk.0.ssm_conv1d.weight"}});
//   Result<std::unique_ptr<Model>> m = load_model(path);   // refused, naming the tensor
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "gguf/gguf_file.h"

namespace essaim::test {

struct NewTensor {
  std::string name;
  GgmlType type = GgmlType::F32;
  std::vector<int64_t> ne;
  std::vector<uint8_t> bytes;
};

struct GgufEdit {
  std::vector<std::string> drop_keys{};
  std::map<std::string, GgufValue> set_keys{};            // replaces or adds
  std::vector<std::string> drop_tensors{};
  std::map<std::string, std::vector<int64_t>> reshape{};  // new extents, zero-filled data
  std::map<std::string, GgmlType> retype{};               // new type, zero-filled data
  std::vector<NewTensor> add_tensors{};                   // appended after the kept ones
  std::map<std::string, std::string> copy_data{};         // tensor -> tensor whose bytes it takes (same size)
  bool fuse_qkv = false;  // attn_q/k/v -> one attn_qkv [E, H·D + 2·Hkv·D] (rows q, then k, then v)
};

// Writes ESSAIM_BINARY_DIR/<name>.gguf and returns its path.
std::string gguf_rewrite(const std::string& src_path, const std::string& name, const GgufEdit& e);

inline GgufValue gguf_u32(uint32_t v) { return gguf_unsigned(GgufValueType::UINT32, v); }
inline GgufValue gguf_i32(int32_t v) { return gguf_signed(GgufValueType::INT32, v); }
GgufValue gguf_array(GgufValueType elem, const std::vector<int64_t>& values);  // integer/BOOL elements

}  // namespace essaim::test
