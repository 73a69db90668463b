// UTF-8 handling and the GPT-2 byte <-> code point map (docs/reference.md 7.2, 7.3a) that byte-level BPE is built on.
//
//   std::string clean = utf8_sanitize("caf\xC3");          // "caf\uFFFD": every bad byte becomes U+FFFD
//   std::string word  = byte_level_encode(" hello");        // "Ġhello" (space 0x20 -> U+0120)
//   std::string raw   = byte_level_decode(word);            // " hello"
//
// UTF-8 validity is strict (no overlong forms, no surrogates, nothing above U+10FFFF). llama.cpp's decoder only
// checks the lead/continuation bit patterns, so it accepts overlong forms such as C0 80; we replace those byte by
// byte instead, which keeps every string handed to PCRE2 valid (docs/text.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace essaim {

inline constexpr uint32_t UNICODE_REPLACEMENT = 0xFFFD;

// Decodes the UTF-8 sequence starting at s[pos]. Returns its length (1..4) and stores the code point, or returns
// 0 when s[pos] cannot start a complete, valid sequence (truncated, bad continuation, overlong, surrogate, too big).
size_t utf8_decode(std::string_view s, size_t pos, uint32_t& cp);

// Appends the UTF-8 encoding of cp (cp must be a Unicode scalar value).
void utf8_append(std::string& out, uint32_t cp);

// True when s is entirely valid UTF-8.
bool utf8_is_valid(std::string_view s);

// s with every byte that cannot start a valid sequence replaced by U+FFFD (one per byte, as llama.cpp does).
std::string utf8_sanitize(std::string_view s);
// Unicode Normalization Form C (canonical composition, utf8proc) of valid UTF-8: "e\u0301" -> "\u00e9". ASCII and
// already-composed text come back unchanged; invalid input comes back as it is (sanitise first).
std::string utf8_nfc(std::string_view s);

// Length of the trailing bytes of s that form a proper prefix of a valid multi-byte sequence (0..3): the bytes a
// streaming decoder must hold back until the next piece arrives.
size_t utf8_incomplete_tail(std::string_view s);

// The code point that represents byte b in byte-level text, and its inverse (nullopt outside the 256 images).
uint32_t byte_to_codepoint(uint8_t b);
std::optional<uint8_t> codepoint_to_byte(uint32_t cp);

// Raw bytes -> byte-level text (UTF-8 of one mapped code point per byte).
std::string byte_level_encode(std::string_view bytes);
void byte_level_encode_append(std::string& out, std::string_view bytes);

// Byte-level text -> raw bytes. A code point outside the map (only in hand-made vocabularies) is copied as its
// own UTF-8; invalid UTF-8 in the text is copied byte by byte.
std::string byte_level_decode(std::string_view text);

}  // namespace essaim
