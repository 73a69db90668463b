// Golden greedy output of the tiny synthetic qwen3moe models, fixed here: a change in any number the engine
// computes (kernels, attention, routing, combine order) changes these ids, and must then be deliberate —
// re-derive the ids and say why in the commit. The models come from the synth library with a fixed seed
// (synth promises byte-identical files for the same options); the file's SHA-256 is pinned too, so a
// change in synth's bytes is told apart from a change in the engine's numbers.
#include <gtest/gtest.h>

#include <cstdio>

#include "slice/model_identity.h"
#include "model_test_util.h"
#include "synth/synth.h"

namespace essaim {
namespace {

std::string synth_tiny(SynthTypeMix types, const std::string& name) {
  const std::string path = std::string(ESSAIM_BINARY_DIR) + "/" + name;
  Result<SynthPlan> plan = synth_plan({.arch = SynthArch::QWEN3MOE, .preset = SynthPreset::TINY, .types = types, .seed = 1});
  EXPECT_TRUE(plan.is_ok()) << plan.status().message();
  Result<SynthSummary> s = synth_write(*plan, path);
  EXPECT_TRUE(s.is_ok()) << s.status().message();
  return path;
}

const std::vector<int32_t> kPrompt = {9, 120, 33, 7, 250, 101, 64, 18};

struct Golden {
  SynthTypeMix types;
  const char* file;
  const char* sha256;  // of the synthesised file
  std::vector<int32_t> ids;
};

class GoldenGreedy : public ::testing::TestWithParam<Golden> {};

TEST_P(GoldenGreedy, TinySynthModelGeneratesTheFixedIds) {
  const Golden& g = GetParam();
  const std::string path = synth_tiny(g.types, g.file);
  Result<Sha256Digest> digest = sha256_file(path);
  ASSERT_TRUE(digest.is_ok()) << digest.status().message();
  EXPECT_EQ(digest_hex(*digest), g.sha256)
      << "the synth library now writes other bytes for the same options: re-derive the golden ids below";
  std::unique_ptr<Model> m = test::load_or_die(path);
  ASSERT_TRUE(m);
  const std::vector<int32_t> got = test::greedy(*m, kPrompt, 16, 2);
  std::string printed;
  for (int32_t id : got) printed += std::to_string(id) + ", ";
  EXPECT_EQ(got, g.ids) << "generated: " << printed;
  // The same ids with one thread.
  EXPECT_EQ(test::greedy(*m, kPrompt, 16, 1), got);
  std::remove(path.c_str());
}

INSTANTIATE_TEST_SUITE_P(
    Qwen3Moe, GoldenGreedy,
    ::testing::Values(Golden{SynthTypeMix::F32, "golden_tiny_f32.gguf",
                             "7d5232b36969666efd55d3681636feea9021b4d0df7cae0244ff51b706014d84",
                             {62, 54, 489, 58, 339, 21, 306, 523, 318, 72, 285, 469, 367, 352, 277, 520}},
                      Golden{SynthTypeMix::Q4_K_M, "golden_tiny_q4km.gguf",
                             "5cb95cace5e38a38fb0567c56085555549ca07302bf88f50443ca3561eb7b614",
                             {332, 288, 281, 321, 273, 374, 306, 473, 453, 85, 511, 342, 438, 293, 502, 434}}),
    [](const auto& info) { return std::string(synth_type_mix_name(info.param.types) == "f32" ? "F32" : "Q4_K_M"); });

}  // namespace
}  // namespace essaim
