// Writer -> reader round trips: every metadata type, every array element type, tensor data and expert
// slab views, alignment variants, and the exact byte layout llama.cpp expects (docs/reference.md 1.2-1.9).
#include <cmath>
#include <limits>
#include <random>

#include "gguf/gguf_layout.h"
#include "gguf_test_util.h"

namespace essaim {
namespace {

using test::after_name;
using test::parse_bytes;
using test::pattern_bytes;
using test::peek;
using test::poke;
using test::write_gguf;

TEST(GgufRoundTrip, EveryScalarType) {
  GgufWriter w;
  w.set_u8("u8", 250);
  w.set_i8("i8", -128);
  w.set_u16("u16", 65535);
  w.set_i16("i16", -32768);
  w.set_u32("u32", 4000000000u);
  w.set_i32("i32", std::numeric_limits<int32_t>::min());
  w.set_u64("u64", std::numeric_limits<uint64_t>::max());
  w.set_i64("i64", std::numeric_limits<int64_t>::min());
  w.set_f32("f32", 1e-6f);
  w.set_f64("f64", -1.0 / 3.0);
  w.set_bool("bool_t", true);
  w.set_bool("bool_f", false);
  w.set_string("str", std::string("h\xC3\xA9llo\0w", 8));
  w.set_string("empty", "");
  const std::vector<uint8_t> bytes = write_gguf(w, {});
  Result<GgufFile> f = parse_bytes(bytes);
  ASSERT_TRUE(f) << f.status().message();
  EXPECT_EQ(f->kvs().size(), 14u);
  EXPECT_EQ(f->find_kv("u8")->type, GgufValueType::UINT8);
  EXPECT_EQ(f->find_kv("u8")->u, 250u);
  EXPECT_EQ(f->find_kv("i8")->i, -128);
  EXPECT_EQ(f->find_kv("u16")->u, 65535u);
  EXPECT_EQ(f->find_kv("i16")->type, GgufValueType::INT16);
  EXPECT_EQ(f->find_kv("i16")->i, -32768);
  EXPECT_EQ(*f->get_u32("u32"), 4000000000u);
  EXPECT_EQ(*f->get_i32("i32"), std::numeric_limits<int32_t>::min());
  EXPECT_EQ(*f->get_u64("u64"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(f->find_kv("i64")->i, std::numeric_limits<int64_t>::min());
  EXPECT_EQ(*f->get_f32("f32"), 1e-6f);
  EXPECT_EQ(f->find_kv("f64")->f, -1.0 / 3.0);
  EXPECT_EQ(*f->get_bool("bool_t"), true);
  EXPECT_EQ(*f->get_bool("bool_f"), false);
  EXPECT_EQ(*f->get_string("str"), std::string("h\xC3\xA9llo\0w", 8));
  EXPECT_EQ(*f->get_string("empty"), "");
  // Keys keep their file order.
  EXPECT_EQ(f->kvs().front().key, "u8");
  EXPECT_EQ(f->kvs().back().key, "empty");
}

TEST(GgufRoundTrip, TypedGettersAreStrict) {
  GgufWriter w;
  w.set_i32("n", 7);
  w.set_array_i32("ints", {1, 2});
  const std::vector<uint8_t> bytes = write_gguf(w, {});
  Result<GgufFile> f = parse_bytes(bytes);
  ASSERT_TRUE(f) << f.status().message();
  EXPECT_FALSE(f->get_u32("n").has_value());  // an i32 key is not a u32 key
  EXPECT_EQ(*f->get_i32("n"), 7);
  EXPECT_FALSE(f->get_u32("absent").has_value());
  EXPECT_EQ(f->get_string_array("ints"), nullptr);  // never reinterpreted as strings
  EXPECT_FALSE(f->get_string("ints").has_value());
}

TEST(GgufRoundTrip, EveryArrayElementType) {
  const std::vector<GgufValueType> types = {
      GgufValueType::UINT8,  GgufValueType::INT8,   GgufValueType::UINT16, GgufValueType::INT16,
      GgufValueType::UINT32, GgufValueType::INT32,  GgufValueType::FLOAT32, GgufValueType::BOOL,
      GgufValueType::STRING, GgufValueType::UINT64, GgufValueType::INT64,  GgufValueType::FLOAT64};
  std::mt19937_64 rng(42);
  GgufWriter w;
  std::vector<GgufValue> written;
  for (GgufValueType t : types) {
    GgufValue v;
    v.type = GgufValueType::ARRAY;
    v.elem_type = t;
    const size_t n = 1 + rng() % 40;
    for (size_t k = 0; k < n; ++k) {
      const uint64_t r = rng();
      switch (t) {
        case GgufValueType::UINT8: v.uints.push_back(uint8_t(r)); break;
        case GgufValueType::UINT16: v.uints.push_back(uint16_t(r)); break;
        case GgufValueType::UINT32: v.uints.push_back(uint32_t(r)); break;
        case GgufValueType::UINT64: v.uints.push_back(r); break;
        case GgufValueType::BOOL: v.uints.push_back(r & 1); break;
        case GgufValueType::INT8: v.ints.push_back(int8_t(r)); break;
        case GgufValueType::INT16: v.ints.push_back(int16_t(r)); break;
        case GgufValueType::INT32: v.ints.push_back(int32_t(r)); break;
        case GgufValueType::INT64: v.ints.push_back(int64_t(r)); break;
        case GgufValueType::FLOAT32: v.floats.push_back(double(float(int32_t(r)) / 7.0f)); break;
        case GgufValueType::FLOAT64: v.floats.push_back(double(int64_t(r)) / 3.0); break;
        case GgufValueType::STRING: v.strs.push_back(std::string(r % 9, char('a' + r % 26))); break;
        default: FAIL();
      }
    }
    w.set_value("arr." + std::string(gguf_value_type_name(t)), v);
    written.push_back(v);
  }
  GgufValue empty;
  empty.type = GgufValueType::ARRAY;
  empty.elem_type = GgufValueType::STRING;
  w.set_value("arr.empty", empty);
  const std::vector<uint8_t> bytes = write_gguf(w, {});
  Result<GgufFile> f = parse_bytes(bytes);
  ASSERT_TRUE(f) << f.status().message();
  for (size_t i = 0; i < types.size(); ++i) {
    SCOPED_TRACE(gguf_value_type_name(types[i]));
    const GgufValue* v = f->find_kv("arr." + std::string(gguf_value_type_name(types[i])));
    ASSERT_NE(v, nullptr);
    EXPECT_EQ(v->type, GgufValueType::ARRAY);
    EXPECT_EQ(v->elem_type, types[i]);
    EXPECT_EQ(v->array_size(), written[i].array_size());
    EXPECT_EQ(v->uints, written[i].uints);
    EXPECT_EQ(v->ints, written[i].ints);
    EXPECT_EQ(v->floats, written[i].floats);
    EXPECT_EQ(v->strs, written[i].strs);
  }
  EXPECT_EQ(f->find_kv("arr.empty")->array_size(), 0u);
  ASSERT_NE(f->get_string_array("arr.STRING"), nullptr);
  EXPECT_EQ(*f->get_string_array("arr.STRING"), written[8].strs);
}

TEST(GgufRoundTrip, WriterHelpersAndReplacement) {
  GgufWriter w;
  w.set_u32("a", 1);
  w.set_string("b", "x");
  w.set_u32("a", 2);  // replaces, keeps position
  w.set_array_u32("u", {1, 4000000000u});
  w.set_array_f32("f", {0.5f, -2.25f});
  w.set_array_bool("bits", {true, false, true});
  w.set_array_string("s", {"", "tok"});
  const std::vector<uint8_t> bytes = write_gguf(w, {});
  Result<GgufFile> f = parse_bytes(bytes);
  ASSERT_TRUE(f) << f.status().message();
  ASSERT_EQ(f->kvs().size(), 6u);
  EXPECT_EQ(f->kvs()[0].key, "a");
  EXPECT_EQ(*f->get_u32("a"), 2u);
  EXPECT_EQ(f->find_kv("u")->uints, (std::vector<uint64_t>{1, 4000000000u}));
  EXPECT_EQ(f->find_kv("f")->floats, (std::vector<double>{0.5, -2.25}));
  EXPECT_EQ(f->find_kv("bits")->elem_type, GgufValueType::BOOL);
  EXPECT_EQ(f->find_kv("bits")->uints, (std::vector<uint64_t>{1, 0, 1}));
  EXPECT_EQ(*f->get_string_array("s"), (std::vector<std::string>{"", "tok"}));
}

// Three tensors of different types, one of them a 3-D expert tensor.
struct MoeFile {
  std::vector<std::vector<uint8_t>> data;
  std::vector<uint8_t> bytes;
};

MoeFile write_moe_file(uint32_t alignment, bool split_writes = false) {
  GgufWriter w(alignment);
  w.set_string("general.architecture", "qwen3moe");
  w.add_tensor("token_embd.weight", GgmlType::F32, {6, 3});                    // 72 bytes
  w.add_tensor("blk.0.ffn_up_exps.weight", GgmlType::Q8_0, {64, 3, 5});        // 5 experts x 204 bytes
  w.add_tensor("blk.0.ffn_down_exps.weight", GgmlType::Q4_K, {256, 2, 4, 1});  // trailing 1 kept
  MoeFile m;
  for (size_t i = 0; i < w.tensor_count(); ++i) m.data.push_back(pattern_bytes(w.tensor_nbytes(i), uint8_t(i + 1)));
  if (!split_writes) {
    m.bytes = write_gguf(w, m.data);
    return m;
  }
  // The same data fed in odd-sized pieces that straddle tensor boundaries.
  std::vector<uint8_t> all;
  for (const auto& d : m.data) all.insert(all.end(), d.begin(), d.end());
  const std::string path = test::temp_gguf_path("split");
  EXPECT_TRUE(w.begin(path).is_ok());
  for (size_t at = 0; at < all.size(); at += 37)
    EXPECT_TRUE(w.write_tensor_data(std::span(all).subspan(at, std::min<size_t>(37, all.size() - at))).is_ok());
  EXPECT_TRUE(w.finish().is_ok());
  m.bytes = test::read_bytes(path);
  std::remove(path.c_str());
  return m;
}

TEST(GgufRoundTrip, TensorViewsAndExpertSlabs) {
  const MoeFile m = write_moe_file(32);
  Result<GgufFile> f = parse_bytes(m.bytes);
  ASSERT_TRUE(f) << f.status().message();
  ASSERT_EQ(f->tensors().size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const GgufTensor& t = f->tensors()[i];
    EXPECT_EQ(std::vector<uint8_t>(t.bytes().begin(), t.bytes().end()), m.data[i]) << t.name;
    EXPECT_EQ(t.data, m.bytes.data() + t.file_offset);  // a view into the caller's bytes, not a copy
  }
  const GgufTensor* up = f->find_tensor("blk.0.ffn_up_exps.weight");
  ASSERT_NE(up, nullptr);
  EXPECT_EQ(up->type, GgmlType::Q8_0);
  EXPECT_EQ(up->n_dims, 3u);
  EXPECT_EQ(up->row_bytes(), 2u * 34);
  EXPECT_EQ(up->expert_slab_bytes(), 3u * 2 * 34);
  for (int64_t e = 0; e < 5; ++e) {
    std::span<const uint8_t> slab = up->expert_slab(e);
    ASSERT_EQ(slab.size(), 204u);
    EXPECT_EQ(slab.data(), up->data + e * 204);
    EXPECT_TRUE(std::equal(slab.begin(), slab.end(), m.data[1].begin() + e * 204));
  }
  const GgufTensor* down = f->find_tensor("blk.0.ffn_down_exps.weight");
  EXPECT_EQ(down->n_dims, 4u);
  EXPECT_EQ(down->nbytes, 144u * 2 * 4);
  EXPECT_EQ(down->expert_slab(3).size(), 288u);
  EXPECT_EQ(f->find_tensor("missing"), nullptr);
}

TEST(GgufRoundTrip, SplitWritesProduceIdenticalFiles) {
  EXPECT_EQ(write_moe_file(32).bytes, write_moe_file(32, /*split_writes=*/true).bytes);
}

// docs/reference.md 1.9: infos, zero pad to alignment, then per tensor data + zero pad (the last one included),
// offsets the padded running sum; general.alignment (UINT32) only when not 32.
TEST(GgufRoundTrip, ExactLayoutForEveryAlignment) {
  for (uint32_t alignment : {1u, 8u, 32u, 64u, 4096u}) {
    SCOPED_TRACE(alignment);
    const MoeFile m = write_moe_file(alignment);
    Result<GgufFile> f = parse_bytes(m.bytes);
    ASSERT_TRUE(f) << f.status().message();
    EXPECT_EQ(f->alignment(), alignment);
    const GgufValue* a = f->find_kv("general.alignment");
    if (alignment == 32) {
      EXPECT_EQ(a, nullptr);
    } else {
      ASSERT_NE(a, nullptr);
      EXPECT_EQ(a->type, GgufValueType::UINT32);
      EXPECT_EQ(a->u, alignment);
    }
    EXPECT_EQ(f->data_start() % alignment, 0u);
    uint64_t running = 0;
    for (const GgufTensor& t : f->tensors()) {
      EXPECT_EQ(t.offset, running) << t.name;
      EXPECT_EQ(t.file_offset % alignment, 0u);
      uint64_t padded = 0;
      ASSERT_TRUE(gguf_align_up(t.nbytes, alignment, &padded));
      for (uint64_t k = t.file_offset + t.nbytes; k < t.file_offset + padded; ++k) ASSERT_EQ(m.bytes[k], 0) << k;
      running += padded;
    }
    EXPECT_EQ(m.bytes.size(), f->data_start() + running);  // padding after the last tensor too
    // Padding between the infos and the data is zero as well.
    const GgufTensor& last = f->tensors().back();
    const size_t infos_end = after_name(m.bytes, last.name) + 4 + 8 * last.n_dims + 4 + 8;
    for (size_t k = infos_end; k < f->data_start(); ++k) ASSERT_EQ(m.bytes[k], 0) << k;
    EXPECT_EQ(f->data_start(), (infos_end + alignment - 1) / alignment * alignment);
  }
}

// The header and one KV and one tensor info, encoded by hand from docs/reference.md 1.2-1.4.
TEST(GgufRoundTrip, HeaderBytesMatchTheSpecByHand) {
  GgufWriter w;
  w.set_u32("k", 9);
  w.add_tensor("t", GgmlType::Q8_0, {32});
  const std::vector<uint8_t> bytes = write_gguf(w, {pattern_bytes(34, 1)});
  std::vector<uint8_t> expect = {'G', 'G', 'U', 'F', 3, 0, 0, 0};
  auto u64 = [&](uint64_t v) { for (int k = 0; k < 8; ++k) expect.push_back(uint8_t(v >> (8 * k))); };
  auto u32 = [&](uint32_t v) { for (int k = 0; k < 4; ++k) expect.push_back(uint8_t(v >> (8 * k))); };
  u64(1);  // tensor_count before kv_count
  u64(1);
  u64(1), expect.push_back('k'), u32(4), u32(9);                       // key, UINT32, 9
  u64(1), expect.push_back('t'), u32(1), u64(32), u32(8), u64(0);      // name, n_dims, ne, Q8_0, offset
  while (expect.size() % 32) expect.push_back(0);
  const std::vector<uint8_t> data = pattern_bytes(34, 1);
  expect.insert(expect.end(), data.begin(), data.end());
  while (expect.size() % 32) expect.push_back(0);
  EXPECT_EQ(bytes, expect);
}

TEST(GgufRoundTrip, AcceptsVersion2AndHeaderOnlyFiles) {
  GgufWriter w;
  w.set_u32("k", 1);
  std::vector<uint8_t> bytes = write_gguf(w, {});
  poke<uint32_t>(bytes, 4, 2);
  Result<GgufFile> v2 = parse_bytes(bytes);
  ASSERT_TRUE(v2) << v2.status().message();
  EXPECT_EQ(v2->version(), 2u);

  // llama.cpp's HANDCRAFTED_HEADER_EMPTY: 24 bytes, no KVs, no tensors (with and without padding).
  GgufWriter empty;
  std::vector<uint8_t> e = write_gguf(empty, {});
  EXPECT_EQ(e.size(), 32u);
  ASSERT_TRUE(parse_bytes(e));
  e.resize(24);
  Result<GgufFile> bare = parse_bytes(e);
  ASSERT_TRUE(bare) << bare.status().message();
  EXPECT_EQ(bare->kvs().size(), 0u);
  EXPECT_EQ(bare->tensors().size(), 0u);
}

TEST(GgufRoundTrip, FinalPaddingOfTheLastTensorMayBeAbsent) {
  GgufWriter w;
  w.add_tensor("t", GgmlType::F32, {3});
  std::vector<uint8_t> bytes = write_gguf(w, {pattern_bytes(12, 2)});
  bytes.resize(bytes.size() - 20);  // llama.cpp's loader only needs data_start + offset + nbytes
  ASSERT_TRUE(parse_bytes(bytes));
  bytes.pop_back();
  EXPECT_FALSE(parse_bytes(bytes));
}

TEST(GgufRoundTrip, BoolBytesAreNormalised) {
  GgufWriter w;
  w.set_bool("b", true);
  w.set_array_bool("bs", {false, true});
  std::vector<uint8_t> bytes = write_gguf(w, {});
  poke<uint8_t>(bytes, after_name(bytes, "b") + 4, 0x7f);
  poke<uint8_t>(bytes, after_name(bytes, "bs") + 4 + 4 + 8 + 1, 0xff);
  Result<GgufFile> f = parse_bytes(bytes);
  ASSERT_TRUE(f) << f.status().message();
  EXPECT_EQ(f->find_kv("b")->u, 1u);
  EXPECT_EQ(f->find_kv("bs")->uints, (std::vector<uint64_t>{0, 1}));
}

TEST(GgufRoundTrip, OpenMapsAFileFromDisk) {
  const MoeFile m = write_moe_file(64);
  const std::string path = test::temp_gguf_path("disk");
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(m.bytes.data()), std::streamsize(m.bytes.size()));
  }
  Result<GgufFile> f = GgufFile::open(path);
  ASSERT_TRUE(f) << f.status().message();
  EXPECT_EQ(f->path(), path);
  EXPECT_EQ(f->file_size(), m.bytes.size());
  GgufFile moved = std::move(*f);  // tensor views stay valid across moves (the mapping does not move)
  const GgufTensor* up = moved.find_tensor("blk.0.ffn_up_exps.weight");
  EXPECT_TRUE(std::equal(up->bytes().begin(), up->bytes().end(), m.data[1].begin()));
  std::remove(path.c_str());

  Result<GgufFile> missing = GgufFile::open(path);
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.status().message().find(path), std::string::npos);
}

}  // namespace
}  // namespace essaim
