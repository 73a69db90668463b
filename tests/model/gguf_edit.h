// Test helper: rewrite a GGUF file with edits (keys dropped/replaced, tensors dropped, reshaped, retyped or
// added with given bytes) through GgufWriter, to build files a loader must accept or refuse.
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
};

// Writes ESSAIM_BINARY_DIR/<name>.gguf and returns its path.
std::string gguf_rewrite(const std::string& src_path, const std::string& name, const GgufEdit& e);

GgufValue gguf_u32(uint32_t v);
GgufValue gguf_i32(int32_t v);
GgufValue gguf_string(const std::string& s);
GgufValue gguf_array(GgufValueType elem, const std::vector<int64_t>& values);  // integer/BOOL elements

}  // namespace essaim::test
