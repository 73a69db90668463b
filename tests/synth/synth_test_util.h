// Helpers shared by the synth tests: a scratch directory, writing a synthetic file, reading files back, and
// dequantisers written straight from docs/reference.md 2.4 (independent of the kernels layer and of synth).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/fp16.h"
#include "gguf/gguf_file.h"
#include "synth/synth.h"
#include "temp_dir.h"

namespace essaim::synth_test {

// One directory per test process, removed when the process's tests end (synth_format_test.cpp registers
// the cleanup).
inline std::filesystem::path scratch_path() {
  static const std::filesystem::path dir = essaim::testing::make_temp_dir("essaim_synth_test");
  return dir;
}

inline std::filesystem::path scratch_dir() {
  const std::filesystem::path dir = scratch_path();
  std::filesystem::create_directories(dir);
  return dir;
}

inline std::string scratch_file(const std::string& name) { return (scratch_dir() / name).string(); }

// Plans and writes; fails the test on any error.
inline SynthPlan write_model(const SynthOptions& o, const std::string& path) {
  Result<SynthPlan> plan = synth_plan(o);
  EXPECT_TRUE(plan.is_ok()) << plan.status().message();
  if (!plan) return {};
  Result<SynthSummary> s = synth_write(*plan, path);
  EXPECT_TRUE(s.is_ok()) << s.status().message();
  return std::move(plan).value();
}

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// docs/reference.md 2.4, Q4_K: 144-byte blocks of 256 values.
inline void dequant_q4_k(const uint8_t* b, float* out) {
  uint16_t dh, mh;
  std::memcpy(&dh, b, 2);
  std::memcpy(&mh, b + 2, 2);
  const float d = f16_to_f32(dh), dmin = f16_to_f32(mh);
  const uint8_t* S = b + 4;
  const uint8_t* qs = b + 16;
  int sc[8], m[8];
  for (int j = 0; j < 4; ++j) {
    sc[j] = S[j] & 63;
    m[j] = S[j + 4] & 63;
  }
  for (int j = 4; j < 8; ++j) {
    sc[j] = (S[j + 4] & 0x0F) | ((S[j - 4] >> 6) << 4);
    m[j] = (S[j + 4] >> 4) | ((S[j] >> 6) << 4);
  }
  for (int e = 0; e < 256; ++e) {
    const int j = e / 64, t = (e / 32) % 2, l = e % 32, s = e / 32;
    const int q = t == 0 ? (qs[32 * j + l] & 0xF) : (qs[32 * j + l] >> 4);
    out[e] = (d * float(sc[s])) * float(q) - dmin * float(m[s]);
  }
}

// docs/reference.md 2.4, Q6_K: 210-byte blocks, d last.
inline void dequant_q6_k(const uint8_t* b, float* out) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
  uint16_t dh;
  std::memcpy(&dh, b + 208, 2);
  const float d = f16_to_f32(dh);
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, c = (e % 128) / 32, l = e % 32;
    const uint8_t lb = ql[64 * h + 32 * (c & 1) + l];
    const int low4 = c < 2 ? (lb & 0xF) : (lb >> 4);
    const int hi2 = (qh[32 * h + l] >> (2 * c)) & 3;
    const int q = (low4 | (hi2 << 4)) - 32;
    out[e] = d * float(scales[e / 16]) * float(q);
  }
}

// All values of a tensor as f32 (F32, Q4_K, Q6_K).
inline std::vector<float> tensor_values(const GgufTensor& t) {
  std::vector<float> v(t.nelements());
  if (t.type == GgmlType::F32) {
    std::memcpy(v.data(), t.data, t.nbytes);
  } else if (t.type == GgmlType::Q4_K) {
    for (uint64_t b = 0; b < t.nbytes / 144; ++b) dequant_q4_k(t.data + 144 * b, v.data() + 256 * b);
  } else if (t.type == GgmlType::Q6_K) {
    for (uint64_t b = 0; b < t.nbytes / 210; ++b) dequant_q6_k(t.data + 210 * b, v.data() + 256 * b);
  } else {
    ADD_FAILURE() << t.name << ": unexpected type " << int(t.type);
  }
  return v;
}

}  // namespace essaim::synth_test
