// `essaim synth --weights DIR`: a plan's tensors taken from .npy files, converted with the reference quantisers
// (llama.cpp's bytes); every tensor must have its file with its shape, and no stray file is accepted.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "core/npy.h"
#include "kernels/quantize.h"
#include "synth/synth_quant_rule.h"
#include "synth_test_util.h"

namespace essaim {
namespace {

using namespace synth_test;

// Deterministic values per tensor: a slow sine whose phase depends on the tensor's position in the plan.
std::vector<float> values_for(size_t index, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 0.05f * std::sin(0.37f * float(i) + float(index)) + 0.001f * float(index);
  return v;
}

std::string write_weights(const SynthPlan& plan, const std::string& name) {
  const std::filesystem::path dir = scratch_dir() / name;
  std::filesystem::create_directories(dir);
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const SynthTensor& t = plan.tensors[i];
    std::vector<int64_t> shape(t.ne.rbegin(), t.ne.rend());
    size_t n = 1;
    for (int64_t d : shape) n *= size_t(d);
    EXPECT_TRUE(npy_write_f32((dir / (t.name + ".npy")).string(), shape, values_for(i, n)).is_ok());
  }
  return dir.string();
}

SynthOptions small_options(SynthTypeMix types) {
  return {.arch = SynthArch::QWEN35MOE, .preset = SynthPreset::SMALL, .types = types, .nextn = 1};
}

class SynthWeightsTypes : public ::testing::TestWithParam<SynthTypeMix> {};

TEST_P(SynthWeightsTypes, EveryTensorHoldsItsValuesInItsType) {
  SynthOptions o = small_options(GetParam());
  Result<SynthPlan> plan = synth_plan(o);
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  o.weights_dir = write_weights(*plan, "w_" + std::string(synth_type_mix_name(GetParam())));
  const std::string path = scratch_file("weights_" + std::string(synth_type_mix_name(GetParam())) + ".gguf");
  write_model(o, path);
  Result<GgufFile> f = GgufFile::open(path);
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  for (size_t i = 0; i < plan->tensors.size(); ++i) {
    const SynthTensor& t = plan->tensors[i];
    const GgufTensor* g = f->find_tensor(t.name);
    ASSERT_NE(g, nullptr) << t.name;
    ASSERT_EQ(g->type, t.type) << t.name;
    const std::vector<float> v = values_for(i, size_t(t.ne[0]) * t.rows());
    const uint64_t row_bytes = t.nbytes / t.rows();
    std::vector<uint8_t> want(row_bytes);
    for (uint64_t r = 0; r < t.rows(); r += std::max<uint64_t>(1, t.rows() / 7)) {
      quantize_row(t.type, v.data() + r * uint64_t(t.ne[0]), want.data(), t.ne[0]);
      ASSERT_EQ(0, std::memcmp(want.data(), g->data + r * row_bytes, row_bytes)) << t.name << " row " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Mixes, SynthWeightsTypes,
                         ::testing::Values(SynthTypeMix::F32, SynthTypeMix::BF16, SynthTypeMix::Q8_0,
                                           SynthTypeMix::Q4_K_M),
                         [](const auto& info) { return std::string(synth_type_mix_name(info.param)); });

TEST(SynthWeights, SmallPresetTypesFollowTheRuleWithTheQ8_0Fallback) {
  Result<SynthPlan> plan = synth_plan(small_options(SynthTypeMix::Q4_K_M));
  ASSERT_TRUE(plan.is_ok());
  for (const SynthTensor& t : plan->tensors) {
    if (t.kind == TensorName::FFN_DOWN_EXPS) EXPECT_EQ(t.type, GgmlType::Q8_0) << t.name;  // ne[0] = 32
    if (t.kind == TensorName::FFN_GATE_EXPS) EXPECT_EQ(t.type, GgmlType::Q4_K) << t.name;
    if (t.kind == TensorName::FFN_GATE_INP) {
      EXPECT_EQ(t.type, GgmlType::F32) << t.name;
    }
  }
  Result<SynthPlan> bf16 = synth_plan(small_options(SynthTypeMix::BF16));
  ASSERT_TRUE(bf16.is_ok());
  for (const SynthTensor& t : bf16->tensors)
    EXPECT_EQ(t.type, t.ne.size() >= 2 && t.kind != TensorName::FFN_GATE_INP &&
                              t.kind != TensorName::SSM_CONV1D
                          ? GgmlType::BF16
                          : GgmlType::F32)
        << t.name;
  EXPECT_EQ(synth_file_type(SynthTypeMix::BF16), 32u);
  EXPECT_EQ(synth_file_type(SynthTypeMix::Q8_0), 7u);
}

TEST(SynthWeights, MissingWrongShapeAndStrayFilesAreRefusedBeforeWriting) {
  SynthOptions o = small_options(SynthTypeMix::F32);
  Result<SynthPlan> plan = synth_plan(o);
  ASSERT_TRUE(plan.is_ok());
  const std::filesystem::path dir = write_weights(*plan, "w_bad");
  o.weights_dir = dir.string();
  const std::string path = scratch_file("bad.gguf");
  const auto refusal = [&]() -> std::string {
    Result<SynthPlan> p = synth_plan(o);
    EXPECT_TRUE(p.is_ok());
    Result<SynthSummary> s = synth_write(*p, path);
    EXPECT_FALSE(std::filesystem::exists(path));
    EXPECT_FALSE(std::filesystem::exists(path + ".part"));
    return s.is_ok() ? "" : s.status().message();
  };
  const std::filesystem::path victim = dir / "blk.3.attn_q.weight.npy";
  ASSERT_TRUE(npy_write_f32((dir / "blk.3.atn_q.weight.npy").string(), {2}, std::vector<float>{1, 2}).is_ok());
  EXPECT_NE(refusal().find("blk.3.atn_q.weight.npy: no tensor of this plan"), std::string::npos) << refusal();
  std::filesystem::remove(dir / "blk.3.atn_q.weight.npy");
  ASSERT_TRUE(npy_write_f32(victim.string(), {2, 256}, std::vector<float>(512, 0.f)).is_ok());
  EXPECT_NE(refusal().find("shape (2, 256), the plan needs (512, 256)"), std::string::npos) << refusal();
  std::filesystem::remove(victim);
  EXPECT_NE(refusal().find("blk.3.attn_q.weight.npy"), std::string::npos) << refusal();
  std::vector<float> nan(512 * 256, 0.f);
  nan[7] = std::nanf("");
  ASSERT_TRUE(npy_write_f32(victim.string(), {512, 256}, nan).is_ok());
  EXPECT_NE(refusal().find("not finite"), std::string::npos) << refusal();
}

}  // namespace
}  // namespace essaim
