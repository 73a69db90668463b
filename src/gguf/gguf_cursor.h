// Internal to the GGUF reader: a bounds-checked little-endian cursor over untrusted bytes, and the metadata
// value decoder built on it. Every read checks the bytes remaining *before* touching them (docs/reference.md 1.8
// check 4) and fails with the field name and its absolute byte offset.
//
//   GgufCursor c(bytes);
//   uint32_t version;
//   ESSAIM_RETURN_IF_ERROR(c.read(&version, "version"));   // "version at byte 4: needs 4 bytes, 1 left"
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "core/status.h"
#include "gguf/gguf_file.h"

namespace essaim {

// Limits of docs/reference.md 1.8 checks 5, 7 and 21.
inline constexpr uint64_t kGgufMaxStringBytes = uint64_t(1) << 30;
inline constexpr uint64_t kGgufMaxArrayCount = uint64_t(1) << 30;
// Decoded metadata lives in RAM (widened to 8 bytes per element, 32 per std::string), unlike tensor data,
// so a small file could otherwise ask for many times its size. Real vocabularies need tens of MB.
inline constexpr uint64_t kGgufMaxMetadataMemory = uint64_t(1) << 30;

class GgufCursor {
 public:
  explicit GgufCursor(std::span<const uint8_t> bytes) : bytes_(bytes) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return bytes_.size() - pos_; }

  template <typename T>
  Status read(T* out, std::string_view field) {
    if (remaining() < sizeof(T)) return truncated(field, sizeof(T));
    std::memcpy(out, bytes_.data() + pos_, sizeof(T));  // little-endian host (x86-64, aarch64)
    pos_ += sizeof(T);
    return Status::ok();
  }

  // u64 length + bytes; the length is checked against the 1 GiB cap and the bytes left before allocating.
  Status read_string(std::string* out, std::string_view field);

  Status truncated(std::string_view field, uint64_t need) const;

 private:
  std::span<const uint8_t> bytes_;
  uint64_t pos_ = 0;
};

// Running total of decoded metadata memory, refused beyond kGgufMaxMetadataMemory (check 21).
struct GgufMetadataBudget {
  uint64_t used = 0;
  Status charge(uint64_t bytes, uint64_t at);
};

// Decodes one value of type `type` (already validated to be < COUNT) at the cursor. Arrays: element type
// in 0..12 and not ARRAY, count <= 2^30, count x minimum element size <= bytes left. BOOL normalised to 0/1.
Status gguf_read_value(GgufCursor& cursor, GgufValueType type, GgufValue* out, GgufMetadataBudget& budget);

// Key / tensor names are arbitrary bytes: quote them for error messages (escaped, at most 64 characters).
std::string gguf_quote(std::string_view name);

// " at byte N"
inline std::string gguf_at(uint64_t pos) { return " at byte " + std::to_string(pos); }

}  // namespace essaim
