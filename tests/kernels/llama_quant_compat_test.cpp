// Our reference quantisers write llama.cpp's bytes: the fixtures hold the same weights twice, as F32 and
// as llama.cpp quantised them (experts Q4_K, other 2-D weights Q8_0; ../shared/fixtures/README.md).
// Quantising every F32 row ourselves must reproduce every quantised byte.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "gguf/gguf_file.h"
#include "kernels/kernel_traits.h"
#include "kernels/quantize.h"

namespace essaim {
namespace {

struct Tally {
  int tensors = 0;
  uint64_t rows = 0;
  uint64_t q4k_rows = 0, q8_0_rows = 0;
};

void check_pair(const std::string& f32_name, const std::string& q_name, Tally* tally) {
  const std::string dir = ESSAIM_FIXTURES_DIR;
  Result<GgufFile> f32 = GgufFile::open(dir + "/" + f32_name);
  Result<GgufFile> q = GgufFile::open(dir + "/" + q_name);
  ASSERT_TRUE(f32.is_ok()) << f32.status().message();
  ASSERT_TRUE(q.is_ok()) << q.status().message();
  for (const GgufTensor& qt : q->tensors()) {
    SCOPED_TRACE(q_name + ": " + qt.name);
    const GgufTensor* ft = f32->find_tensor(qt.name);
    ASSERT_NE(ft, nullptr);
    ASSERT_EQ(ft->type, GgmlType::F32);
    ASSERT_EQ(ft->ne, qt.ne);
    if (qt.type == GgmlType::F32) {  // kept as is by the quantiser
      ASSERT_EQ(qt.nbytes, ft->nbytes);
      EXPECT_EQ(std::memcmp(qt.data, ft->data, qt.nbytes), 0);
      continue;
    }
    ASSERT_TRUE(kernel_type_supported(qt.type)) << type_name(qt.type);
    const int64_t cols = qt.ne[0];
    const uint64_t n_rows = qt.nelements() / uint64_t(cols);
    const uint64_t row_bytes = kernel_traits(qt.type)->row_bytes(cols);
    ASSERT_EQ(row_bytes * n_rows, qt.nbytes);
    std::vector<float> x(static_cast<size_t>(cols));
    std::vector<uint8_t> mine(row_bytes);
    uint64_t bad_rows = 0;
    for (uint64_t r = 0; r < n_rows; ++r) {
      std::memcpy(x.data(), ft->data + r * uint64_t(cols) * 4, size_t(cols) * 4);
      quantize_row(qt.type, x.data(), mine.data(), cols);
      if (std::memcmp(mine.data(), qt.data + r * row_bytes, row_bytes) != 0) {
        if (bad_rows == 0) {
          for (uint64_t i = 0; i < row_bytes; ++i)
            if (mine[i] != qt.data[r * row_bytes + i]) {
              ADD_FAILURE() << "row " << r << " first differs at byte " << i << ": ours " << int(mine[i])
                            << ", llama.cpp " << int(qt.data[r * row_bytes + i]);
              break;
            }
        }
        ++bad_rows;
      }
    }
    EXPECT_EQ(bad_rows, 0u) << "of " << n_rows << " rows";
    ++tally->tensors;
    tally->rows += n_rows;
    if (qt.type == GgmlType::Q4_K) tally->q4k_rows += n_rows;
    if (qt.type == GgmlType::Q8_0) tally->q8_0_rows += n_rows;
  }
}

TEST(LlamaCompat, Qwen3MoeQuantisedBytesAreReproduced) {
  Tally t;
  check_pair("qwen3moe-small-f32.gguf", "qwen3moe-small-q4k.gguf", &t);
  EXPECT_GT(t.q4k_rows, 0u);
  EXPECT_GT(t.q8_0_rows, 0u);
  RecordProperty("tensors", t.tensors);
  RecordProperty("rows", std::to_string(t.rows));
}

TEST(LlamaCompat, Qwen35MoeQuantisedBytesAreReproduced) {
  Tally t;
  check_pair("qwen35moe-small-f32.gguf", "qwen35moe-small-q4k.gguf", &t);
  EXPECT_GT(t.q4k_rows, 0u);
  EXPECT_GT(t.q8_0_rows, 0u);
  RecordProperty("tensors", t.tensors);
  RecordProperty("rows", std::to_string(t.rows));
}

}  // namespace
}  // namespace essaim
