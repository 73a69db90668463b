// Slicing the models `essaim synth` writes (llama.cpp's conventions, both architectures, f32 and q4_k_m,
// fused gate_up and MTP blocks): every slab equal to the source's, the backbone unchanged, the manifest
// verified.
#include <gtest/gtest.h>

#include "slice/expert_slice.h"
#include "slice/gguf_slice.h"
#include "slice_test_util.h"
#include "synth/synth.h"

namespace essaim {
namespace {

struct SynthCase {
  const char* name;
  SynthOptions options;
};

void PrintTo(const SynthCase& c, std::ostream* os) { *os << c.name; }

class SliceSynth : public ::testing::TestWithParam<SynthCase> {};

TEST_P(SliceSynth, PlanSlicesAndBackboneMatchTheSource) {
  const std::string dir = testing::make_test_dir(std::string("synth-") + GetParam().name);
  const std::string model = dir + "/model.gguf";
  Result<SynthPlan> sp = synth_plan(GetParam().options);
  ASSERT_TRUE(sp) << sp.status().message();
  ASSERT_TRUE(synth_write(*sp, model));
  Result<GgufFile> src = GgufFile::open(model);
  ASSERT_TRUE(src) << src.status().message();
  Result<MoeLayout> moe = moe_layout(*src);
  ASSERT_TRUE(moe) << moe.status().message();
  EXPECT_EQ(moe->expert_count, sp->hp.n_expert);
  EXPECT_EQ(moe->n_ff, sp->hp.expert_ff);
  EXPECT_EQ(moe->n_embd, sp->hp.n_embd);
  EXPECT_EQ(moe->gate_up_fused, GetParam().options.fused_gate_up);
  EXPECT_EQ(moe->layers.size(), sp->hp.block_count());  // MTP blocks carry experts too

  // 6 experts in slices of 4: 0-3 and 4-5 per layer.
  Result<SliceManifest> plan = plan_manifest(*src, *moe, {.experts_per_slice = 4, .with_backbone = true});
  ASSERT_TRUE(plan) << plan.status().message();
  ASSERT_EQ(plan->slices.size(), 2 * moe->layers.size());
  Result<SliceManifest> done = write_plan(*src, *moe, *plan, dir + "/out");
  ASSERT_TRUE(done) << done.status().message();
  EXPECT_TRUE(verify_manifest(*done, dir + "/out").is_ok());
  for (const ManifestSlice& e : done->slices) {
    SCOPED_TRACE(e.file);
    Result<ExpertSlice> s = ExpertSlice::open(dir + "/out/" + e.file);
    ASSERT_TRUE(s) << s.status().message();
    EXPECT_EQ(s->source_architecture(), synth_arch_name(GetParam().options.arch));
    EXPECT_EQ(s->expert_used_count(), sp->hp.n_expert_used);
    testing::expect_slice_matches_source(*src, *s);
  }
  Result<GgufFile> bb = GgufFile::open(dir + "/out/" + done->backbone->file);
  ASSERT_TRUE(bb) << bb.status().message();
  testing::expect_backbone_matches_source(*src, *moe, *bb);
}

INSTANTIATE_TEST_SUITE_P(
    Synth, SliceSynth,
    ::testing::Values(
        SynthCase{"qwen3moe_f32", {.arch = SynthArch::QWEN3MOE, .types = SynthTypeMix::F32}},
        SynthCase{"qwen3moe_q4_k_m", {.arch = SynthArch::QWEN3MOE, .types = SynthTypeMix::Q4_K_M}},
        SynthCase{"qwen35moe_q4_k_m", {.arch = SynthArch::QWEN35MOE, .types = SynthTypeMix::Q4_K_M}},
        SynthCase{"qwen35moe_fused_mtp_q4_k_m", {.arch = SynthArch::QWEN35MOE, .types = SynthTypeMix::Q4_K_M,
                                                 .nextn = 1, .fused_gate_up = true}}),
    [](const ::testing::TestParamInfo<SynthCase>& p) { return std::string(p.param.name); });

}  // namespace
}  // namespace essaim
