#include "text/byte_unicode.h"

#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cstdlib>

namespace essaim {
namespace {

bool is_continuation(uint8_t b) { return (b & 0xC0) == 0x80; }

// The 256 byte images of docs/reference.md 7.2: printable Latin-1 bytes map to themselves, the 68 others (controls,
// space, DEL, C1 controls, NBSP, soft hyphen) to U+0100.. in increasing byte order.
struct ByteMap {
  std::array<uint32_t, 256> to_cp{};
  std::array<int16_t, 0x144> from_cp{};  // every image is below U+0144; -1 = not an image
  std::array<std::array<char, 2>, 256> utf8{};
  std::array<uint8_t, 256> utf8_len{};

  ByteMap() {
    from_cp.fill(-1);
    uint32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool self = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const uint32_t cp = self ? uint32_t(b) : next++;
      to_cp[b] = cp;
      from_cp[cp] = int16_t(b);
      if (cp < 0x80) {
        utf8[b] = {char(cp), 0};
        utf8_len[b] = 1;
      } else {
        utf8[b] = {char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F))};
        utf8_len[b] = 2;
      }
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap map;
  return map;
}

}  // namespace

size_t utf8_decode(std::string_view s, size_t pos, uint32_t& cp) {
  const size_t n = s.size() - pos;
  const auto at = [&](size_t i) { return uint8_t(s[pos + i]); };
  const uint8_t b0 = at(0);
  if (b0 < 0x80) {
    cp = b0;
    return 1;
  }
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    if (n < 2 || !is_continuation(at(1))) return 0;
    cp = (uint32_t(b0 & 0x1F) << 6) | (at(1) & 0x3F);
    return 2;
  }
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    if (n < 3 || !is_continuation(at(1)) || !is_continuation(at(2))) return 0;
    if (b0 == 0xE0 && at(1) < 0xA0) return 0;  // overlong
    if (b0 == 0xED && at(1) > 0x9F) return 0;  // UTF-16 surrogate
    cp = (uint32_t(b0 & 0x0F) << 12) | (uint32_t(at(1) & 0x3F) << 6) | (at(2) & 0x3F);
    return 3;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    if (n < 4 || !is_continuation(at(1)) || !is_continuation(at(2)) || !is_continuation(at(3))) return 0;
    if (b0 == 0xF0 && at(1) < 0x90) return 0;  // overlong
    if (b0 == 0xF4 && at(1) > 0x8F) return 0;  // above U+10FFFF
    cp = (uint32_t(b0 & 0x07) << 18) | (uint32_t(at(1) & 0x3F) << 12) | (uint32_t(at(2) & 0x3F) << 6) |
         (at(3) & 0x3F);
    return 4;
  }
  return 0;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

bool utf8_is_valid(std::string_view s) {
  uint32_t cp = 0;
  for (size_t pos = 0; pos < s.size();) {
    const size_t len = utf8_decode(s, pos, cp);
    if (len == 0) return false;
    pos += len;
  }
  return true;
}

std::string utf8_sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  uint32_t cp = 0;
  for (size_t pos = 0; pos < s.size();) {
    const size_t len = utf8_decode(s, pos, cp);
    if (len == 0) {
      utf8_append(out, UNICODE_REPLACEMENT);
      pos += 1;
    } else {
      out.append(s.substr(pos, len));
      pos += len;
    }
  }
  return out;
}

size_t utf8_incomplete_tail(std::string_view s) {
  // Look back at most 3 bytes for a lead byte whose sequence would extend past the end, and check that what is
  // there so far could still complete into a valid sequence (so garbage is not held back forever).
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const uint8_t b = uint8_t(s[n - back]);
    if (is_continuation(b)) continue;
    size_t need = 0;
    if (b >= 0xC2 && b <= 0xDF) need = 2;
    else if (b >= 0xE0 && b <= 0xEF) need = 3;
    else if (b >= 0xF0 && b <= 0xF4) need = 4;
    if (need <= back) return 0;  // ASCII, invalid lead, or a sequence that is already complete
    if (back >= 2) {
      const uint8_t b1 = uint8_t(s[n - back + 1]);
      if ((b == 0xE0 && b1 < 0xA0) || (b == 0xED && b1 > 0x9F) || (b == 0xF0 && b1 < 0x90) ||
          (b == 0xF4 && b1 > 0x8F)) {
        return 0;
      }
    }
    return back;
  }
  return 0;
}

uint32_t byte_to_codepoint(uint8_t b) { return byte_map().to_cp[b]; }

std::optional<uint8_t> codepoint_to_byte(uint32_t cp) {
  if (cp >= byte_map().from_cp.size() || byte_map().from_cp[cp] < 0) return std::nullopt;
  return uint8_t(byte_map().from_cp[cp]);
}

void byte_level_encode_append(std::string& out, std::string_view bytes) {
  const ByteMap& map = byte_map();
  for (char c : bytes) {
    const uint8_t b = uint8_t(c);
    out.append(map.utf8[b].data(), map.utf8_len[b]);
  }
}

std::string byte_level_encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  byte_level_encode_append(out, bytes);
  return out;
}

std::string byte_level_decode(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  uint32_t cp = 0;
  for (size_t pos = 0; pos < text.size();) {
    const size_t len = utf8_decode(text, pos, cp);
    if (len == 0) {
      out += text[pos++];
      continue;
    }
    if (const std::optional<uint8_t> b = codepoint_to_byte(cp)) {
      out += char(*b);
    } else {
      out.append(text.substr(pos, len));
    }
    pos += len;
  }
  return out;
}

}  // namespace essaim

namespace essaim {

std::string utf8_nfc(std::string_view s) {
  // ASCII is its own NFC: skip the library (and its allocation) for the common case.
  if (std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; })) return std::string(s);
  utf8proc_uint8_t* out = nullptr;
  // An explicit length (no UTF8PROC_NULLTERM), so an embedded U+0000 is a character, not the end.
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), utf8proc_ssize_t(s.size()),
                                          &out, utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) return std::string(s);
  std::string result(reinterpret_cast<const char*>(out), size_t(n));
  std::free(out);
  return result;
}

}  // namespace essaim
