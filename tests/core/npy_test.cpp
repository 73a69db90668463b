#include "core/npy.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>

namespace essaim {
namespace {

std::string temp_path(const char* name) { return std::string(ESSAIM_BINARY_DIR) + "/" + name; }

std::vector<uint8_t> file_bytes(const std::string& path) {
  std::vector<uint8_t> b;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return b;
  int c;
  while ((c = std::fgetc(f)) != EOF) b.push_back(uint8_t(c));
  std::fclose(f);
  return b;
}

TEST(Npy, RoundTripKeepsShapeAndBits) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist;
  std::vector<float> v(5 * 13);
  for (float& x : v) x = dist(rng);
  ASSERT_NE(v[0], v[1]);  // the seeded input varies
  const std::string path = temp_path("npy_roundtrip.npy");
  ASSERT_TRUE(npy_write_f32(path, {5, 13}, v).is_ok());

  const std::vector<uint8_t> bytes = file_bytes(path);
  ASSERT_GT(bytes.size(), 64u);
  // v1.0 header, aligned so the payload starts on a 64-byte boundary, as numpy writes it.
  EXPECT_EQ(bytes[6], 1);
  EXPECT_EQ(bytes[7], 0);
  const size_t header_len = bytes[8] | bytes[9] << 8;
  EXPECT_EQ((10 + header_len) % 64, 0u);
  EXPECT_EQ(bytes[10 + header_len - 1], '\n');
  const std::string header(bytes.begin() + 10, bytes.begin() + 10 + header_len);
  EXPECT_NE(header.find("'descr': '<f4'"), std::string::npos);
  EXPECT_NE(header.find("'shape': (5, 13)"), std::string::npos);

  Result<NpyArray> r = npy_read_f32(path);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->shape, (std::vector<int64_t>{5, 13}));
  ASSERT_EQ(r->data.size(), v.size());
  EXPECT_EQ(std::memcmp(r->data.data(), v.data(), v.size() * 4), 0);
  std::remove(path.c_str());
}

TEST(Npy, OneDimensionalShapeHasTrailingComma) {
  const std::string path = temp_path("npy_1d.npy");
  std::vector<float> v{1.f, 2.f, 3.f};
  ASSERT_TRUE(npy_write_f32(path, {3}, v).is_ok());
  const std::vector<uint8_t> bytes = file_bytes(path);
  const std::string all(bytes.begin(), bytes.end());
  EXPECT_NE(all.find("'shape': (3,)"), std::string::npos);
  Result<NpyArray> r = npy_parse_f32(bytes);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->shape, std::vector<int64_t>{3});
  std::remove(path.c_str());
}

std::vector<uint8_t> make_npy(const std::string& dict, size_t payload_bytes) {
  std::vector<uint8_t> b = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  std::string h = dict;
  while ((10 + h.size() + 1) % 64) h += ' ';
  h += '\n';
  b.push_back(uint8_t(h.size() & 0xFF));
  b.push_back(uint8_t(h.size() >> 8));
  b.insert(b.end(), h.begin(), h.end());
  b.resize(b.size() + payload_bytes, 0);
  return b;
}

TEST(Npy, AcceptsKeysInAnyOrder) {
  auto b = make_npy("{'shape': (2, 2), 'fortran_order': False, 'descr': '<f4'}", 16);
  Result<NpyArray> r = npy_parse_f32(b);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->data.size(), 4u);
}

TEST(Npy, RefusesHostileHeaders) {
  struct Case { std::string dict; size_t payload; std::string needle; };
  const Case cases[] = {
      {"{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", 16, "dtype '<f8'"},
      {"{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", 8, "dtype '>f4'"},
      {"{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", 8, "Fortran"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", 8, "payload is 8 bytes"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999), }", 8, "larger than"},
      {"{'descr': '<f4', 'fortran_order': False, }", 8, "missing"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, }", 8, "shape"},
      {"{'descr': '<f4', 'fortran_order': maybe, 'shape': (2,), }", 8, "boolean"},
      {"[1, 2]", 8, "not a dictionary"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'extra': 1}", 8, "unexpected key 'extra'"},
  };
  for (const Case& c : cases) {
    Result<NpyArray> r = npy_parse_f32(make_npy(c.dict, c.payload));
    ASSERT_FALSE(r.is_ok()) << c.dict;
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos) << r.status().message();
  }
  // Bad magic, truncated header, unknown version.
  std::vector<uint8_t> b = make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 4);
  std::vector<uint8_t> bad = b;
  bad[1] = 'X';
  EXPECT_FALSE(npy_parse_f32(bad).is_ok());
  std::vector<uint8_t> truncated(b.begin(), b.begin() + 20);
  EXPECT_FALSE(npy_parse_f32(truncated).is_ok());
  std::vector<uint8_t> v9 = b;
  v9[6] = 9;
  EXPECT_FALSE(npy_parse_f32(v9).is_ok());
  EXPECT_FALSE(npy_parse_f32(std::span<const uint8_t>()).is_ok());
}

TEST(Npy, WriteRefusesMismatchedShape) {
  std::vector<float> v(5);
  EXPECT_FALSE(npy_write_f32(temp_path("npy_bad.npy"), {2, 3}, v).is_ok());
}

}  // namespace
}  // namespace essaim
