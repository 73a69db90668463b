// GGUF v3 reader: every check of docs/reference.md 1.8 (1-18, 21) is made once, up front, with overflow-safe
// arithmetic, so that everything the rest of essaim touches afterwards (tensor views, expert slabs) is a
// byte range known to lie inside the mapping.
#include <limits>

#include "gguf/gguf_cursor.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_layout.h"

namespace essaim {
namespace {

constexpr uint64_t kHeaderBytes = 24;          // magic, version, tensor_count, kv_count
constexpr uint64_t kMinKvBytes = 8 + 4;        // key length + value type (check 3)
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;  // name length + n_dims + type + offset

std::string tensor_who(size_t i, std::string_view name) {
  return "tensor " + std::to_string(i) + " " + gguf_quote(name);
}

}  // namespace

uint64_t GgufTensor::row_bytes() const { return type_traits(type).row_bytes(uint64_t(ne[0])); }

std::span<const uint8_t> GgufTensor::expert_slab(int64_t e) const {
  ESSAIM_CHECK(e >= 0 && e < ne[2]);
  const uint64_t slab = expert_slab_bytes();
  return {data + uint64_t(e) * slab, slab};
}

Result<GgufFile> GgufFile::open(const std::string& path) {
  Result<MappedFile> mapped = MappedFile::open(path);
  if (!mapped) return mapped.status();
  Result<GgufFile> f = from_mapping(std::move(*mapped));
  if (!f) return f.status().with_context(path);
  return f;
}

Result<GgufFile> GgufFile::read(const std::string& path) {
  Result<MappedFile> copy = MappedFile::read(path);
  if (!copy) return copy.status();
  Result<GgufFile> f = from_mapping(std::move(*copy));
  if (!f) return f.status().with_context(path);
  return f;
}

Result<GgufFile> GgufFile::parse(std::span<const uint8_t> bytes) {
  return from_mapping(MappedFile::borrow(bytes));
}

Result<GgufFile> GgufFile::from_mapping(MappedFile file) {
  GgufFile f;
  f.file_ = std::move(file);
  GgufCursor c(f.file_.bytes());
  int64_t n_tensors = 0;
  int64_t n_kv = 0;
  ESSAIM_RETURN_IF_ERROR(f.read_header(c, &n_tensors, &n_kv));
  ESSAIM_RETURN_IF_ERROR(f.read_kvs(c, n_kv));
  ESSAIM_RETURN_IF_ERROR(f.read_tensor_infos(c, n_tensors));
  return f;
}

Status GgufFile::read_header(GgufCursor& c, int64_t* n_tensors, int64_t* n_kv) {
  const uint64_t size = file_.size();
  const uint8_t* b = file_.bytes().data();
  // Check 1: magic first (the more useful message for a wrong file), then the full header length.
  if (size < 4 || b[0] != 'G' || b[1] != 'G' || b[2] != 'U' || b[3] != 'F')
    return Status::error("magic at byte 0 is not 'GGUF': not a GGUF file");
  if (size < kHeaderBytes)
    return Status::error("header is truncated: the file has " + std::to_string(size) +
                         " bytes, a GGUF header needs " + std::to_string(kHeaderBytes));
  uint32_t magic = 0;
  ESSAIM_RETURN_IF_ERROR(c.read(&magic, "magic"));
  uint32_t version = 0;
  ESSAIM_RETURN_IF_ERROR(c.read(&version, "version"));
  // Check 2: a byte-swapped (big-endian) file shows its version in the high bytes.
  if (version == 0) return Status::error("version 0 at byte 4 is invalid");
  if ((version & 0xFFFF) == 0)
    return Status::error("version " + std::to_string(version) +
                         " at byte 4 looks byte-swapped: big-endian GGUF files are not supported");
  if (version == 1)
    return Status::error("version 1 at byte 4 is not supported (GGUF v1 used 32-bit counts; accept 2 and 3)");
  if (version > 3)
    return Status::error("version " + std::to_string(version) + " at byte 4 is newer than supported (2, 3)");
  version_ = version;
  ESSAIM_RETURN_IF_ERROR(c.read(n_tensors, "tensor_count"));
  ESSAIM_RETURN_IF_ERROR(c.read(n_kv, "kv_count"));
  // Check 3: signed counts, each bounded by the least bytes its records need.
  const uint64_t left = c.remaining();
  if (*n_tensors < 0)
    return Status::error("tensor_count " + std::to_string(*n_tensors) + " at byte 8 is negative");
  if (uint64_t(*n_tensors) > left / kMinTensorInfoBytes)
    return Status::error("tensor_count " + std::to_string(*n_tensors) + " at byte 8 needs at least " +
                         std::to_string(kMinTensorInfoBytes) + " bytes per tensor info, the file has " +
                         std::to_string(left) + " bytes after the header");
  if (*n_kv < 0) return Status::error("kv_count " + std::to_string(*n_kv) + " at byte 16 is negative");
  if (uint64_t(*n_kv) > left / kMinKvBytes)
    return Status::error("kv_count " + std::to_string(*n_kv) + " at byte 16 needs at least " +
                         std::to_string(kMinKvBytes) + " bytes per pair, the file has " + std::to_string(left) +
                         " bytes after the header");
  return Status::ok();
}

Status GgufFile::read_kvs(GgufCursor& c, int64_t n_kv) {
  GgufMetadataBudget budget;
  kvs_.reserve(size_t(n_kv));  // bounded by the file size (check 3)
  uint64_t align_value_at = 0;
  for (int64_t i = 0; i < n_kv; ++i) {
    const std::string who = "kv " + std::to_string(i);
    const uint64_t key_at = c.pos();
    GgufKv kv;
    if (Status s = c.read_string(&kv.key, "key"); !s) return s.with_context(who);
    const std::string named = who + " " + gguf_quote(kv.key);
    // Check 6: non-empty, unique keys.
    if (kv.key.empty()) return Status::error(who + ": key" + gguf_at(key_at) + " is empty");
    if (const auto dup = kv_index_.find(kv.key); dup != kv_index_.end())
      return Status::error(named + ": duplicate key" + gguf_at(key_at) + " (first defined by kv " +
                           std::to_string(dup->second) + ")");
    ESSAIM_RETURN_IF_ERROR(budget.charge(sizeof(GgufKv) + kv.key.size(), key_at));
    const uint64_t type_at = c.pos();
    int32_t type_id = 0;
    if (Status s = c.read(&type_id, "value type"); !s) return s.with_context(named);
    // Check 7: a known value type.
    if (type_id < 0 || type_id >= int32_t(GgufValueType::COUNT))
      return Status::error(named + ": value type " + std::to_string(type_id) + gguf_at(type_at) +
                           " is not a GGUF value type (0..12)");
    if (kv.key == "general.alignment") align_value_at = c.pos();
    if (Status s = gguf_read_value(c, GgufValueType(type_id), &kv.value, budget); !s)
      return s.with_context(named);
    kv_index_.emplace(kv.key, kvs_.size());
    kvs_.push_back(std::move(kv));
  }
  // Check 8: general.alignment is a UINT32 non-zero power of two (llama.cpp aborts on another type).
  alignment_ = kGgufDefaultAlignment;
  if (const auto it = kv_index_.find("general.alignment"); it != kv_index_.end()) {
    const GgufValue& v = kvs_[it->second].value;
    const std::string named = "kv " + std::to_string(it->second) + " 'general.alignment'";
    if (v.type != GgufValueType::UINT32)
      return Status::error(named + ": value" + gguf_at(align_value_at) + " has type " +
                           std::string(gguf_value_type_name(v.type)) + ", must be UINT32");
    if (!gguf_is_power_of_two(v.u))
      return Status::error(named + ": alignment " + std::to_string(v.u) + gguf_at(align_value_at) +
                           " is not a non-zero power of two");
    if (v.u > kGgufMaxAlignment)
      return Status::error(named + ": alignment " + std::to_string(v.u) + gguf_at(align_value_at) +
                           " is absurdly large (at most " + std::to_string(kGgufMaxAlignment) +
                           " is accepted; files use 32)");
    alignment_ = uint32_t(v.u);
  }
  return Status::ok();
}

Status GgufFile::read_tensor_infos(GgufCursor& c, int64_t n_tensors) {
  tensors_.reserve(size_t(n_tensors));  // bounded by the file size (check 3)
  uint64_t running = 0;  // padded running sum of tensor sizes: the only offset llama.cpp accepts
  for (int64_t i = 0; i < n_tensors; ++i) {
    const std::string who = "tensor " + std::to_string(i);
    const uint64_t name_at = c.pos();
    GgufTensor t;
    if (Status s = c.read_string(&t.name, "name"); !s) return s.with_context(who);
    const std::string named = tensor_who(size_t(i), t.name);
    // Check 9: names fit ggml's 64-byte buffer and are unique.
    if (t.name.empty()) return Status::error(named + ": name" + gguf_at(name_at) + " is empty");
    if (t.name.size() > kGgufMaxNameBytes)
      return Status::error(named + ": name length " + std::to_string(t.name.size()) + gguf_at(name_at) +
                           " exceeds " + std::to_string(kGgufMaxNameBytes) + " bytes");
    if (const auto dup = tensor_index_.find(t.name); dup != tensor_index_.end())
      return Status::error(named + ": duplicate tensor name" + gguf_at(name_at) + " (first used by tensor " +
                           std::to_string(dup->second) + ")");
    const uint64_t dims_at = c.pos();
    if (Status s = c.read(&t.n_dims, "n_dims"); !s) return s.with_context(named);
    // Check 10 before reading the extents: ne[] has room for 4.
    if (t.n_dims == 0 || t.n_dims > kGgufMaxDims)
      return Status::error(named + ": n_dims " + std::to_string(t.n_dims) + gguf_at(dims_at) +
                           " is outside 1.." + std::to_string(kGgufMaxDims));
    std::array<uint64_t, 4> ne_at{};
    for (uint32_t k = 0; k < t.n_dims; ++k) {
      ne_at[k] = c.pos();
      if (Status s = c.read(&t.ne[k], "ne[" + std::to_string(k) + "]"); !s) return s.with_context(named);
    }
    const uint64_t type_at = c.pos();
    int32_t type_id = 0;
    if (Status s = c.read(&type_id, "type"); !s) return s.with_context(named);
    const uint64_t offset_at = c.pos();
    if (Status s = c.read(&t.offset, "offset"); !s) return s.with_context(named);
    // Checks 11-15.
    const TensorShapeCheck shape = gguf_check_tensor_shape(type_id, std::span(t.ne.data(), t.n_dims));
    if (!shape.error.empty()) {
      const uint64_t at = shape.field == TensorField::TYPE ? type_at
                          : shape.field == TensorField::NE ? ne_at[shape.ne_index]
                                                           : dims_at;
      return Status::error(named + ": " + shape.error + gguf_at(at));
    }
    t.type = GgmlType(type_id);
    t.nbytes = shape.nbytes;
    // Check 16: offsets are exactly the padded running sum (no gaps, overlap, reordering or sharing).
    if (t.offset != running)
      return Status::error(named + ": offset " + std::to_string(t.offset) + gguf_at(offset_at) +
                           " is not the padded running sum " + std::to_string(running));
    uint64_t padded = 0;
    if (!gguf_align_up(t.nbytes, alignment_, &padded) || __builtin_add_overflow(running, padded, &running))
      return Status::error(named + ": size " + std::to_string(t.nbytes) + " at offset " +
                           std::to_string(t.offset) + " overflows the data section" + gguf_at(offset_at));
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }
  // Check 17: the data section starts inside the file.
  const uint64_t infos_end = c.pos();
  if (!gguf_align_up(infos_end, alignment_, &data_start_))
    return Status::error("data section start overflows (tensor infos end" + gguf_at(infos_end) +
                         ", alignment " + std::to_string(alignment_) + ")");
  const uint64_t size = file_.size();
  if (n_tensors > 0 && data_start_ > size)
    return Status::error("data section start " + std::to_string(data_start_) + " (tensor infos end" +
                         gguf_at(infos_end) + ", alignment " + std::to_string(alignment_) +
                         ") is past the end of the file (" + std::to_string(size) + " bytes)");
  // Check 18: every tensor's bytes lie inside the file. The last tensor's trailing padding may be absent.
  for (size_t i = 0; i < tensors_.size(); ++i) {
    GgufTensor& t = tensors_[i];
    uint64_t end = 0;
    if (__builtin_add_overflow(data_start_, t.offset, &t.file_offset) ||
        __builtin_add_overflow(t.file_offset, t.nbytes, &end) || end > size)
      return Status::error(tensor_who(i, t.name) + ": data of " + std::to_string(t.nbytes) +
                           " bytes at offset " + std::to_string(t.offset) + " (data section" +
                           gguf_at(data_start_) + ") runs past the end of the file (" + std::to_string(size) +
                           " bytes)");
    t.data = file_.bytes().data() + t.file_offset;
  }
  return Status::ok();
}

Status GgufFile::add_shape_only_tensors(std::vector<GgufTensor> tensors) {
  for (const GgufTensor& t : tensors)
    if (tensor_index_.count(t.name) != 0)
      return Status::error("tensor " + gguf_quote_string(t.name) + " is both stored and described as shape-only");
  for (GgufTensor& t : tensors) {
    t.data = nullptr;
    t.offset = 0;
    t.file_offset = 0;
    if (!tensor_index_.emplace(t.name, tensors_.size()).second)
      return Status::error("shape-only tensor " + gguf_quote_string(t.name) + " given twice");
    tensors_.push_back(std::move(t));
  }
  return Status::ok();
}

}  // namespace essaim
