// Streaming GGUF v3 writer: metadata and tensor infos first, then tensor data written in order, each
// padded to the alignment, so multi-GB files never sit in memory (docs/reference.md 1.9).
//
//   GgufWriter w;
//   w.set_string("general.architecture", "qwen3moe");
//   w.set_u32("qwen3moe.block_count", 2);
//   w.set_array_string("tokenizer.ggml.tokens", tokens);
//   w.add_tensor("token_embd.weight", GgmlType::F32, {256, 279});      // declare all tensors first
//   ESSAIM_RETURN_IF_ERROR(w.begin("model.gguf"));                       // header + KVs + infos
//   ESSAIM_RETURN_IF_ERROR(w.write_tensor_data(bytes));                  // in declaration order; may be
//   ESSAIM_RETURN_IF_ERROR(w.finish());                                  // split over several calls
//
// Metadata is written with exactly the type of the setter used (llama.cpp is strict about key types).
#pragma once

#include <array>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "core/ggml_type.h"
#include "core/status.h"
#include "gguf/gguf_file.h"

namespace essaim {

class GgufWriter {
 public:
  explicit GgufWriter(uint32_t alignment = 32);
  ~GgufWriter();
  GgufWriter(const GgufWriter&) = delete;
  GgufWriter& operator=(const GgufWriter&) = delete;

  // Metadata (a later set of the same key replaces the earlier one, keeping its position).
  void set_u8(const std::string& key, uint8_t v);
  void set_i8(const std::string& key, int8_t v);
  void set_u16(const std::string& key, uint16_t v);
  void set_i16(const std::string& key, int16_t v);
  void set_u32(const std::string& key, uint32_t v);
  void set_i32(const std::string& key, int32_t v);
  void set_u64(const std::string& key, uint64_t v);
  void set_i64(const std::string& key, int64_t v);
  void set_f32(const std::string& key, float v);
  void set_f64(const std::string& key, double v);
  void set_bool(const std::string& key, bool v);
  void set_string(const std::string& key, const std::string& v);
  void set_array_i32(const std::string& key, const std::vector<int32_t>& v);
  void set_array_u32(const std::string& key, const std::vector<uint32_t>& v);
  void set_array_f32(const std::string& key, const std::vector<float>& v);
  void set_array_bool(const std::string& key, const std::vector<bool>& v);
  void set_array_string(const std::string& key, const std::vector<std::string>& v);
  void set_value(const std::string& key, const GgufValue& v);  // copy a value read from another file

  // Declares a tensor; ne in ggml order (ne[0] contiguous), 1..4 dims. Validated in begin().
  void add_tensor(const std::string& name, GgmlType type, std::vector<int64_t> ne);

  Status begin(const std::string& path);                   // writes header, KVs, infos, padding
  Status write_tensor_data(std::span<const uint8_t> bytes);  // appends to the current tensor; pads when full
  Status finish();                                         // checks every tensor got all its bytes

  uint64_t tensor_nbytes(size_t index) const;  // 0 while the declaration is invalid (begin() says why)
  size_t tensor_count() const;

 private:
  struct TensorDecl {
    std::string name;
    GgmlType type = GgmlType::F32;
    std::vector<int64_t> ne;
  };
  void set(const std::string& key, GgufValue value);
  Status check_declarations() const;
  Status write_raw(const void* data, size_t size);
  Status write_zeros(uint64_t count);
  Status fail(std::string message);  // closes the file and remembers the error

  uint32_t alignment_;
  std::vector<GgufKv> kvs_;
  std::vector<TensorDecl> tensors_;
  std::vector<uint64_t> nbytes_;  // per tensor, filled by begin()
  std::FILE* out_ = nullptr;
  std::string path_;
  enum class State { DECLARING, WRITING, FINISHED, FAILED } state_ = State::DECLARING;
  size_t current_ = 0;           // tensor receiving data
  uint64_t current_written_ = 0;  // bytes of it written so far
};

}  // namespace essaim
