// Exact scalar conversions between binary32 and binary16 / bfloat16 (docs/reference.md 2.2).
//
//   uint16_t h = f32_to_f16(1.5f);  float f = f16_to_f32(h);   // f == 1.5f
//
// Software routines, bit-exact with F16C hardware on every non-NaN input; kernels may use F16C for speed
// and tests compare the two.
#pragma once

#include <cstdint>
#include <cstring>

namespace essaim {

inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float f32_from_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  if (exp == 0x1F) return f32_from_bits(sign | 0x7F800000u | (mant << 13));  // inf / NaN
  if (exp != 0) return f32_from_bits(sign | ((exp + 112) << 23) | (mant << 13));
  if (mant == 0) return f32_from_bits(sign);
  // Subnormal: normalise.
  int e = -1;
  do { ++e; mant <<= 1; } while ((mant & 0x400) == 0);
  mant &= 0x3FF;
  return f32_from_bits(sign | uint32_t(112 - e) << 23 | (mant << 13));
}

// Round to nearest even; overflow to inf; subnormals kept; NaN -> 0x7E00 | sign (as ggml's software path).
inline uint16_t f32_to_f16(float f) {
  const uint32_t x = f32_bits(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000);
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return sign | 0x7E00;          // NaN
  if (ax >= 0x477FF000u) return sign | 0x7C00;         // rounds to >= 65520 -> inf
  if (ax < 0x38800000u) {                              // result subnormal or zero (< 2^-14)
    if (ax < 0x33000000u) return sign;                 // < 2^-25 rounds to 0
    const uint32_t e = ax >> 23;
    const uint32_t mant = (ax & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - e;                    // 14 + 13 - (e - 127) ... total right shift
    const uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    uint32_t r = q + ((rem > half || (rem == half && (q & 1))) ? 1 : 0);
    return sign | uint16_t(r);
  }
  uint32_t r = ax - 0x38000000u;                       // rebias exponent 127 -> 15
  r = (r + 0xFFFu + ((r >> 13) & 1)) >> 13;            // round to nearest even
  return sign | uint16_t(r);
}

inline float bf16_to_f32(uint16_t h) { return f32_from_bits(uint32_t(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  const uint32_t x = f32_bits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((x >> 16) | 0x0040);
  return uint16_t((x + 0x7FFFu + ((x >> 16) & 1)) >> 16);
}

}  // namespace essaim
