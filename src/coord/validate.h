// Shape checks shared by the API parsers and the store's reads: identifiers, names, hex digests, ranges.
// Everything the coordinator reads from a client or back from its database passes through these.
//
//   if (!node_id_valid(id)) return error;   // "n-" + 16 lowercase hex
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace essaim::coord {

inline constexpr int64_t kMaxLayer = 4095;
inline constexpr int64_t kMaxExpert = 65535;
inline constexpr size_t kMaxNameBytes = 128;
inline constexpr size_t kMaxAddressBytes = 512;
inline constexpr size_t kMaxReasonBytes = 1024;
inline constexpr size_t kMaxHoldings = 65536;

inline bool is_hex(std::string_view s, size_t n) {
  if (s.size() != n) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}
inline bool node_id_valid(std::string_view id) { return id.size() == 18 && id.substr(0, 2) == "n-" && is_hex(id.substr(2), 16); }
// Printable ASCII or UTF-8 bytes, no control characters, 1..kMaxNameBytes.
inline bool name_valid(std::string_view s) {
  if (s.empty() || s.size() > kMaxNameBytes) return false;
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7f) return false;
  }
  return true;
}
inline bool role_valid(std::string_view r) { return r == "worker" || r == "backbone"; }
inline bool range_valid(int64_t layer, int64_t first, int64_t count) {
  return layer >= 0 && layer <= kMaxLayer && first >= 0 && count >= 1 && first <= kMaxExpert && count <= kMaxExpert + 1 &&
         first + count <= kMaxExpert + 1;
}

}  // namespace essaim::coord
