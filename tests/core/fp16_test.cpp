#include "core/fp16.h"

#include <gtest/gtest.h>
#include <immintrin.h>

#include <cpuid.h>

#include <cmath>

namespace essaim {
namespace {

// The software conversion must agree with F16C hardware on every non-NaN binary32 (strided sweep: every
// 13th bit pattern covers all exponents and rounding cases) and on every binary16 value.
// CPUID leaf 1, ECX bit 29 (clang 14's __builtin_cpu_supports does not know "f16c").
bool has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & (1u << 29)) != 0;
}

__attribute__((target("f16c"))) uint16_t hw_to_f16(float f) { return _cvtss_sh(f, 0); }
__attribute__((target("f16c"))) float hw_from_f16(uint16_t h) { return _cvtsh_ss(h); }

TEST(Fp16, MatchesF16cOnAllHalfValues) {
  if (!has_f16c()) GTEST_SKIP() << "no F16C";
  for (uint32_t h = 0; h < 65536; ++h) {
    if ((h & 0x7FFF) > 0x7C00) continue;  // NaN payloads differ by design
    ASSERT_EQ(f32_bits(f16_to_f32(uint16_t(h))), f32_bits(hw_from_f16(uint16_t(h)))) << h;
  }
}

TEST(Fp16, RoundingMatchesF16cOnStridedFloats) {
  if (!has_f16c()) GTEST_SKIP() << "no F16C";
  for (uint64_t u = 0; u < 0x100000000ull; u += 13) {
    const float f = f32_from_bits(uint32_t(u));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), hw_to_f16(f)) << std::hex << u;
  }
}

TEST(Fp16, NanAndBf16) {
  EXPECT_EQ(f32_to_f16(std::nanf("")), 0x7E00);
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0x3F808000)), 0x3F80);  // tie to even (down)
  EXPECT_EQ(f32_to_bf16(f32_from_bits(0x3F818000)), 0x3F82);  // tie to even (up)
  EXPECT_EQ(bf16_to_f32(0x3F80), 1.0f);
}

}  // namespace
}  // namespace essaim
