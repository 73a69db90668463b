// Little-endian primitives of the expert protocol: a bounds-checked reader over an untrusted payload and an
// appending writer. Every multi-byte integer on the wire is little-endian (docs/protocol.md, "Encoding").
//
//   WireReader r(payload);
//   uint32_t n = 0;
//   if (!r.u32(n) || !r.fits(n, 4)) return truncated(...);   // count checked against remaining bytes
//   WireWriter w(out); w.u64(request_id); w.bytes(rows);
//
// The reader never reads past its span and never allocates; a failed read leaves it unchanged.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace essaim::proto {

// Bulk arrays (f32 outputs, i32/u32 ids) are copied with memcpy: every target (x86-64, ARM64 phones) is
// little-endian. A big-endian port would byte-swap here and in WireWriter::array.
static_assert(std::endian::native == std::endian::little, "the expert protocol assumes a little-endian host");

class WireReader {
 public:
  explicit WireReader(std::span<const uint8_t> bytes) : bytes_(bytes) {}

  size_t remaining() const { return bytes_.size() - pos_; }
  size_t position() const { return pos_; }
  bool at_end() const { return pos_ == bytes_.size(); }

  // True when `count` items of `item_bytes` each fit in the remaining bytes (overflow-safe).
  bool fits(uint64_t count, uint64_t item_bytes) const {
    return item_bytes == 0 || count <= remaining() / item_bytes;
  }

  bool u8(uint8_t& v) { return scalar(v); }
  bool u16(uint16_t& v) { return scalar(v); }
  bool u32(uint32_t& v) { return scalar(v); }
  bool u64(uint64_t& v) { return scalar(v); }
  bool i32(int32_t& v) { return scalar(v); }

  // A view of the next n bytes (no copy).
  bool view(uint64_t n, std::span<const uint8_t>& out) {
    if (n > remaining()) return false;
    out = bytes_.subspan(pos_, n);
    pos_ += n;
    return true;
  }

  // count items of T into out; the size is checked before the vector grows.
  template <typename T>
  bool array(uint64_t count, std::vector<T>& out) {
    if (!fits(count, sizeof(T))) return false;
    out.resize(count);
    if (count) std::memcpy(out.data(), bytes_.data() + pos_, count * sizeof(T));
    pos_ += count * sizeof(T);
    return true;
  }

  // A string prefixed by a u16 length.
  bool str16(std::string& out) {
    uint16_t n = 0;
    size_t saved = pos_;
    if (!u16(n) || n > remaining()) {
      pos_ = saved;
      return false;
    }
    out.assign(reinterpret_cast<const char*>(bytes_.data() + pos_), n);
    pos_ += n;
    return true;
  }

 private:
  template <typename T>
  bool scalar(T& v) {
    if (sizeof(T) > remaining()) return false;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }

  std::span<const uint8_t> bytes_;
  size_t pos_ = 0;
};

class WireWriter {
 public:
  explicit WireWriter(std::vector<uint8_t>& out) : out_(out) {}

  void u8(uint8_t v) { scalar(v); }
  void u16(uint16_t v) { scalar(v); }
  void u32(uint32_t v) { scalar(v); }
  void u64(uint64_t v) { scalar(v); }
  void i32(int32_t v) { scalar(v); }
  void bytes(std::span<const uint8_t> b) { out_.insert(out_.end(), b.begin(), b.end()); }
  template <typename T>
  void array(std::span<const T> items) {
    const auto* p = reinterpret_cast<const uint8_t*>(items.data());
    out_.insert(out_.end(), p, p + items.size_bytes());
  }
  // Callers bound the length (ESSAIM_CHECK) before writing: a u16 prefix cannot describe more.
  void str16(std::string_view s) {
    u16(static_cast<uint16_t>(s.size()));
    out_.insert(out_.end(), s.begin(), s.end());
  }

 private:
  template <typename T>
  void scalar(T v) {
    uint8_t b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    out_.insert(out_.end(), b, b + sizeof(T));
  }

  std::vector<uint8_t>& out_;
};

}  // namespace essaim::proto
