// Seeded random numbers for synthetic weights: SplitMix64 to derive independent stream seeds, xoshiro256**
// for the streams, and a Gaussian-ish variate built from integer arithmetic only.
//
//   SynthRng rng(synth_stream_seed(seed, synth_name_hash("blk.0.attn_q.weight"), row));
//   uint64_t bits = rng.next();           // 64 random bits
//   float g = rng.gaussian();             // mean 0, std 1, bounded at +-3.46
//
// Every weight row gets its own stream seeded from (seed, tensor name, row), so the bytes of a file depend on
// the seed only — not on the thread count, the chunking, or which other tensors the file holds. No libm call
// is involved (Irwin-Hall instead of Box-Muller), so the same seed gives the same bytes on every machine.
#pragma once

#include <cstdint>
#include <string_view>

namespace essaim {

inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// FNV-1a over the name: a stable identity for a tensor's random stream.
inline uint64_t synth_name_hash(std::string_view name) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001B3ull;
  return h;
}

inline uint64_t synth_stream_seed(uint64_t seed, uint64_t name_hash, uint64_t index) {
  uint64_t s = seed;
  const uint64_t a = splitmix64(s);
  s = a ^ name_hash;
  const uint64_t b = splitmix64(s);
  s = b + index * 0xD1B54A32D192ED03ull;
  return splitmix64(s);
}

class SynthRng {
 public:
  explicit SynthRng(uint64_t seed) {
    uint64_t sm = seed;
    for (uint64_t& w : s_) w = splitmix64(sm);
  }

  uint64_t next() {  // xoshiro256**
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, 1) with 24 bits: exact in binary32.
  float uniform() { return float(next() >> 40) * (1.0f / 16777216.0f); }

  // Uniform integer in [lo, hi] (hi - lo small; the modulo bias is irrelevant for weights).
  int32_t uniform_int(int32_t lo, int32_t hi) { return lo + int32_t(next() % uint64_t(hi - lo + 1)); }

  // Sum of four 16-bit uniforms, centred and scaled to unit variance (Irwin-Hall, n = 4).
  float gaussian() {
    const uint64_t r = next();
    const int64_t sum = int64_t(r & 0xFFFF) + int64_t((r >> 16) & 0xFFFF) + int64_t((r >> 32) & 0xFFFF) +
                        int64_t(r >> 48);
    // Mean 4 * 65535/2; std sqrt(4 * (65536^2 - 1) / 12) = 37837.23.
    return float(2 * sum - 4 * 65535) * (0.5f / 37837.227f);
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace essaim
