// Corrupt GGUF files, each built from a valid file our writer produced and then patched, must be refused
// with a message naming the field (and, where it has one, its byte offset). The cases cover every kind of
// corrupt file llama.cpp's tests/test-gguf.cpp handcrafts (HANDCRAFTED_*) and one fixture per published
// GGUF parsing advisory; docs/gguf.md has the table. Label `sanitize`: this also runs under ASan + UBSan.
#include <functional>

#include "gguf/gguf_cursor.h"
#include "gguf_test_util.h"

namespace essaim {
namespace {

using test::after_name;
using test::peek;
using test::poke;
using test::string_at;
using Bytes = std::vector<uint8_t>;

const std::string kExps = "blk.0.ffn_up_exps.weight";
const std::string kLongName = "blk.0." + std::string(57, 'x');  // 63 bytes: the longest legal name

// A valid file with every kind of field the cases patch. Tensors: 0 "tok.weight" F32 [6,3] (72 bytes,
// padded 96), 1 the Q8_0 expert tensor [64,3,5] (1020 bytes, padded 1024), 2 "out.weight" F32 [8],
// 3 kLongName F32 [8].
Bytes base_file(uint32_t alignment = 32, bool tensors = true) {
  GgufWriter w(alignment);
  w.set_string("general.architecture", "qwen3moe");
  w.set_u32("test.u32", 7);
  w.set_i32("test.i32", -5);
  w.set_bool("test.bool", true);
  w.set_array_string("test.tokens", {"a", "bb", "ccc"});
  w.set_array_i32("test.ints", {1, 2, 3});
  w.set_string("test.str", "hello!");  // 6 bytes: leaves padding between infos and data
  std::vector<Bytes> data;
  if (tensors) {
    w.add_tensor("tok.weight", GgmlType::F32, {6, 3});
    w.add_tensor(kExps, GgmlType::Q8_0, {64, 3, 5});
    w.add_tensor("out.weight", GgmlType::F32, {8});
    w.add_tensor(kLongName, GgmlType::F32, {8});
    for (size_t i = 0; i < w.tensor_count(); ++i) data.push_back(test::pattern_bytes(w.tensor_nbytes(i), 9));
  }
  return test::write_gguf(w, data);
}

// Field positions inside a tensor info record, found from the name that starts it.
struct Info {
  size_t n_dims, type, offset;
  size_t ne(uint32_t k) const { return n_dims + 4 + 8 * k; }
};
Info info(const Bytes& b, const std::string& name) {
  Info i;
  i.n_dims = after_name(b, name);
  const uint32_t n = peek<uint32_t>(b, i.n_dims);
  i.type = i.n_dims + 4 + 8 * n;
  i.offset = i.type + 4;
  return i;
}
// Position of a KV's value (after its type field).
size_t value_at(const Bytes& b, const std::string& key) { return after_name(b, key) + 4; }
std::string at(size_t pos) { return " at byte " + std::to_string(pos); }

struct Case {
  std::string name;  // HANDCRAFTED_* kind or advisory id (see docs/gguf.md)
  std::function<std::string(Bytes&)> corrupt;  // patches the file, returns the expected message part
  uint32_t alignment = 32;
  bool tensors = true;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<Case> cases() {
  std::vector<Case> c;
  // ---- llama.cpp tests/test-gguf.cpp, header kinds
  c.push_back({"HEADER_BAD_MAGIC", [](Bytes& b) { std::memcpy(b.data(), "FUGG", 4); return "magic at byte 0 is not 'GGUF'"; }});
  c.push_back({"HEADER_BAD_VERSION_0", [](Bytes& b) { poke<uint32_t>(b, 4, 0); return "version 0 at byte 4"; }});
  c.push_back({"HEADER_BAD_VERSION_1", [](Bytes& b) { poke<uint32_t>(b, 4, 1); return "version 1 at byte 4 is not supported"; }});
  c.push_back({"HEADER_BAD_VERSION_FUTURE", [](Bytes& b) { poke<uint32_t>(b, 4, 4); return "version 4 at byte 4 is newer"; }});
  c.push_back({"HEADER_BAD_N_TENSORS", [](Bytes& b) { poke<int64_t>(b, 8, -1); return "tensor_count -1 at byte 8 is negative"; }});
  c.push_back({"HEADER_BAD_N_KV", [](Bytes& b) { poke<int64_t>(b, 16, -1); return "kv_count -1 at byte 16 is negative"; }});
  c.push_back({"HEADER_TOO_SHORT", [](Bytes& b) { b.resize(20); return "header is truncated: the file has 20 bytes"; }});
  // ---- KV kinds
  c.push_back({"KV_BAD_KEY_SIZE", [](Bytes& b) {
    poke<uint64_t>(b, 24, ~uint64_t(0));
    return "kv 0: key length 18446744073709551615 at byte 24 exceeds the 1 GiB string limit"; }});
  c.push_back({"KV_EMPTY_KEY", [](Bytes& b) { poke<uint64_t>(b, 24, 0); return "kv 0: key at byte 24 is empty"; }});
  c.push_back({"KV_BAD_TYPE", [](Bytes& b) {
    const size_t p = after_name(b, "test.u32");
    poke<int32_t>(b, p, 13);
    return "kv 1 'test.u32': value type 13" + at(p) + " is not a GGUF value type"; }});
  c.push_back({"KV_DUPLICATE_KEY", [](Bytes& b) {
    const size_t p = string_at(b, "test.i32");
    std::memcpy(b.data() + p + 8, "test.u32", 8);
    return "kv 2 'test.u32': duplicate key" + at(p) + " (first defined by kv 1)"; }});
  c.push_back({"KV_BAD_ALIGN", [](Bytes& b) {
    const size_t p = value_at(b, "general.alignment");
    poke<uint32_t>(b, p, 13);
    return "'general.alignment': alignment 13" + at(p) + " is not a non-zero power of two"; }, 64, false});
  c.push_back({"KV_BAD_ALIGN_ZERO", [](Bytes& b) {
    const size_t p = value_at(b, "general.alignment");
    poke<uint32_t>(b, p, 0);
    return "alignment 0" + at(p) + " is not a non-zero power of two"; }, 64, false});
  c.push_back({"KV_WRONG_TYPE_ALIGN", [](Bytes& b) {
    poke<int32_t>(b, after_name(b, "general.alignment"), int32_t(GgufValueType::INT32));
    return "value" + at(value_at(b, "general.alignment")) + " has type INT32, must be UINT32"; }, 64, false});
  // ---- tensor info kinds
  c.push_back({"TENSORS_BAD_NAME_SIZE", [](Bytes& b) {
    const size_t p = string_at(b, kLongName);
    poke<uint64_t>(b, p, 64);
    return "tensor 3 '" + kLongName + "\\x01': name length 64" + at(p) + " exceeds 63 bytes"; }});
  c.push_back({"TENSORS_BAD_N_DIMS", [](Bytes& b) {
    const Info i = info(b, kExps);
    poke<uint32_t>(b, i.n_dims, 5);
    return "tensor 1 '" + kExps + "': n_dims 5" + at(i.n_dims) + " is outside 1..4"; }});
  c.push_back({"TENSORS_BAD_SHAPE", [](Bytes& b) {
    const Info i = info(b, "tok.weight");
    poke<int64_t>(b, i.ne(0), -1);
    poke<int64_t>(b, i.ne(1), -1);
    return "tensor 0 'tok.weight': ne[0] = -1 is not a positive extent" + at(i.ne(0)); }});
  c.push_back({"TENSORS_ZERO_DIM", [](Bytes& b) {  // llama.cpp accepts it; docs/reference.md 1.8 check 11 refuses
    const Info i = info(b, "tok.weight");
    poke<int64_t>(b, i.ne(1), 0);
    return "ne[1] = 0 is not a positive extent" + at(i.ne(1)); }});
  c.push_back({"TENSORS_NE_TOO_BIG", [](Bytes& b) {
    const Info i = info(b, "tok.weight");
    poke<int64_t>(b, i.ne(0), 4 * int64_t(INT32_MAX));
    poke<int64_t>(b, i.ne(1), 4 * int64_t(INT32_MAX));
    return "element count overflows at ne[1] = 8589934588" + at(i.ne(1)); }});
  c.push_back({"TENSORS_NBYTES_TOO_BIG", [](Bytes& b) {  // also GHSA-96jg-mvhq-q7q7
    const Info i = info(b, "tok.weight");
    poke<int32_t>(b, i.type, int32_t(GgmlType::I64));
    poke<int64_t>(b, i.ne(0), int64_t(1) << 31);
    poke<int64_t>(b, i.ne(1), int64_t(1) << 31);
    return "tensor 0 'tok.weight': byte size overflows"; }});
  c.push_back({"TENSORS_BAD_TYPE", [](Bytes& b) {
    const Info i = info(b, "out.weight");
    poke<int32_t>(b, i.type, 43);
    return "tensor 2 'out.weight': type id 43 is outside 0..42" + at(i.type); }});
  c.push_back({"TENSORS_BAD_OFFSET", [](Bytes& b) {
    const Info i = info(b, kExps);
    poke<uint64_t>(b, i.offset, ~uint64_t(0));
    return "offset 18446744073709551615" + at(i.offset) + " is not the padded running sum 96"; }});
  c.push_back({"TENSORS_DUPLICATE_NAME", [](Bytes& b) {
    const size_t p = string_at(b, "out.weight");
    std::memcpy(b.data() + p + 8, "tok.weight", 10);
    return "tensor 2 'tok.weight': duplicate tensor name" + at(p) + " (first used by tensor 0)"; }});
  c.push_back({"TENSORS_BAD_ALIGN", [](Bytes& b) {
    const size_t p = value_at(b, "general.alignment");
    poke<uint32_t>(b, p, 13);
    const Info last = info(b, kLongName);
    b.resize(last.offset + 8);  // tensor infos, no data (as llama.cpp's TENSORS_* files)
    return "alignment 13" + at(p) + " is not a non-zero power of two"; }, 64});
  c.push_back({"TENSORS_INCONSISTENT_ALIGN", [](Bytes& b) {
    const Info i = info(b, kExps);
    poke<uint64_t>(b, i.offset, 72);  // the unpadded sum: offsets laid out for alignment 1
    return "tensor 1 '" + kExps + "': offset 72" + at(i.offset) + " is not the padded running sum 96"; }});
  // ---- data kinds
  c.push_back({"DATA_NOT_ENOUGH_DATA", [](Bytes& b) {
    Result<GgufFile> f = GgufFile::parse(b);
    const GgufTensor& last = f->tensors().back();
    const uint64_t end = last.file_offset + last.nbytes;
    const uint64_t data_start = f->data_start();
    b.resize(end - 1);  // one byte of real data missing (a missing final padding is accepted, 1.5)
    return "tensor 3 '" + kLongName + "': data of 32 bytes at offset 1152 (data section" + at(data_start) +
           ") runs past the end of the file (" + std::to_string(end - 1) + " bytes)"; }});
  c.push_back({"DATA_BAD_ALIGN", [](Bytes& b) {
    const size_t p = value_at(b, "general.alignment");
    poke<uint32_t>(b, p, 13);
    return "alignment 13" + at(p); }, 64});
  c.push_back({"DATA_INCONSISTENT_ALIGN", [](Bytes& b) {
    poke<uint64_t>(b, info(b, kExps).offset, 72);
    poke<uint64_t>(b, info(b, "out.weight").offset, 72 + 1020);
    poke<uint64_t>(b, info(b, kLongName).offset, 72 + 1020 + 32);
    return "offset 72" + at(info(b, kExps).offset) + " is not the padded running sum 96"; }});
  c.push_back({"DATA_MEM_SIZE_OVERFLOW", [](Bytes& b) {  // also GHSA-vgg9-87g3-85w8 / CVE-2025-53630
    const int64_t big = 0x7FFFFFFFFFFFFFC0;
    const Info t0 = info(b, "tok.weight"), t1 = info(b, kExps), t2 = info(b, "out.weight");
    poke<int32_t>(b, t0.type, int32_t(GgmlType::I8));
    poke<int64_t>(b, t0.ne(0), big);
    poke<int64_t>(b, t0.ne(1), 1);
    poke<int32_t>(b, t1.type, int32_t(GgmlType::I8));
    poke<int64_t>(b, t1.ne(0), big);
    poke<int64_t>(b, t1.ne(1), 1);
    poke<int64_t>(b, t1.ne(2), 1);
    poke<uint64_t>(b, t1.offset, uint64_t(big));
    poke<int32_t>(b, t2.type, int32_t(GgmlType::I8));
    poke<int64_t>(b, t2.ne(0), big);
    poke<uint64_t>(b, t2.offset, 2 * uint64_t(big));
    return "tensor 2 'out.weight': size 9223372036854775744 at offset 18446744073709551488 overflows the "
           "data section" + at(t2.offset); }});

  // ---- one fixture per published GGUF parsing advisory (docs/gguf.md)
  c.push_back({"CVE-2024-23496 gguf_fread_str length overflow", [](Bytes& b) {
    const size_t p = value_at(b, "test.str");
    poke<uint64_t>(b, p, ~uint64_t(0));
    return "kv 6 'test.str': string value length 18446744073709551615" + at(p) + " exceeds the 1 GiB"; }});
  c.push_back({"CVE-2026-27940 string exhaustion", [](Bytes& b) {
    const size_t p = value_at(b, "test.str");
    poke<uint64_t>(b, p, uint64_t(1) << 30);
    return "string value length 1073741824" + at(p) + " runs past the end of the file"; }});
  c.push_back({"CVE-2024-21825 array count overflow", [](Bytes& b) {
    const size_t p = value_at(b, "test.tokens") + 4;
    poke<uint64_t>(b, p, uint64_t(1) << 62);
    return "kv 4 'test.tokens': array count 4611686018427387904" + at(p) + " exceeds the limit of 2^30"; }});
  c.push_back({"CVE-2024-21825 array n*size past EOF", [](Bytes& b) {
    const size_t p = value_at(b, "test.ints") + 4;
    poke<uint64_t>(b, p, uint64_t(1) << 29);
    return "array count 536870912" + at(p) + " needs at least 2147483648 bytes"; }});
  c.push_back({"CVE-2024-21825 string array count", [](Bytes& b) {
    const size_t p = value_at(b, "test.tokens") + 4;
    poke<uint64_t>(b, p, uint64_t(1) << 30);
    return "array count 1073741824" + at(p) + " needs at least 8589934592 bytes"; }});
  c.push_back({"CVE-2024-21825 string element length", [](Bytes& b) {
    const size_t p = value_at(b, "test.tokens") + 4 + 8 + 8 + 1;  // element 1's length
    poke<uint64_t>(b, p, ~uint64_t(0) - 1);
    return "kv 4 'test.tokens': element 1: array string length 18446744073709551614" + at(p); }});
  c.push_back({"CVE-2024-23605 n_kv heap overflow", [](Bytes& b) {
    poke<int64_t>(b, 16, int64_t(1) << 40);
    return "kv_count 1099511627776 at byte 16 needs at least 12 bytes per pair"; }});
  c.push_back({"CVE-2024-23605 n_kv INT64_MIN", [](Bytes& b) {
    poke<int64_t>(b, 16, INT64_MIN);
    return "kv_count -9223372036854775808 at byte 16 is negative"; }});
  c.push_back({"CVE-2024-21836 n_tensors heap overflow", [](Bytes& b) {
    poke<int64_t>(b, 8, int64_t(1) << 40);
    return "tensor_count 1099511627776 at byte 8 needs at least 24 bytes per tensor info"; }});
  c.push_back({"CVE-2024-21802 n_dims overflows ne[]", [](Bytes& b) {
    const Info i = info(b, "tok.weight");
    poke<uint32_t>(b, i.n_dims, 0xFFFFFFFFu);
    return "n_dims 4294967295" + at(i.n_dims) + " is outside 1..4"; }});
  c.push_back({"ggml#709 n_dims zero", [](Bytes& b) {
    const Info i = info(b, "tok.weight");
    poke<uint32_t>(b, i.n_dims, 0);
    return "n_dims 0" + at(i.n_dims); }});
  c.push_back({"ggml#709 tensor type negative", [](Bytes& b) {
    const Info i = info(b, "out.weight");
    poke<int32_t>(b, i.type, -1);
    return "type id -1 is outside 0..42" + at(i.type); }});
  c.push_back({"ggml#709 value type negative", [](Bytes& b) {
    const size_t p = after_name(b, "test.i32");
    poke<int32_t>(b, p, -1);
    return "value type -1" + at(p); }});
  c.push_back({"gguf-py nested ARRAY recursion", [](Bytes& b) {
    const size_t p = value_at(b, "test.ints");
    poke<int32_t>(b, p, int32_t(GgufValueType::ARRAY));
    return "kv 5 'test.ints': array element type ARRAY" + at(p) + ": nested arrays are not allowed"; }});
  c.push_back({"ggml#709 array element type invalid", [](Bytes& b) {
    const size_t p = value_at(b, "test.ints");
    poke<int32_t>(b, p, 13);
    return "array element type 13" + at(p) + " is not a GGUF value type"; }});
  for (int removed : {4, 5, 31, 32, 33, 36, 37, 38}) {
    c.push_back({"removed type id " + std::to_string(removed), [removed](Bytes& b) {
      const Info i = info(b, "out.weight");
      poke<int32_t>(b, i.type, removed);
      return "type id " + std::to_string(removed) + " is a removed ggml type" + at(i.type); }});
  }
  c.push_back({"ne0 not a multiple of the block size", [](Bytes& b) {
    const Info i = info(b, kExps);
    poke<int64_t>(b, i.ne(0), 48);
    return "ne[0] = 48 is not a multiple of the Q8_0 block size 32" + at(i.ne(0)); }});
  c.push_back({"llama.cpp#24759 GGML_PAD overflow", [](Bytes& b) {
    const Info t0 = info(b, "tok.weight");
    poke<int64_t>(b, t0.ne(0), 0x1FFFFFFFFFFFFFFF);  // F32: 0x7FFFFFFFFFFFFFFC bytes
    poke<int64_t>(b, t0.ne(1), 1);
    poke<uint64_t>(b, info(b, kExps).offset, 0x8000000000000000);
    poke<uint64_t>(b, info(b, "out.weight").offset, 0x8000000000000400);
    poke<uint64_t>(b, info(b, kLongName).offset, 0x8000000000000420);
    return "tensor 0 'tok.weight': data of 9223372036854775804 bytes at offset 0"; }});
  c.push_back({"overlapping offsets", [](Bytes& b) {
    const Info i = info(b, "out.weight");
    poke<uint64_t>(b, i.offset, 96);
    return "tensor 2 'out.weight': offset 96" + at(i.offset) + " is not the padded running sum 1120"; }});
  c.push_back({"misaligned offset", [](Bytes& b) {
    const Info i = info(b, kExps);
    poke<uint64_t>(b, i.offset, 97);
    return "offset 97" + at(i.offset) + " is not the padded running sum 96"; }});
  c.push_back({"data_start past EOF", [](Bytes& b) {
    const size_t infos_end = info(b, kLongName).offset + 8;
    EXPECT_NE(infos_end % 32, 0u) << "the base file must have padding before its data";
    b.resize(infos_end);
    return "data section start " + std::to_string((infos_end + 31) / 32 * 32) + " (tensor infos end" +
           at(infos_end) + ", alignment 32) is past the end of the file"; }});
  c.push_back({"empty tensor name", [](Bytes& b) {
    const size_t p = string_at(b, "tok.weight");
    poke<uint64_t>(b, p, 0);
    return "tensor 0 '': name" + at(p) + " is empty"; }});
  c.push_back({"tensor name length past EOF", [](Bytes& b) {
    const size_t p = string_at(b, "out.weight");
    poke<uint64_t>(b, p, 1000000);
    return "tensor 2: name length 1000000" + at(p) + " runs past the end of the file"; }});
  c.push_back({"big-endian file", [](Bytes& b) {
    poke<uint32_t>(b, 4, 0x03000000u);
    return "looks byte-swapped"; }});
  c.push_back({"truncated inside a tensor info", [](Bytes& b) {
    const Info i = info(b, "out.weight");
    b.resize(i.type + 2);
    return "tensor 2 'out.weight': type" + at(i.type) + " is truncated: needs 4 bytes, the file has 2 left"; }});
  return c;
}

class GgufHostile : public ::testing::TestWithParam<Case> {};

TEST_P(GgufHostile, RefusedWithAClearMessage) {
  const Case& c = GetParam();
  Bytes b = base_file(c.alignment, c.tensors);
  ASSERT_TRUE(GgufFile::parse(b)) << "the base file must be valid";
  const std::string expected = c.corrupt(b);
  // A heap copy of exactly the corrupt bytes, so ASan sees any read past the end.
  const Bytes exact(b.begin(), b.end());
  Result<GgufFile> f = GgufFile::parse(exact);
  ASSERT_FALSE(f) << c.name << " was accepted";
  EXPECT_NE(f.status().message().find(expected), std::string::npos)
      << "message: " << f.status().message() << "\nexpected to contain: " << expected;
}

INSTANTIATE_TEST_SUITE_P(Corrupt, GgufHostile, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& p) {
                           std::string n;
                           for (char ch : p.param.name) n += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           return n;
                         });

// llama.cpp's *_SUCCESS / *_CUSTOM_ALIGN kinds: the same structures, valid, must load.
TEST(GgufHostileControls, ValidVariantsLoad) {
  for (uint32_t alignment : {1u, 32u, 64u}) {
    for (bool tensors : {false, true}) {
      const Bytes b = base_file(alignment, tensors);
      Result<GgufFile> f = GgufFile::parse(b);
      ASSERT_TRUE(f) << f.status().message();
      EXPECT_EQ(f->alignment(), alignment);
      EXPECT_EQ(f->tensors().size(), tensors ? 4u : 0u);
    }
  }
}

// Every prefix of a valid file that cuts into a header field, a KV, a tensor info, the padding before the
// data or any tensor's bytes is refused (never a crash); prefixes that only drop the final padding load.
TEST(GgufHostileTruncation, EveryPrefixIsRefusedUntilTheLastTensorEnds) {
  const Bytes full = base_file();
  Result<GgufFile> f = GgufFile::parse(full);
  ASSERT_TRUE(f) << f.status().message();
  const uint64_t data_end = f->tensors().back().file_offset + f->tensors().back().nbytes;
  for (size_t len = 0; len <= full.size(); ++len) {
    const Bytes prefix(full.begin(), full.begin() + len);
    Result<GgufFile> p = GgufFile::parse(prefix);
    if (len < data_end) {
      ASSERT_FALSE(p) << "prefix of " << len << " bytes was accepted";
      ASSERT_FALSE(p.status().message().empty());
    } else {
      ASSERT_TRUE(p) << len << ": " << p.status().message();
    }
  }
}

// Check 21: decoded metadata is capped (a 1.5 KB file cannot ask for gigabytes; building a real file
// over the 1 GiB cap would take >128 MB, so the budget is tested directly).
TEST(GgufHostileBudget, MetadataMemoryIsCapped) {
  GgufMetadataBudget budget;
  EXPECT_TRUE(budget.charge(kGgufMaxMetadataMemory - 10, 0).is_ok());
  EXPECT_TRUE(budget.charge(10, 0).is_ok());
  const Status s = budget.charge(1, 1234);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("metadata at byte 1234 would need more than 1024 MiB"), std::string::npos)
      << s.message();
}

// llama.cpp#26690 / #24888: tokenizer arrays with a narrower element type than the consumer expects.
// The reader never hands out raw pointers; each element is decoded with its declared type.
TEST(GgufHostileTypeConfusion, NarrowArraysAreNotReinterpreted) {
  GgufWriter w;
  GgufValue scores;
  scores.type = GgufValueType::ARRAY;
  scores.elem_type = GgufValueType::UINT8;
  scores.uints = {1, 2, 3};
  w.set_value("tokenizer.ggml.scores", scores);
  w.set_array_string("tokenizer.ggml.tokens", {"a", "b", "c"});
  const Bytes b = test::write_gguf(w, {});
  Result<GgufFile> f = GgufFile::parse(b);
  ASSERT_TRUE(f) << f.status().message();
  const GgufValue* v = f->find_kv("tokenizer.ggml.scores");
  EXPECT_EQ(v->elem_type, GgufValueType::UINT8);
  EXPECT_TRUE(v->floats.empty());  // a float consumer finds no floats, not bytes read 4 at a time
  EXPECT_EQ(v->array_size(), 3u);
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.scores"), nullptr);
}

}  // namespace
}  // namespace essaim
