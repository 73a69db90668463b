// The writer refuses what llama.cpp would refuse to load, and misuse of the streaming API, with a reason.
#include <filesystem>

#include "gguf_test_util.h"

namespace essaim {
namespace {

Status begin_with(GgufWriter& w) { return w.begin(test::temp_gguf_path("w")); }

void expect_refused(GgufWriter& w, const std::string& needle) {
  const Status s = begin_with(w);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
}

TEST(GgufWriter, RefusesInvalidDeclarations) {
  {
    GgufWriter w(48);
    expect_refused(w, "alignment 48 is not a non-zero power of two");
  }
  {
    GgufWriter w;
    w.add_tensor(std::string(64, 'n'), GgmlType::F32, {1});
    expect_refused(w, "name length 64");
  }
  {
    GgufWriter w;
    w.add_tensor("a", GgmlType::F32, {1});
    w.add_tensor("a", GgmlType::F32, {1});
    expect_refused(w, "duplicate tensor name");
  }
  {
    GgufWriter w;
    w.add_tensor("q", GgmlType::Q4_K, {128, 2});
    expect_refused(w, "ne[0] = 128 is not a multiple of the Q4_K block size 256");
  }
  {
    GgufWriter w;
    w.add_tensor("z", GgmlType::F32, {4, 0});
    expect_refused(w, "ne[1] = 0");
  }
  {
    GgufWriter w;
    w.add_tensor("d", GgmlType::F32, {1, 1, 1, 1, 1});
    expect_refused(w, "n_dims 5");
  }
  {
    GgufWriter w;
    w.add_tensor("r", GgmlType(4), {32});
    expect_refused(w, "removed ggml type");
  }
  {
    GgufWriter w;
    w.set_u32("", 1);
    expect_refused(w, "key is empty");
  }
  {
    GgufWriter w(64);
    w.set_u32("general.alignment", 32);
    expect_refused(w, "general.alignment must be UINT32 64");
  }
  {
    GgufWriter w;
    GgufValue nested;
    nested.type = GgufValueType::ARRAY;
    nested.elem_type = GgufValueType::ARRAY;
    w.set_value("n", nested);
    expect_refused(w, "invalid value type");
  }
}

TEST(GgufWriter, StreamingMisuseIsAnError) {
  GgufWriter w;
  w.add_tensor("a", GgmlType::F32, {2});
  const std::vector<uint8_t> eight(8, 1);
  EXPECT_FALSE(w.write_tensor_data(eight).is_ok());  // before begin()
  const std::string path = test::temp_gguf_path("misuse");
  ASSERT_TRUE(w.begin(path).is_ok());
  EXPECT_FALSE(w.begin(path).is_ok());
  ASSERT_TRUE(w.write_tensor_data(std::span(eight).first(5)).is_ok());
  const Status short_finish = w.finish();
  ASSERT_FALSE(short_finish.is_ok());
  EXPECT_NE(short_finish.message().find("got 5 of its 8 bytes"), std::string::npos) << short_finish.message();
  EXPECT_FALSE(std::filesystem::exists(path));  // no half-written file left behind

  GgufWriter over;
  over.add_tensor("a", GgmlType::F32, {1});
  ASSERT_TRUE(over.begin(path).is_ok());
  const Status s = over.write_tensor_data(eight);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("more tensor data than"), std::string::npos) << s.message();
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(GgufWriter, TensorNbytesFollowsTheBlockLayout) {
  GgufWriter w;
  w.add_tensor("f32", GgmlType::F32, {3, 5});
  w.add_tensor("q4k", GgmlType::Q4_K, {512, 3, 4});
  w.add_tensor("q6k", GgmlType::Q6_K, {256});
  w.add_tensor("bad", GgmlType::Q8_0, {31});
  ASSERT_EQ(w.tensor_count(), 4u);
  EXPECT_EQ(w.tensor_nbytes(0), 60u);
  EXPECT_EQ(w.tensor_nbytes(1), 2u * 144 * 3 * 4);
  EXPECT_EQ(w.tensor_nbytes(2), 210u);
  EXPECT_EQ(w.tensor_nbytes(3), 0u);  // invalid declaration: begin() says why
}

TEST(GgufWriter, UnwritablePathIsAnError) {
  GgufWriter w;
  const Status s = w.begin("/nonexistent-dir/x.gguf");
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("cannot create"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace essaim
