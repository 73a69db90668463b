#include "text/byte_unicode.h"

#include <gtest/gtest.h>

#include <random>
#include <set>

namespace essaim {
namespace {

TEST(ByteMap, MatchesReference72) {
  EXPECT_EQ(byte_to_codepoint(0x20), 0x120u);  // "Ġ"
  EXPECT_EQ(byte_to_codepoint(0x0A), 0x10Au);  // "Ċ"
  EXPECT_EQ(byte_to_codepoint(0x00), 0x100u);
  EXPECT_EQ(byte_to_codepoint(0x7F), 0x121u);
  EXPECT_EQ(byte_to_codepoint(0xA0), 0x142u);
  EXPECT_EQ(byte_to_codepoint(0xAD), 0x143u);
  EXPECT_EQ(byte_to_codepoint('A'), uint32_t('A'));
  EXPECT_EQ(byte_to_codepoint(0xE9), 0xE9u);
  std::set<uint32_t> images;
  for (int b = 0; b < 256; ++b) {
    const uint32_t cp = byte_to_codepoint(uint8_t(b));
    images.insert(cp);
    ASSERT_EQ(codepoint_to_byte(cp), std::optional<uint8_t>(uint8_t(b))) << b;
  }
  EXPECT_EQ(images.size(), 256u);
  EXPECT_FALSE(codepoint_to_byte(0x144).has_value());
  EXPECT_FALSE(codepoint_to_byte(0x20).has_value());  // space itself is not an image
}

TEST(ByteMap, EncodeDecodeRoundTripsEveryByte) {
  std::string all;
  for (int b = 0; b < 256; ++b) all += char(b);
  const std::string encoded = byte_level_encode(all);
  EXPECT_TRUE(utf8_is_valid(encoded));
  EXPECT_EQ(byte_level_decode(encoded), all);
  EXPECT_EQ(byte_level_encode(" hello\n"), "\xC4\xA0hello\xC4\x8A");  // "Ġhello Ċ"
}

TEST(Utf8, DecodeIsStrict) {
  uint32_t cp = 0;
  EXPECT_EQ(utf8_decode("a", 0, cp), 1u);
  EXPECT_EQ(cp, uint32_t('a'));
  EXPECT_EQ(utf8_decode("\xC3\xA9", 0, cp), 2u);
  EXPECT_EQ(cp, 0xE9u);
  EXPECT_EQ(utf8_decode("\xE4\xB8\xAD", 0, cp), 3u);
  EXPECT_EQ(cp, 0x4E2Du);
  EXPECT_EQ(utf8_decode("\xF0\x9F\xA4\x97", 0, cp), 4u);
  EXPECT_EQ(cp, 0x1F917u);
  EXPECT_EQ(utf8_decode("\xF4\x8F\xBF\xBF", 0, cp), 4u);
  EXPECT_EQ(cp, 0x10FFFFu);
  for (const char* bad : {"\xC0\x80", "\xC1\xBF", "\xE0\x80\x80", "\xF0\x80\x80\x80",  // overlong
                          "\xED\xA0\x80",                                              // surrogate
                          "\xF4\x90\x80\x80", "\xF5\x80\x80\x80", "\xFF",              // too big / never valid
                          "\x80", "\xC3", "\xE4\xB8", "\xF0\x9F\xA4", "\xC3\x41"}) {   // stray / truncated
    EXPECT_EQ(utf8_decode(bad, 0, cp), 0u) << testing::PrintToString(std::string(bad));
  }
}

TEST(Utf8, SanitizeReplacesEachBadByte) {
  EXPECT_EQ(utf8_sanitize("caf\xC3\xA9"), "caf\xC3\xA9");
  EXPECT_EQ(utf8_sanitize("a\xE2\x82" "b"), "a\xEF\xBF\xBD\xEF\xBF\xBD" "b");
  EXPECT_EQ(utf8_sanitize("\xF0\x9F\x98"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(utf8_sanitize("\xC0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(utf8_sanitize(std::string("x\0y", 3)), std::string("x\0y", 3));
}

TEST(Utf8, SanitizedRandomBytesAreValid) {
  std::mt19937 rng(7);
  size_t changed = 0;
  for (int trial = 0; trial < 200; ++trial) {
    std::string s;
    for (int i = 0; i < 64; ++i) s += char(rng() & 0xFF);
    const std::string clean = utf8_sanitize(s);
    ASSERT_TRUE(utf8_is_valid(clean));
    changed += clean != s;
  }
  EXPECT_GT(changed, 150u);  // the inputs really were mostly invalid
}

TEST(Utf8, IncompleteTailHoldsOnlyCompletablePrefixes) {
  EXPECT_EQ(utf8_incomplete_tail(""), 0u);
  EXPECT_EQ(utf8_incomplete_tail("abc"), 0u);
  EXPECT_EQ(utf8_incomplete_tail("a\xC3"), 1u);
  EXPECT_EQ(utf8_incomplete_tail("a\xE4\xB8"), 2u);
  EXPECT_EQ(utf8_incomplete_tail("a\xF0\x9F\xA4"), 3u);
  EXPECT_EQ(utf8_incomplete_tail("\xF0\x9F\xA4\x97"), 0u);  // complete
  EXPECT_EQ(utf8_incomplete_tail("\xE0\x80"), 0u);          // overlong: can never complete
  EXPECT_EQ(utf8_incomplete_tail("\xED\xA0"), 0u);          // surrogate
  EXPECT_EQ(utf8_incomplete_tail("\x80"), 0u);              // stray continuation
  EXPECT_EQ(utf8_incomplete_tail("\xFF"), 0u);
}

}  // namespace
}  // namespace essaim
