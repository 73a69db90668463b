// A GGUF v3 file opened for reading: hardened validation up front (docs/reference.md 1.8), then zero-copy access.
//
//   ESSAIM_ASSIGN_OR_RETURN(GgufFile f, GgufFile::open("model.gguf"));
//   uint32_t n_layer = *f.get_u32("qwen3moe.block_count");     // nullopt when absent or of another type
//   const GgufTensor* w = f.find_tensor("blk.0.ffn_gate_exps.weight");
//   std::span<const uint8_t> slab = w->expert_slab(17);          // bytes of expert 17
//
// Every count, length, shape product, offset and alignment is checked with overflow-safe arithmetic before
// use; a refused file yields an error naming the field and the byte offset where it was found.
// Typed getters are strict (a u32 key stored as i32 is "absent" to get_u32); use find_kv to see the raw value.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/mapped_file.h"
#include "core/status.h"
#include "core/ggml_type.h"

namespace essaim {

class GgufCursor;  // gguf_cursor.h: the reader's bounds-checked view of the bytes

enum class GgufValueType : int32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12, COUNT = 13,
};
static_assert(int(GgufValueType::FLOAT64) == 12);

std::string_view gguf_value_type_name(GgufValueType t);

// One metadata value. Scalars are held widened; arrays keep their element type.
struct GgufValue {
  GgufValueType type = GgufValueType::UINT8;
  GgufValueType elem_type = GgufValueType::UINT8;  // for ARRAY
  // Scalar payloads (exactly one meaningful, chosen by `type`):
  uint64_t u = 0;     // UINT8/16/32/64, BOOL (0/1)
  int64_t i = 0;      // INT8/16/32/64
  double f = 0;       // FLOAT32 (exactly representable), FLOAT64
  std::string str;    // STRING
  // Array payloads (by elem_type): integers widened into ints/uints, floats into floats, strings into strs.
  std::vector<uint64_t> uints;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::vector<std::string> strs;
  uint64_t array_size() const;
};

// Values of one type, built the one way the writer's setters and synth's metadata plan both use.
GgufValue gguf_unsigned(GgufValueType t, uint64_t v);  // UINT8/16/32/64 and BOOL (0/1)
GgufValue gguf_signed(GgufValueType t, int64_t v);     // INT8/16/32/64
GgufValue gguf_float(GgufValueType t, double v);       // FLOAT32/64
GgufValue gguf_bool(bool v);
GgufValue gguf_string(std::string v);
GgufValue gguf_array_i32(const std::vector<int32_t>& v);
GgufValue gguf_array_u32(const std::vector<uint32_t>& v);
GgufValue gguf_array_f32(const std::vector<float>& v);
GgufValue gguf_array_bool(const std::vector<bool>& v);
GgufValue gguf_array_string(std::vector<std::string> v);

struct GgufKv {
  std::string key;
  GgufValue value;
};

struct GgufTensor {
  std::string name;
  uint32_t n_dims = 0;
  std::array<int64_t, 4> ne{1, 1, 1, 1};  // ggml order: ne[0] contiguous; trailing dims are 1
  GgmlType type = GgmlType::F32;
  uint64_t offset = 0;       // relative to data_start, as stored
  uint64_t nbytes = 0;       // validated byte size
  uint64_t file_offset = 0;  // absolute: data_start + offset
  const uint8_t* data = nullptr;  // into the mapping; valid while the GgufFile lives

  uint64_t nelements() const { return uint64_t(ne[0]) * ne[1] * ne[2] * ne[3]; }
  uint64_t row_bytes() const;                 // bytes of one ne[0] row
  std::span<const uint8_t> bytes() const { return {data, nbytes}; }
  // For 3-D expert tensors [in, out, X]: bytes of expert e (0 <= e < ne[2]), i.e. [e*nb2, (e+1)*nb2).
  uint64_t expert_slab_bytes() const { return row_bytes() * uint64_t(ne[1]); }
  std::span<const uint8_t> expert_slab(int64_t e) const;
};

class GgufFile {
 public:
  static Result<GgufFile> open(const std::string& path);
  // The same, from a private copy of the file in memory (MappedFile::read; --no-mmap).
  static Result<GgufFile> read(const std::string& path);
  // Parses bytes the caller keeps alive (tests, fuzzing).
  static Result<GgufFile> parse(std::span<const uint8_t> bytes);

  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_start() const { return data_start_; }
  uint64_t file_size() const { return file_.size(); }
  const std::string& path() const { return file_.path(); }
  const MappedFile& mapping() const { return file_; }
  MappedFile& mapping() { return file_; }

  const std::vector<GgufKv>& kvs() const { return kvs_; }           // file order
  const std::vector<GgufTensor>& tensors() const { return tensors_; }  // file (= data) order

  // Adds tensors the file describes in metadata but does not store (a backbone file's routed experts,
  // slice/backbone_experts.h): data == nullptr, offset 0, appended after the stored ones. A name already
  // present is an error. Whoever reads such a tensor's bytes must check data first.
  Status add_shape_only_tensors(std::vector<GgufTensor> tensors);

  const GgufValue* find_kv(std::string_view key) const;
  const GgufTensor* find_tensor(std::string_view name) const;

  // Strict typed getters: nullopt when absent or stored with another type.
  std::optional<uint32_t> get_u32(std::string_view key) const;
  std::optional<int32_t> get_i32(std::string_view key) const;
  std::optional<uint64_t> get_u64(std::string_view key) const;
  std::optional<float> get_f32(std::string_view key) const;
  std::optional<bool> get_bool(std::string_view key) const;
  std::optional<std::string> get_string(std::string_view key) const;
  const std::vector<std::string>* get_string_array(std::string_view key) const;

 private:
  static Result<GgufFile> from_mapping(MappedFile file);
  Status read_header(GgufCursor& c, int64_t* n_tensors, int64_t* n_kv);
  Status read_kvs(GgufCursor& c, int64_t n_kv);
  Status read_tensor_infos(GgufCursor& c, int64_t n_tensors);

  MappedFile file_;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  uint64_t data_start_ = 0;
  std::vector<GgufKv> kvs_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// A metadata string for an error message: in single quotes, valid UTF-8 kept, and every NUL, control
// character or byte that is not UTF-8 shown as \xNN (a string value is arbitrary bytes: 'qwen3moe\x00x'
// must not read as 'qwen3moe', nor put raw bytes on the user's terminal). Cut after max_bytes, with "...".
std::string gguf_quote_string(std::string_view value, size_t max_bytes = 96);

}  // namespace essaim
