// Expert slices are byte-identical copies of the source's expert slabs (docs/invariants.md invariant 3), load alone,
// and the backbone file holds everything else unchanged.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "slice/expert_slice.h"
#include "gguf/gguf_file.h"
#include "slice/gguf_slice.h"
#include "slice_test_util.h"

namespace essaim {
namespace {

using testing::expect_backbone_matches_source;
using testing::expect_slice_matches_source;
using testing::make_test_dir;
using testing::TestMoeSpec;
using testing::write_test_moe;

// Cuts `r` out of the file at `path`, reopens the slice alone and compares it with the source.
void check_range(const std::string& path, const SliceRange& r, const std::string& out) {
  Result<GgufFile> src = GgufFile::open(path);
  ASSERT_TRUE(src) << src.status().message();
  Result<MoeLayout> moe = moe_layout(*src);
  ASSERT_TRUE(moe) << moe.status().message();
  Result<OutFile> f = expert_slice_file(*src, *moe, r);
  ASSERT_TRUE(f) << f.status().message();
  Result<WrittenFile> w = write_out_file(*f, out);
  ASSERT_TRUE(w) << w.status().message();
  EXPECT_EQ(w->bytes, f->size());
  EXPECT_EQ(w->sha256, *sha256_file(out));

  Result<ExpertSlice> s = ExpertSlice::open(out);  // the slice alone: the source is not needed to load it
  ASSERT_TRUE(s) << s.status().message();
  EXPECT_EQ(s->source_model(), model_identity(*src));
  EXPECT_EQ(s->source_architecture(), moe->architecture);
  EXPECT_EQ(s->source_block_count(), moe->block_count);
  EXPECT_EQ(s->source_expert_count(), moe->expert_count);
  EXPECT_EQ(s->layer_first(), r.layer_first);
  EXPECT_EQ(s->layer_count(), r.layer_count);
  EXPECT_EQ(s->expert_first(), r.expert_first);
  EXPECT_EQ(s->expert_count(), r.expert_count);
  EXPECT_EQ(s->n_embd(), moe->n_embd);
  EXPECT_EQ(s->n_ff(), moe->n_ff);
  EXPECT_EQ(s->gate_up_fused(), moe->gate_up_fused);
  EXPECT_EQ(s->activation(), ExpertActivation::SWIGLU);
  EXPECT_TRUE(s->holds(r.layer_first, r.expert_first));
  EXPECT_FALSE(s->holds(r.layer_first, r.expert_first + r.expert_count));
  EXPECT_EQ(s->layer(r.layer_first + r.layer_count), nullptr);
  // Not a loadable model: llama.cpp refuses the architecture before looking for tensors.
  EXPECT_EQ(s->gguf().get_string("general.architecture"), std::string(kSliceArchitecture));
  expect_slice_matches_source(*src, *s);
}

struct SpecCase {
  const char* name;
  TestMoeSpec spec;
};

void PrintTo(const SpecCase& c, std::ostream* os) { *os << c.name; }

class SliceTestModel : public ::testing::TestWithParam<SpecCase> {};

TEST_P(SliceTestModel, EverySlabEqualsTheSource) {
  const std::string dir = make_test_dir(std::string("slabs-") + GetParam().name);
  const std::string model = dir + "/model.gguf";
  const TestMoeSpec& spec = GetParam().spec;
  ASSERT_TRUE(write_test_moe(model, spec).is_ok());
  {
    // The seeded weights vary from expert to expert, so a slab taken at a wrong offset cannot pass.
    Result<GgufFile> src = GgufFile::open(model);
    ASSERT_TRUE(src);
    const GgufTensor* t = src->find_tensor(expert_tensor_name(spec.n_layer - 1, ExpertTensorKind::DOWN));
    ASSERT_NE(t, nullptr);
    ASSERT_NE(std::memcmp(t->expert_slab(0).data(), t->expert_slab(1).data(), t->expert_slab_bytes()), 0);
  }
  const uint32_t first_moe = spec.n_dense_layers, n_moe = spec.n_layer - spec.n_dense_layers;
  const SliceRange ranges[] = {
      {first_moe, n_moe, 0, spec.n_expert},          // everything
      {first_moe, 1, 3, 3},                          // one layer, middle experts
      {spec.n_layer - 1, 1, spec.n_expert - 1, 1},   // the very last expert
      {first_moe, n_moe, 0, 1},                      // the first expert of every layer
  };
  int i = 0;
  for (const SliceRange& r : ranges) {
    SCOPED_TRACE("range " + std::to_string(i));
    check_range(model, r, dir + "/slice" + std::to_string(i++) + ".gguf");
  }
}

INSTANTIATE_TEST_SUITE_P(
    Specs, SliceTestModel,
    ::testing::Values(SpecCase{"f32", {}},
                      SpecCase{"q4k_q6k_down", {.expert_type = GgmlType::Q4_K, .down_type = GgmlType::Q6_K}},
                      SpecCase{"fused_q4k", {.expert_type = GgmlType::Q4_K, .fused_gate_up = true}},
                      SpecCase{"align64_q8_0", {.n_expert = 6, .n_embd = 64, .n_ff = 96,
                                                .expert_type = GgmlType::Q8_0, .alignment = 64}},
                      SpecCase{"dense_first", {.n_layer = 4, .n_dense_layers = 1, .n_embd = 64, .n_ff = 32}}),
    [](const ::testing::TestParamInfo<SpecCase>& p) { return std::string(p.param.name); });

// The fixtures were written by llama.cpp's tools, not by essaim.
std::string fixture(const char* name) { return std::string(ESSAIM_FIXTURES_DIR) + "/" + name; }

class SliceFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(SliceFixture, PlanWritesVerifiableSlicesEqualToTheSource) {
  const std::string path = fixture(GetParam());
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  const std::string dir = make_test_dir(std::string("fixture-") + GetParam());
  Result<GgufFile> src = GgufFile::open(path);
  ASSERT_TRUE(src) << src.status().message();
  Result<MoeLayout> moe = moe_layout(*src);
  ASSERT_TRUE(moe) << moe.status().message();
  EXPECT_EQ(moe->expert_count, 8u);
  EXPECT_EQ(moe->n_embd, 256u);
  EXPECT_EQ(moe->n_ff, 256u);
  EXPECT_EQ(moe->layers.size(), 2u);

  // 8 experts in slices of 3: 0-2, 3-5, 6-7 in each layer.
  Result<SliceManifest> plan = plan_manifest(*src, *moe, {.experts_per_slice = 3, .with_backbone = true});
  ASSERT_TRUE(plan) << plan.status().message();
  ASSERT_EQ(plan->slices.size(), 6u);
  EXPECT_EQ(plan->slices[2].expert_first, 6u);
  EXPECT_EQ(plan->slices[2].expert_count, 2u);
  Result<SliceManifest> done = write_plan(*src, *moe, *plan, dir);
  ASSERT_TRUE(done) << done.status().message();
  EXPECT_TRUE(verify_manifest(*done, dir).is_ok());
  Result<SliceManifest> reloaded = SliceManifest::load(dir + "/manifest.json");
  ASSERT_TRUE(reloaded) << reloaded.status().message();
  EXPECT_TRUE(verify_manifest(*reloaded, dir).is_ok());

  for (const ManifestSlice& e : reloaded->slices) {
    SCOPED_TRACE(e.file);
    EXPECT_EQ(std::filesystem::file_size(dir + "/" + e.file), e.bytes);  // the plan's sizes were exact
    Result<ExpertSlice> s = ExpertSlice::open(dir + "/" + e.file);
    ASSERT_TRUE(s) << s.status().message();
    EXPECT_EQ(s->layer_first(), e.layer_first);
    EXPECT_EQ(s->expert_first(), e.expert_first);
    EXPECT_EQ(s->expert_count(), e.expert_count);
    EXPECT_EQ(s->source_model(), reloaded->source_model);
    expect_slice_matches_source(*src, *s);
  }
}

TEST_P(SliceFixture, BackboneKeepsEveryOtherTensorAndKeyUnchanged) {
  const std::string path = fixture(GetParam());
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  const std::string dir = make_test_dir(std::string("backbone-") + GetParam());
  Result<GgufFile> src = GgufFile::open(path);
  ASSERT_TRUE(src);
  Result<MoeLayout> moe = moe_layout(*src);
  ASSERT_TRUE(moe);
  Result<WrittenFile> w = write_out_file(backbone_file(*src, *moe), dir + "/backbone.gguf");
  ASSERT_TRUE(w) << w.status().message();
  Result<GgufFile> bb = GgufFile::open(w->path);
  ASSERT_TRUE(bb) << bb.status().message();

  expect_backbone_matches_source(*src, *moe, *bb);
  // The backbone names its source; the backbone's own header hash is a different thing.
  EXPECT_EQ(bb->get_string(kBackboneKeySourceModel), digest_hex(model_identity(*src)));
  EXPECT_EQ(*source_model_identity(*bb), model_identity(*src));
  EXPECT_NE(model_identity(*bb), model_identity(*src));
  // And it cannot be sliced again: its experts are gone.
  Result<MoeLayout> again = moe_layout(*bb);
  ASSERT_FALSE(again);
  EXPECT_NE(again.status().message().find("backbone"), std::string::npos) << again.status().message();
}

INSTANTIATE_TEST_SUITE_P(LlamaCpp, SliceFixture,
                         ::testing::Values("qwen3moe-small-q4k.gguf", "qwen35moe-small-q4k.gguf",
                                           "qwen3moe-small-f32.gguf"),
                         [](const ::testing::TestParamInfo<const char*>& p) {
                           std::string n = p.param;
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

}  // namespace
}  // namespace essaim
