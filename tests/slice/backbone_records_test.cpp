// A backbone file (format 2) describes the experts it does not hold: per MoE layer the expert tensors'
// types, the shared shapes and every expert's digest. Written by the slicer, equal to the source's (llama.cpp
// fixtures and fused test files); the file is untrusted when a backbone loads it, so every malformed record
// is refused with a message naming the key, never a crash (label sanitize: ASan/UBSan).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "slice/backbone_experts.h"
#include "slice/expert_digest.h"
#include "slice/gguf_slice.h"
#include "slice_test_util.h"

namespace essaim {
namespace {

using testing::make_test_dir;
using testing::write_test_moe;

std::string fixture(const char* name) { return std::string(ESSAIM_FIXTURES_DIR) + "/" + name; }

// The records equal what the source has: each shape-only tensor has the name, type, shape and byte size of
// the source's tensor, each digest is the source expert's.
void expect_records_match_source(const GgufFile& src, const MoeLayout& moe, const BackboneExperts& b) {
  ASSERT_EQ(b.layers.size(), moe.layers.size());
  EXPECT_EQ(b.source_model, moe.source_model);
  EXPECT_EQ(b.expert_count, moe.expert_count);
  EXPECT_EQ(b.gate_up_fused, moe.gate_up_fused);
  const std::vector<GgufTensor> shapes = b.shape_tensors();
  size_t n_source = 0;
  for (const GgufTensor& t : src.tensors()) n_source += is_routed_expert_tensor_name(t.name) ? 1 : 0;
  EXPECT_EQ(shapes.size(), n_source);
  for (const GgufTensor& s : shapes) {
    const GgufTensor* t = src.find_tensor(s.name);
    ASSERT_NE(t, nullptr) << s.name;
    EXPECT_EQ(s.type, t->type) << s.name;
    EXPECT_EQ(s.ne, t->ne) << s.name;
    EXPECT_EQ(s.nbytes, t->nbytes) << s.name;
    EXPECT_EQ(s.data, nullptr);
  }
  for (size_t i = 0; i < moe.layers.size(); ++i)
    for (uint32_t e = 0; e < moe.expert_count; ++e)
      ASSERT_EQ(b.digests[i][e], expert_digest(moe.layers[i], e)) << "layer " << moe.layers[i].layer << " expert " << e;
}

class BackboneRecordsFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(BackboneRecordsFixture, TheRecordsAreTheSourceExperts) {
  const std::string path = fixture(GetParam());
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  Result<GgufFile> src = GgufFile::open(path);
  ASSERT_TRUE(src);
  Result<MoeLayout> moe = moe_layout(*src);
  ASSERT_TRUE(moe);
  const std::string dir = make_test_dir("records");
  Result<WrittenFile> w = write_out_file(backbone_file(*src, *moe), dir + "/bb.gguf");
  ASSERT_TRUE(w) << w.status().message();
  Result<GgufFile> bb = GgufFile::open(w->path);
  ASSERT_TRUE(bb);
  EXPECT_EQ(bb->get_u32(kBackboneKeyVersion), 2u);
  Result<BackboneExperts> b = read_backbone_experts(*bb);
  ASSERT_TRUE(b) << b.status().message();
  expect_records_match_source(*src, *moe, *b);
  // A plan sizes the backbone with placeholder digests: the same byte count.
  EXPECT_EQ(backbone_file(*src, *moe, BackboneDigests::PLACEHOLDER).size(), w->bytes);
  // The shapes go into the file once.
  EXPECT_TRUE(bb->add_shape_only_tensors(b->shape_tensors()).is_ok());
  EXPECT_FALSE(bb->add_shape_only_tensors(b->shape_tensors()).is_ok());
}

INSTANTIATE_TEST_SUITE_P(LlamaCpp, BackboneRecordsFixture,
                         ::testing::Values("qwen3moe-small-q4k.gguf", "qwen35moe-small-q4k.gguf",
                                           "qwen3moe-small-f32.gguf"),
                         [](const ::testing::TestParamInfo<const char*>& p) {
                           std::string n = p.param;
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

// A valid backbone's OutFile, mutated and written out by each case.
class HostileBackbone : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = make_test_dir("hostile-backbone");
    ASSERT_TRUE(write_test_moe(dir_ + "/m.gguf", {.n_layer = 3, .n_dense_layers = 1, .n_expert = 4, .n_embd = 64,
                                                  .n_ff = 32, .fused_gate_up = false})
                    .is_ok());
    Result<GgufFile> src = GgufFile::open(dir_ + "/m.gguf");
    ASSERT_TRUE(src);
    src_ = std::make_unique<GgufFile>(std::move(*src));
    Result<MoeLayout> moe = moe_layout(*src_);
    ASSERT_TRUE(moe);
    moe_ = *moe;
    good_ = backbone_file(*src_, moe_);
  }
  GgufKv* kv(std::string_view key, OutFile& f) {
    for (GgufKv& k : f.kvs)
      if (k.key == key) return &k;
    return nullptr;
  }
  // The error reading `f` back, or "" when it was accepted.
  std::string error_of(const OutFile& f) {
    const std::string path = dir_ + "/case" + std::to_string(n_++) + ".gguf";
    Result<WrittenFile> w = write_out_file(f, path);
    if (!w) return "write: " + w.status().message();
    Result<GgufFile> g = GgufFile::open(path);
    if (!g) return "gguf: " + g.status().message();
    Result<BackboneExperts> b = read_backbone_experts(*g);
    return b ? "" : b.status().message();
  }
  std::string dir_;
  std::unique_ptr<GgufFile> src_;
  MoeLayout moe_;
  OutFile good_;
  int n_ = 0;
};

TEST_F(HostileBackbone, TheGoodFileIsAccepted) { EXPECT_EQ(error_of(good_), ""); }

TEST_F(HostileBackbone, EveryMissingKeyIsNamed) {
  for (std::string_view key : {kBackboneKeyVersion, kBackboneKeySourceModel, kBackboneKeyExpertCount,
                               kBackboneKeyEmbeddingLength, kBackboneKeyExpertFfLength, kBackboneKeyGateUpFused,
                               kBackboneKeyActivation, kBackboneKeyExpertLayers, kBackboneKeyExpertTypes,
                               kBackboneKeyExpertSha256}) {
    OutFile f = good_;
    std::erase_if(f.kvs, [&](const GgufKv& k) { return k.key == key; });
    const std::string e = error_of(f);
    EXPECT_NE(e.find(std::string(key)), std::string::npos) << key << ": " << e;
  }
}

TEST_F(HostileBackbone, MalformedRecordsAreRefusedWithTheirReason) {
  struct Case {
    const char* what;
    std::function<void(OutFile&)> mutate;
    const char* expect;
  };
  auto set_u32 = [this](std::string_view key, uint64_t v) {
    return [this, key, v](OutFile& f) { kv(key, f)->value.u = v; };
  };
  const std::vector<Case> cases = {
      {"format 1", set_u32(kBackboneKeyVersion, 1), "cut it again"},
      {"format 3", set_u32(kBackboneKeyVersion, 3), "not supported"},
      {"no experts", set_u32(kBackboneKeyExpertCount, 0), "expert_count"},
      {"too many experts", set_u32(kBackboneKeyExpertCount, 1u << 20), "expert_count"},
      {"zero width", set_u32(kBackboneKeyEmbeddingLength, 0), "widths"},
      {"huge width", set_u32(kBackboneKeyExpertFfLength, 0xFFFFFFFFu), "widths"},
      {"digests of another count", set_u32(kBackboneKeyExpertCount, 3), "digests"},
      {"version as a string",
       [this](OutFile& f) {
         GgufValue& v = kv(kBackboneKeyVersion, f)->value;
         v.type = GgufValueType::STRING;
         v.str = "2";
       },
       "expected UINT32"},
      {"bad model hex", [this](OutFile& f) { kv(kBackboneKeySourceModel, f)->value.str = "xyz"; }, "hex"},
      {"unknown activation", [this](OutFile& f) { kv(kBackboneKeyActivation, f)->value.str = "gelu\x01"; }, "activation"},
      {"no layers", [this](OutFile& f) { kv(kBackboneKeyExpertLayers, f)->value.uints.clear(); }, "empty"},
      {"layers descending",
       [this](OutFile& f) {
         auto& u = kv(kBackboneKeyExpertLayers, f)->value.uints;
         std::swap(u[0], u[1]);
       },
       "ascend"},
      {"layer repeated", [this](OutFile& f) { kv(kBackboneKeyExpertLayers, f)->value.uints[1] = 1; }, "ascend"},
      {"layer beyond the model", [this](OutFile& f) { kv(kBackboneKeyExpertLayers, f)->value.uints[1] = 3; }, "ascend"},
      {"a block count no model has",
       [this](OutFile& f) { kv(std::string(kv("general.architecture", f)->value.str) + ".block_count", f)->value.u = 0x80000005u; },
       "block_count"},
      {"a layer past 2^31 under a huge block count (a fuzzer's find)",
       [this](OutFile& f) {
         kv(std::string(kv("general.architecture", f)->value.str) + ".block_count", f)->value.u = 0x80000005u;
         kv(kBackboneKeyExpertLayers, f)->value.uints[1] = 0x80000001u;
       },
       "block_count"},
      {"layers as i32",
       [this](OutFile& f) {
         GgufValue& v = kv(kBackboneKeyExpertLayers, f)->value;
         v.elem_type = GgufValueType::INT32;
         v.ints.assign(v.uints.begin(), v.uints.end());
       },
       "ARRAY of UINT32"},
      {"a type missing", [this](OutFile& f) { kv(kBackboneKeyExpertTypes, f)->value.uints.pop_back(); }, "types"},
      {"an unknown type id", [this](OutFile& f) { kv(kBackboneKeyExpertTypes, f)->value.uints[0] = 99; }, "cannot compute"},
      {"a removed type id", [this](OutFile& f) { kv(kBackboneKeyExpertTypes, f)->value.uints[0] = 4; }, "cannot compute"},
      {"a type whose block does not divide the width",
       [this](OutFile& f) { kv(kBackboneKeyExpertTypes, f)->value.uints[2] = uint64_t(GgmlType::Q4_K); },
       "block size"},
      {"gate and up of different activations",
       [this](OutFile& f) { kv(kBackboneKeyExpertTypes, f)->value.uints[1] = uint64_t(GgmlType::Q8_0); },
       "activation formats"},
      {"a digest missing", [this](OutFile& f) { kv(kBackboneKeyExpertSha256, f)->value.strs.pop_back(); }, "digests"},
      {"a digest not hex", [this](OutFile& f) { kv(kBackboneKeyExpertSha256, f)->value.strs[3] = std::string(64, 'g'); },
       "hex"},
      {"an expert tensor left in the file",
       [this](OutFile& f) {
         const GgufTensor* t = src_->find_tensor("blk.1.ffn_down_exps.weight");
         f.tensors.push_back(OutTensor{t->name, t->type, {t->ne[0], t->ne[1], t->ne[2]}, t->bytes()});
       },
       "routed-expert tensor"},
  };
  for (const Case& c : cases) {
    OutFile f = good_;
    c.mutate(f);
    const std::string e = error_of(f);
    EXPECT_NE(e.find(c.expect), std::string::npos) << c.what << ": '" << e << "'";
  }
}

// Seeded random corruption of the header bytes: whatever GgufFile accepts, the records are an error value
// or consistent (the fuzz target checks the same on arbitrary inputs).
TEST_F(HostileBackbone, RandomHeaderCorruptionGivesAnErrorOrConsistentRecords) {
  const std::string path = dir_ + "/good.gguf";
  Result<WrittenFile> w = write_out_file(good_, path);
  ASSERT_TRUE(w);
  std::ifstream in(path, std::ios::binary);
  const std::vector<uint8_t> bytes{std::istreambuf_iterator<char>(in), {}};
  const size_t header = size_t(good_.header().size());
  std::mt19937_64 rng(11);
  int accepted = 0;
  for (int i = 0; i < 2000; ++i) {
    std::vector<uint8_t> b = bytes;
    const int flips = 1 + int(rng() % 4);
    for (int k = 0; k < flips; ++k) b[rng() % header] ^= uint8_t(1u << (rng() % 8));
    Result<GgufFile> g = GgufFile::parse(b);
    if (!g) continue;
    Result<BackboneExperts> r = read_backbone_experts(*g);
    if (!r) {
      EXPECT_FALSE(r.status().message().empty());
      continue;
    }
    ++accepted;
    const std::vector<GgufTensor> shapes = r->shape_tensors();
    EXPECT_EQ(shapes.size(), r->layers.size() * (r->gate_up_fused ? 2 : 3));
    EXPECT_EQ(r->digests.size(), r->layers.size());
  }
  std::printf("[ mutations] 2000 corrupted headers, %d still valid records\n", accepted);
}

}  // namespace
}  // namespace essaim
