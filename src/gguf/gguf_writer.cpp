// Streaming GGUF v3 writer. The layout is exactly docs/reference.md 1.9, as llama.cpp's gguf_write_out emits it:
// header, KVs, tensor infos, zero padding to the alignment, then each tensor's data followed by zero padding
// (the last tensor included). Offsets are the padded running sum, so llama.cpp's check 16 holds by
// construction.
#include "gguf/gguf_writer.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "gguf/gguf_layout.h"

namespace essaim {
namespace {

constexpr uint32_t kVersion = 3;

template <typename T>
void put(std::string& buf, T v) {
  char raw[sizeof(T)];
  std::memcpy(raw, &v, sizeof(T));  // the file is little-endian and so is every host essaim supports
  buf.append(raw, sizeof(T));
}

void put_string(std::string& buf, const std::string& s) {
  put<uint64_t>(buf, s.size());
  buf.append(s);
}

// One scalar of type t taken from the widened payloads of a GgufValue.
void put_scalar(std::string& buf, GgufValueType t, uint64_t u, int64_t i, double f, const std::string& s) {
  switch (t) {
    case GgufValueType::UINT8: put<uint8_t>(buf, uint8_t(u)); break;
    case GgufValueType::INT8: put<int8_t>(buf, int8_t(i)); break;
    case GgufValueType::UINT16: put<uint16_t>(buf, uint16_t(u)); break;
    case GgufValueType::INT16: put<int16_t>(buf, int16_t(i)); break;
    case GgufValueType::UINT32: put<uint32_t>(buf, uint32_t(u)); break;
    case GgufValueType::INT32: put<int32_t>(buf, int32_t(i)); break;
    case GgufValueType::FLOAT32: put<float>(buf, float(f)); break;
    case GgufValueType::BOOL: put<uint8_t>(buf, u != 0 ? 1 : 0); break;
    case GgufValueType::STRING: put_string(buf, s); break;
    case GgufValueType::UINT64: put<uint64_t>(buf, u); break;
    case GgufValueType::INT64: put<int64_t>(buf, i); break;
    case GgufValueType::FLOAT64: put<double>(buf, f); break;
    case GgufValueType::ARRAY: case GgufValueType::COUNT: ESSAIM_CHECK(false && "not a scalar type");
  }
}

void put_value(std::string& buf, const GgufValue& v) {
  put<int32_t>(buf, int32_t(v.type));
  if (v.type != GgufValueType::ARRAY) {
    put_scalar(buf, v.type, v.u, v.i, v.f, v.str);
    return;
  }
  put<int32_t>(buf, int32_t(v.elem_type));
  put<uint64_t>(buf, v.array_size());
  static const std::string kEmpty;
  for (uint64_t k = 0; k < v.array_size(); ++k) {
    switch (v.elem_type) {
      case GgufValueType::STRING: put_scalar(buf, v.elem_type, 0, 0, 0, v.strs[k]); break;
      case GgufValueType::FLOAT32: case GgufValueType::FLOAT64:
        put_scalar(buf, v.elem_type, 0, 0, v.floats[k], kEmpty);
        break;
      case GgufValueType::INT8: case GgufValueType::INT16: case GgufValueType::INT32: case GgufValueType::INT64:
        put_scalar(buf, v.elem_type, 0, v.ints[k], 0, kEmpty);
        break;
      default: put_scalar(buf, v.elem_type, v.uints[k], 0, 0, kEmpty); break;
    }
  }
}

bool valid_value_type(GgufValueType t) { return int32_t(t) >= 0 && t < GgufValueType::COUNT; }

}  // namespace

GgufWriter::GgufWriter(uint32_t alignment) : alignment_(alignment) {}

GgufWriter::~GgufWriter() {
  // An unfinished file is not a GGUF file; leave nothing half-written behind.
  if (out_ != nullptr) {
    std::fclose(out_);
    std::remove(path_.c_str());
  }
}

void GgufWriter::set(const std::string& key, GgufValue value) {
  for (GgufKv& kv : kvs_)
    if (kv.key == key) {
      kv.value = std::move(value);
      return;
    }
  kvs_.push_back(GgufKv{key, std::move(value)});
}

void GgufWriter::set_u8(const std::string& key, uint8_t v) { set(key, gguf_unsigned(GgufValueType::UINT8, v)); }
void GgufWriter::set_i8(const std::string& key, int8_t v) { set(key, gguf_signed(GgufValueType::INT8, v)); }
void GgufWriter::set_u16(const std::string& key, uint16_t v) { set(key, gguf_unsigned(GgufValueType::UINT16, v)); }
void GgufWriter::set_i16(const std::string& key, int16_t v) { set(key, gguf_signed(GgufValueType::INT16, v)); }
void GgufWriter::set_u32(const std::string& key, uint32_t v) { set(key, gguf_unsigned(GgufValueType::UINT32, v)); }
void GgufWriter::set_i32(const std::string& key, int32_t v) { set(key, gguf_signed(GgufValueType::INT32, v)); }
void GgufWriter::set_u64(const std::string& key, uint64_t v) { set(key, gguf_unsigned(GgufValueType::UINT64, v)); }
void GgufWriter::set_i64(const std::string& key, int64_t v) { set(key, gguf_signed(GgufValueType::INT64, v)); }
void GgufWriter::set_f32(const std::string& key, float v) { set(key, gguf_float(GgufValueType::FLOAT32, v)); }
void GgufWriter::set_f64(const std::string& key, double v) { set(key, gguf_float(GgufValueType::FLOAT64, v)); }
void GgufWriter::set_bool(const std::string& key, bool v) { set(key, gguf_bool(v)); }
void GgufWriter::set_string(const std::string& key, const std::string& v) { set(key, gguf_string(v)); }
void GgufWriter::set_array_i32(const std::string& key, const std::vector<int32_t>& v) { set(key, gguf_array_i32(v)); }
void GgufWriter::set_array_u32(const std::string& key, const std::vector<uint32_t>& v) { set(key, gguf_array_u32(v)); }
void GgufWriter::set_array_f32(const std::string& key, const std::vector<float>& v) { set(key, gguf_array_f32(v)); }
void GgufWriter::set_array_bool(const std::string& key, const std::vector<bool>& v) { set(key, gguf_array_bool(v)); }
void GgufWriter::set_array_string(const std::string& key, const std::vector<std::string>& v) {
  set(key, gguf_array_string(v));
}
void GgufWriter::set_value(const std::string& key, const GgufValue& v) { set(key, v); }

void GgufWriter::add_tensor(const std::string& name, GgmlType type, std::vector<int64_t> ne) {
  tensors_.push_back(TensorDecl{name, type, std::move(ne)});
}

size_t GgufWriter::tensor_count() const { return tensors_.size(); }

uint64_t GgufWriter::tensor_nbytes(size_t index) const {
  ESSAIM_CHECK(index < tensors_.size());
  const TensorShapeCheck c = gguf_check_tensor_shape(int64_t(tensors_[index].type), tensors_[index].ne);
  return c.error.empty() ? c.nbytes : 0;
}

Status GgufWriter::check_declarations() const {
  if (!gguf_is_power_of_two(alignment_))
    return Status::error("alignment " + std::to_string(alignment_) + " is not a non-zero power of two");
  for (const GgufKv& kv : kvs_) {
    if (kv.key.empty()) return Status::error("metadata key is empty");
    const GgufValue& v = kv.value;
    const bool ok = valid_value_type(v.type) &&
                    (v.type != GgufValueType::ARRAY ||
                     (valid_value_type(v.elem_type) && v.elem_type != GgufValueType::ARRAY));
    if (!ok) return Status::error("metadata '" + kv.key + "' has an invalid value type (nested arrays included)");
  }
  std::set<std::string> names;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorDecl& t = tensors_[i];
    const std::string who = "tensor " + std::to_string(i) + " '" + t.name + "'";
    if (t.name.empty() || t.name.size() > kGgufMaxNameBytes)
      return Status::error(who + ": name length " + std::to_string(t.name.size()) + " is outside 1.." +
                           std::to_string(kGgufMaxNameBytes));
    if (!names.insert(t.name).second) return Status::error(who + ": duplicate tensor name");
    const TensorShapeCheck c = gguf_check_tensor_shape(int64_t(t.type), t.ne);
    if (!c.error.empty()) return Status::error(who + ": " + c.error);
  }
  return Status::ok();
}

Status GgufWriter::fail(std::string message) {
  if (out_ != nullptr) {
    std::fclose(out_);
    std::remove(path_.c_str());
    out_ = nullptr;
  }
  state_ = State::FAILED;
  return Status::error(path_ + ": " + message);
}

Status GgufWriter::write_raw(const void* data, size_t size) {
  if (size != 0 && std::fwrite(data, 1, size, out_) != size)
    return fail("write failed: " + std::string(std::strerror(errno)));
  return Status::ok();
}

Status GgufWriter::write_zeros(uint64_t count) {
  static const uint8_t kZeros[256] = {};
  while (count > 0) {
    const size_t n = size_t(std::min<uint64_t>(count, sizeof(kZeros)));
    ESSAIM_RETURN_IF_ERROR(write_raw(kZeros, n));
    count -= n;
  }
  return Status::ok();
}

Status GgufWriter::begin(const std::string& path) {
  if (state_ != State::DECLARING) return Status::error(path + ": GgufWriter::begin called twice");
  path_ = path;
  if (Status s = check_declarations(); !s) {
    state_ = State::FAILED;
    return s.with_context(path);
  }
  // A non-default alignment must be announced as UINT32 general.alignment, or readers assume 32.
  const auto align_kv = std::find_if(kvs_.begin(), kvs_.end(),
                                     [](const GgufKv& kv) { return kv.key == "general.alignment"; });
  if (align_kv != kvs_.end()) {
    if (align_kv->value.type != GgufValueType::UINT32 || align_kv->value.u != alignment_) {
      state_ = State::FAILED;
      return Status::error(path + ": general.alignment must be UINT32 " + std::to_string(alignment_) +
                           ", the writer's alignment");
    }
  } else if (alignment_ != kGgufDefaultAlignment) {
    set_u32("general.alignment", alignment_);
  }

  std::string head;
  head.append("GGUF", 4);
  put<uint32_t>(head, kVersion);
  put<int64_t>(head, int64_t(tensors_.size()));
  put<int64_t>(head, int64_t(kvs_.size()));
  for (const GgufKv& kv : kvs_) {
    put_string(head, kv.key);
    put_value(head, kv.value);
  }
  nbytes_.clear();
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorDecl& t = tensors_[i];
    const uint64_t nbytes = gguf_check_tensor_shape(int64_t(t.type), t.ne).nbytes;
    put_string(head, t.name);
    put<uint32_t>(head, uint32_t(t.ne.size()));
    for (int64_t e : t.ne) put<int64_t>(head, e);
    put<int32_t>(head, int32_t(t.type));
    put<uint64_t>(head, offset);
    uint64_t padded = 0;
    if (!gguf_align_up(nbytes, alignment_, &padded) || __builtin_add_overflow(offset, padded, &offset)) {
      state_ = State::FAILED;
      return Status::error(path + ": tensor " + std::to_string(i) + " '" + t.name + "': data offset overflows");
    }
    nbytes_.push_back(nbytes);
  }
  uint64_t head_padded = 0;
  ESSAIM_CHECK(gguf_align_up(head.size(), alignment_, &head_padded));
  head.resize(head_padded, '\0');

  out_ = std::fopen(path.c_str(), "wb");
  if (out_ == nullptr) {
    state_ = State::FAILED;
    return Status::error("cannot create '" + path + "': " + std::strerror(errno));
  }
  state_ = State::WRITING;
  current_ = 0;
  current_written_ = 0;
  return write_raw(head.data(), head.size());
}

Status GgufWriter::write_tensor_data(std::span<const uint8_t> bytes) {
  if (state_ != State::WRITING) return Status::error(path_ + ": write_tensor_data outside begin()..finish()");
  while (!bytes.empty()) {
    if (current_ == tensors_.size())
      return fail("more tensor data than the " + std::to_string(tensors_.size()) + " declared tensors hold");
    const uint64_t want = nbytes_[current_] - current_written_;
    const size_t n = size_t(std::min<uint64_t>(want, bytes.size()));
    ESSAIM_RETURN_IF_ERROR(write_raw(bytes.data(), n));
    bytes = bytes.subspan(n);
    current_written_ += n;
    if (current_written_ == nbytes_[current_]) {
      uint64_t padded = 0;
      ESSAIM_CHECK(gguf_align_up(nbytes_[current_], alignment_, &padded));
      ESSAIM_RETURN_IF_ERROR(write_zeros(padded - nbytes_[current_]));
      ++current_;
      current_written_ = 0;
    }
  }
  return Status::ok();
}

Status GgufWriter::finish() {
  if (state_ != State::WRITING) return Status::error(path_ + ": finish without a successful begin()");
  if (current_ != tensors_.size()) {
    const TensorDecl& t = tensors_[current_];
    return fail("tensor " + std::to_string(current_) + " '" + t.name + "' got " +
                std::to_string(current_written_) + " of its " + std::to_string(nbytes_[current_]) +
                " bytes (and " + std::to_string(tensors_.size() - current_ - 1) + " tensors after it none)");
  }
  const bool flushed = std::fflush(out_) == 0;
  const int err = errno;
  const bool closed = std::fclose(out_) == 0;
  out_ = nullptr;
  if (!flushed || !closed) {
    std::remove(path_.c_str());
    state_ = State::FAILED;
    return Status::error(path_ + ": closing failed: " + std::strerror(flushed ? errno : err));
  }
  state_ = State::FINISHED;
  return Status::ok();
}

}  // namespace essaim
