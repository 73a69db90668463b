// Slices and manifests arrive over the network: malformed ones are refused with a message naming the
// problem, never a crash (docs/invariants.md invariant 6). Run under ASan/UBSan (label sanitize).
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>

#include "slice/expert_slice.h"
#include "slice/gguf_slice.h"
#include "slice_test_util.h"

namespace essaim {
namespace {

using testing::make_test_dir;
using testing::write_test_moe;

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// A valid slice's OutFile, to be mutated and written out by each case.
class HostileSlice : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = make_test_dir("hostile");
    ASSERT_TRUE(write_test_moe(dir_ + "/m.gguf", {.n_layer = 2, .n_expert = 4, .n_embd = 64, .n_ff = 32}).is_ok());
    Result<GgufFile> src = GgufFile::open(dir_ + "/m.gguf");
    ASSERT_TRUE(src);
    src_ = std::make_unique<GgufFile>(std::move(*src));
    Result<MoeLayout> moe = moe_layout(*src_);
    ASSERT_TRUE(moe);
    moe_ = *moe;
    Result<OutFile> f = expert_slice_file(*src_, moe_, {.layer_first = 0, .layer_count = 2, .expert_first = 1,
                                                        .expert_count = 2});
    ASSERT_TRUE(f);
    good_ = *f;
  }

  // Writes `f` and opens it as a slice; returns the error message ("" when accepted).
  std::string open_error(const OutFile& f) {
    const std::string path = dir_ + "/case.gguf";
    Result<WrittenFile> w = write_out_file(f, path, /*hash=*/false);
    EXPECT_TRUE(w) << w.status().message();
    Result<ExpertSlice> s = ExpertSlice::open(path);
    return s ? "" : s.status().message();
  }
  static GgufValue* kv(OutFile& f, std::string_view key) {
    for (GgufKv& k : f.kvs)
      if (k.key == key) return &k.value;
    ADD_FAILURE() << "no key " << key;
    static GgufValue dummy;
    return &dummy;
  }

  std::string dir_;
  std::unique_ptr<GgufFile> src_;
  MoeLayout moe_;
  OutFile good_;
};

TEST_F(HostileSlice, TheUnmodifiedSliceLoads) { EXPECT_EQ(open_error(good_), ""); }

TEST_F(HostileSlice, EveryMissingKeyIsNamed) {
  for (size_t i = 0; i < good_.kvs.size(); ++i) {
    const std::string key = good_.kvs[i].key;
    if (key == "general.name") continue;  // informative only
    OutFile f = good_;
    f.kvs.erase(f.kvs.begin() + ptrdiff_t(i));
    const std::string err = open_error(f);
    EXPECT_NE(err.find(key == "general.architecture" ? "not an essaim expert slice" : "missing key " + key),
              std::string::npos) << key << ": " << err;
  }
}

TEST_F(HostileSlice, WrongValuesAreRefused) {
  struct Case {
    std::string_view key;
    GgufValue value;
    const char* expect;
  };
  const auto u32 = [](uint64_t v) { GgufValue x; x.type = GgufValueType::UINT32; x.u = v; return x; };
  const auto str = [](const char* v) { GgufValue x; x.type = GgufValueType::STRING; x.str = v; return x; };
  const auto i32 = [](int64_t v) { GgufValue x; x.type = GgufValueType::INT32; x.i = v; return x; };
  const Case cases[] = {
      {"general.architecture", str("qwen3moe"), "not an essaim expert slice (general.architecture is 'qwen3moe'"},
      {kSliceKeyVersion, u32(3), "slice format version 3 is not supported"},
      {kSliceKeyVersion, u32(1), "slice format 1 (cut by an older essaim) records no expert digests"},
      {kSliceKeyLayerFirst, i32(0), "essaim.slice.layer_first is INT32, expected UINT32"},
      {kSliceKeyLayerFirst, str("0"), "is STRING, expected UINT32"},
      {kSliceKeySourceModel, str("abc"), "is not 64 hex digits"},
      {kSliceKeyActivation, str("gelu"), "expert activation 'gelu'"},
      {kSliceKeyLayerCount, u32(UINT32_MAX), "lie inside the source's 2 layers"},
      {kSliceKeyLayerFirst, u32(UINT32_MAX), "layers 4294967295 + 2 do not lie inside"},
      {kSliceKeyExpertFirst, u32(UINT32_MAX - 1), "do not lie inside the source's 4 experts"},
      {kSliceKeyExpertCount, u32(3), "expected [64, 32, 3, 1]"},
      {kSliceKeyEmbeddingLength, u32(65), "expected [65, 32, 2, 1]"},
      {kSliceKeyEmbeddingLength, u32(0), "must be positive"},
      {kSliceKeyExpertUsedCount, u32(5), "exceeds the expert count"},
      {kSliceKeyGateUpFused, [] { GgufValue x; x.type = GgufValueType::BOOL; x.u = 1; return x; }(),
       "2 layers of fused gate_up + down experts need 4"},
  };
  for (const Case& c : cases) {
    OutFile f = good_;
    *kv(f, c.key) = c.value;
    const std::string err = open_error(f);
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.key << " -> '" << err << "'";
  }
  // Only the held range must lie inside the source: a huge source is not an error.
  OutFile big = good_;
  *kv(big, kSliceKeySourceBlockCount) = u32(UINT32_MAX);
  EXPECT_EQ(open_error(big), "");
  // Inside a huge source, layers past 2^31 name tensors the file lacks: an error, never a failed check.
  *kv(big, kSliceKeyLayerFirst) = u32(0x80000001u);
  EXPECT_NE(open_error(big).find("layer 2147483649 does not have"), std::string::npos) << open_error(big);
}

TEST_F(HostileSlice, ExpertDigestsAreCheckedThenTheBytesVerifiedAgainstThem) {
  OutFile short_list = good_;
  kv(short_list, kSliceKeyExpertSha256)->strs.pop_back();
  EXPECT_NE(open_error(short_list).find("essaim.slice.expert_sha256 holds"), std::string::npos) << open_error(short_list);
  OutFile not_hex = good_;
  kv(not_hex, kSliceKeyExpertSha256)->strs[1] = std::string(64, 'g');
  EXPECT_NE(open_error(not_hex).find("essaim.slice.expert_sha256[1] is not 64 hex digits"), std::string::npos);

  // One flipped bit in the last expert's down slab: the file opens (a structural check), and the digest
  // check names the expert and the layer.
  OutFile flipped = good_;
  OutTensor& down = flipped.tensors.back();
  std::vector<uint8_t> bytes(down.bytes.begin(), down.bytes.end());
  bytes.back() ^= 0x01;
  down.bytes = bytes;
  const std::string path = dir_ + "/flipped.gguf";
  ASSERT_TRUE(write_out_file(flipped, path, /*hash=*/false));
  Result<ExpertSlice> s = ExpertSlice::open(path);
  ASSERT_TRUE(s) << s.status().message();
  const uint32_t last_expert = s->expert_first() + s->expert_count() - 1;
  const std::string layer = down.name.substr(4, down.name.find('.', 4) - 4);  // "blk.<layer>.ffn_..."
  Status v = s->verify_digests();
  ASSERT_FALSE(v);
  EXPECT_NE(v.message().find("the bytes of expert " + std::to_string(last_expert) + " of layer " + layer + " hash to"),
            std::string::npos)
      << v.message();
  EXPECT_NE(v.message().find("damaged or was altered"), std::string::npos) << v.message();
  Result<ExpertSlice> good = ExpertSlice::open(dir_ + "/case.gguf");
  ASSERT_TRUE(open_error(good_).empty());
  good = ExpertSlice::open(dir_ + "/case.gguf");
  ASSERT_TRUE(good);
  EXPECT_TRUE(good->verify_digests()) << good->verify_digests().message();
}

TEST_F(HostileSlice, TensorsMustBeExactlyTheDeclaredExperts) {
  OutFile extra = good_;
  extra.tensors.push_back(OutTensor{"token_embd.weight", GgmlType::F32, {64, 32},
                                    src_->find_tensor("token_embd.weight")->bytes()});
  EXPECT_NE(open_error(extra).find("holds 7 tensors; 2 layers of gate + up + down experts need 6"), std::string::npos);

  OutFile renamed = good_;
  renamed.tensors[0].name = "blk.0.ffn_gate_exps.bias";
  EXPECT_NE(open_error(renamed).find("layer 0 does not have exactly ffn_gate_exps"), std::string::npos);

  OutFile wrong_shape = good_;
  wrong_shape.tensors[1].ne = {32, 128, 1};  // same bytes, another shape
  EXPECT_NE(open_error(wrong_shape).find("has ne [32, 128, 1, 1], expected"), std::string::npos);
}

TEST_F(HostileSlice, RandomCorruptionNeverCrashes) {
  const std::string path = dir_ + "/good.gguf";
  ASSERT_TRUE(write_out_file(good_, path));
  const std::vector<uint8_t> good = read_all(path);
  Result<GgufFile> g = GgufFile::parse(good);
  ASSERT_TRUE(g);
  const uint64_t header = g->data_start();
  std::mt19937_64 rng(20260101);
  int accepted = 0, refused = 0;
  for (int iter = 0; iter < 600; ++iter) {
    std::vector<uint8_t> bytes = good;
    const int flips = 1 + int(rng() % 8);
    for (int k = 0; k < flips; ++k) {
      // Mostly the header (keys, tensor infos): that is where a parser can go wrong.
      const uint64_t at = iter % 4 == 0 ? rng() % bytes.size() : rng() % header;
      bytes[at] ^= uint8_t(1 + rng() % 255);
    }
    if (iter % 10 == 0) bytes.resize(rng() % bytes.size());  // truncations too
    Result<GgufFile> f = GgufFile::parse(bytes);
    if (!f) {
      ++refused;
      continue;
    }
    Result<ExpertSlice> s = ExpertSlice::from_gguf(std::move(*f));
    if (s) {
      ++accepted;
      // Whatever was accepted is internally consistent: every held expert's slab lies inside the file.
      for (const MoeLayer& l : s->layers())
        for (const GgufTensor* t : l.tensors) {
          if (t != nullptr) {
            EXPECT_LE(t->file_offset + t->nbytes, bytes.size());
          }
        }
    } else {
      ++refused;
    }
  }
  // The seeded corruption actually exercised both outcomes.
  EXPECT_GT(accepted, 10);
  EXPECT_GT(refused, 100);
}

TEST(HostileManifest, MalformedManifestsAreRefusedWithTheField) {
  const std::string model(64, 'a');
  const auto manifest = [&](const std::string& slice, const std::string& extra = "") {
    return R"({"format":"essaim-slice-manifest","version":1,"source":{"model":")" + model +
           R"(","file":"m.gguf","architecture":"qwen3moe","block_count":4,"expert_count":8})" + extra +
           R"(,"slices":[)" + slice + "]}";
  };
  const auto slice = [&](const std::string& file, const std::string& counts) {
    return R"({"file":")" + file + R"(",)" + counts + R"(,"bytes":10,"sha256":")" + model + R"("})";
  };
  const std::string ok_counts = R"("layer_first":1,"layer_count":1,"expert_first":0,"expert_count":8)";
  ASSERT_TRUE(SliceManifest::parse(manifest(slice("a.gguf", ok_counts))));

  const std::pair<std::string, const char*> cases[] = {
      {"", "not valid JSON"},
      {"[]", "top level is not a JSON object"},
      {"{\"format\":\"x\"}", "format is \"x\""},
      {manifest(slice("../a.gguf", ok_counts)), "plain file name"},
      {manifest(slice("/etc/passwd", ok_counts)), "plain file name"},
      {manifest(slice("..", ok_counts)), "plain file name"},
      {manifest(slice("a\\\\b", ok_counts)), "plain file name"},
      {manifest(slice("", ok_counts)), "plain file name"},
      {manifest(slice("a.gguf", R"("layer_first":-1,"layer_count":1,"expert_first":0,"expert_count":8)")),
       "\"layer_first\" is not a non-negative integer"},
      {manifest(slice("a.gguf", R"("layer_first":1.5,"layer_count":1,"expert_first":0,"expert_count":8)")),
       "not a non-negative integer"},
      {manifest(slice("a.gguf", R"("layer_first":4294967296,"layer_count":1,"expert_first":0,"expert_count":8)")),
       "larger than 2^32-1"},
      {manifest(slice("a.gguf", R"("layer_first":3,"layer_count":2,"expert_first":0,"expert_count":8)")),
       "lie outside the source's 4 layers"},
      {manifest(slice("a.gguf", R"("layer_first":0,"layer_count":1,"expert_first":4294967295,"expert_count":2)")),
       "lie outside the source's 8 experts"},
      {manifest(slice("a.gguf", R"("layer_first":0,"layer_count":1,"expert_first":0,"expert_count":0)")),
       "lie outside"},
      {manifest(slice("a.gguf", R"("layer_first":0,"layer_count":1,"expert_first":0)")),
       "missing field \"expert_count\""},
      {manifest(slice("a.gguf", ok_counts) + "," + slice("a.gguf", ok_counts)), "listed twice"},
      {manifest("7"), "slice 0: not an object"},
      {manifest(slice("a.gguf", ok_counts), R"(,"backbone":{"file":"a.gguf","bytes":1,"sha256":")" + model + "\"}"),
       "listed twice"},
      {manifest(slice("a.gguf", ok_counts), R"(,"backbone":{"file":"b","bytes":1,"sha256":"zz"})"), "64 hex digits"},
  };
  for (const auto& [text, expect] : cases) {
    Result<SliceManifest> m = SliceManifest::parse(text);
    ASSERT_FALSE(m) << text;
    EXPECT_NE(m.status().message().find(expect), std::string::npos) << text << "\n -> " << m.status().message();
  }
}

TEST(HostileManifest, MutatedAndTruncatedManifestsNeverCrash) {
  SliceManifest m;
  m.source_architecture = "qwen3moe";
  m.source_block_count = 48;
  m.source_expert_count = 256;
  for (uint32_t e = 0; e < 256; e += 64) m.slices.push_back({"s" + std::to_string(e), 3, 1, e, 64, 1000 + e, {}});
  m.backbone = ManifestBackbone{"bb.gguf", 5, {}};
  const std::string good = m.to_json();
  ASSERT_TRUE(SliceManifest::parse(good));
  for (size_t n = 0; n <= good.rfind('}'); ++n) EXPECT_FALSE(SliceManifest::parse(good.substr(0, n))) << n;
  std::mt19937_64 rng(7);
  int parsed = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    std::string t = good;
    for (int k = 0; k < 1 + int(rng() % 3); ++k) t[rng() % t.size()] = char(rng() % 128);
    parsed += SliceManifest::parse(t).is_ok();
  }
  EXPECT_GT(parsed, 0);  // some mutations land in harmless places (a digit of a size, a hex digit)
}

TEST(HostileManifest, VerifyRefusesNamesThatLeaveTheDirectory) {
  SliceManifest m;
  m.slices.push_back({"../escape.gguf", 0, 1, 0, 1, 0, {}});
  const Status s = verify_manifest(m, make_test_dir("escape"));
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("not a plain file name"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace essaim
