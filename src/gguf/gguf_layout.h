// Overflow-safe layout arithmetic shared by the GGUF reader and writer (docs/reference.md 1.5, 1.7, 1.8).
//
//   TensorShapeCheck c = gguf_check_tensor_shape(type_id, ne, n_dims);
//   if (!c.error.empty()) refuse(c.error, c.field);   // c.field says which field is wrong
//   uint64_t padded; if (!gguf_align_up(c.nbytes, alignment, &padded)) refuse("overflow");
//
// Both sides use the same rules so a file the writer accepts to write is exactly a file the reader accepts.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace essaim {

inline constexpr uint32_t kGgufDefaultAlignment = 32;
// The largest general.alignment accepted: 64 KiB covers every page size a file might be aligned for; a
// larger power of two (2^31, say) is a corrupt or hostile file, refused as such before any offset math.
inline constexpr uint32_t kGgufMaxAlignment = 1u << 16;
inline constexpr uint64_t kGgufMaxNameBytes = 63;  // ggml's name buffer is 64 bytes with the terminator
inline constexpr uint32_t kGgufMaxDims = 4;

inline bool gguf_is_power_of_two(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

// x rounded up to a multiple of `alignment` (a power of two); false on overflow.
inline bool gguf_align_up(uint64_t x, uint64_t alignment, uint64_t* out) {
  uint64_t sum = 0;
  if (__builtin_add_overflow(x, alignment - 1, &sum)) return false;
  *out = sum & ~(alignment - 1);
  return true;
}

// Which field of a tensor info record a shape error is about.
enum class TensorField { NONE, N_DIMS, NE, TYPE };

struct TensorShapeCheck {
  uint64_t nbytes = 0;             // valid when error is empty
  std::string error;               // empty when the shape is acceptable
  TensorField field = TensorField::NONE;
  uint32_t ne_index = 0;           // for TensorField::NE
};

// Checks 10-15 of docs/reference.md 1.8 on one tensor: 1..4 dims, extents >= 1, element count and byte size
// representable, a live type id, ne[0] a whole number of blocks. `ne` holds n_dims extents.
TensorShapeCheck gguf_check_tensor_shape(int64_t type_id, std::span<const int64_t> ne);

}  // namespace essaim
