// Helpers shared by the GGUF tests: write a file with GgufWriter into memory, locate fields by the key or
// tensor name that precedes them, and patch bytes in place to build corrupt files.
//
//   std::vector<uint8_t> bytes = write_gguf(w, {tensor0_bytes, tensor1_bytes});
//   size_t at = after_name(bytes, "blk.0.ffn_up_exps.weight");   // the n_dims field of that tensor info
//   poke<uint32_t>(bytes, at, 5);                                 // n_dims = 5
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"

namespace essaim::test {

inline std::string temp_gguf_path(const std::string& stem) {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = std::string(info->test_suite_name()) + "_" + info->name() + "_" + stem + ".gguf";
  for (char& c : name)
    if (c == '/') c = '_';
  return ::testing::TempDir() + name;
}

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Writes the declared file with one data buffer per tensor and returns its bytes.
inline std::vector<uint8_t> write_gguf(GgufWriter& w, const std::vector<std::vector<uint8_t>>& data,
                                       const std::string& stem = "file") {
  const std::string path = temp_gguf_path(stem);
  Status s = w.begin(path);
  EXPECT_TRUE(s.is_ok()) << s.message();
  for (const auto& d : data) {
    s = w.write_tensor_data(d);
    EXPECT_TRUE(s.is_ok()) << s.message();
  }
  s = w.finish();
  EXPECT_TRUE(s.is_ok()) << s.message();
  std::vector<uint8_t> bytes = read_bytes(path);
  std::remove(path.c_str());
  return bytes;
}

template <typename T>
void poke(std::vector<uint8_t>& bytes, size_t at, T v) {
  ASSERT_LE(at + sizeof(T), bytes.size());
  std::memcpy(bytes.data() + at, &v, sizeof(T));
}

template <typename T>
T peek(const std::vector<uint8_t>& bytes, size_t at) {
  T v{};
  EXPECT_LE(at + sizeof(T), bytes.size());
  if (at + sizeof(T) <= bytes.size()) std::memcpy(&v, bytes.data() + at, sizeof(T));
  return v;
}

// Byte position of the u64 length prefix of the GGUF string `name` (first occurrence).
inline size_t string_at(const std::vector<uint8_t>& bytes, const std::string& name) {
  std::vector<uint8_t> needle;
  for (int k = 0; k < 8; ++k) needle.push_back(uint8_t(uint64_t(name.size()) >> (8 * k)));
  needle.insert(needle.end(), name.begin(), name.end());
  for (size_t i = 0; i + needle.size() <= bytes.size(); ++i)
    if (std::memcmp(bytes.data() + i, needle.data(), needle.size()) == 0) return i;
  ADD_FAILURE() << "string '" << name << "' not found";
  return 0;
}

// Byte position just after the GGUF string `name`: a KV's value type, or a tensor info's n_dims.
inline size_t after_name(const std::vector<uint8_t>& bytes, const std::string& name) {
  return string_at(bytes, name) + 8 + name.size();
}

inline Result<GgufFile> parse_bytes(const std::vector<uint8_t>& bytes) { return GgufFile::parse(bytes); }

// Deterministic filler so a tensor's bytes identify it.
inline std::vector<uint8_t> pattern_bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t(seed * 31 + i * 7 + (i >> 8));
  return v;
}

}  // namespace essaim::test
