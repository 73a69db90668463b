// The GPU executor's pipeline (src/gpu/expert_pipeline.h) on a host device whose products run the device
// kernels' code compiled for the CPU, against LocalExpertExecutor over the same experts: random [rows][k]
// batches with unrequested slots, Q4_K_M (Q4_K gate/up, Q6_K down) and F32 experts, separate and fused
// gate_up, weights placed as the upload plan places them. Runs on every machine: it checks the grouping,
// the lanes4 layouts, the host SwiGLU and quantisation, the scatter and the kernels' arithmetic — all of a
// GPU worker but the CUDA runtime and the device's own instructions.
#include <gtest/gtest.h>

#include <bit>
#include <random>
#include <set>

#include "gpu/expert_pipeline.h"
#include "gpu/upload_plan.h"
#include "kernels/matmul.h"
#include "worker_test_util.h"

namespace essaim::worker::testing {
namespace {

struct Case {
  const char* name;
  ModelSpec spec;
};

class GpuPipelineHostTest : public ::testing::TestWithParam<Case> {};

// The range's bytes copied as the executor uploads them (upload_plan spans), views placed in the copies.
struct HostUpload {
  std::vector<std::vector<uint8_t>> spans;
  gpu::DeviceRangeViews views;
  explicit HostUpload(const ExpertLayer& l) {
    const gpu::UploadPlan p = gpu::upload_plan(l);
    for (const gpu::ByteSpan& s : p.spans) spans.emplace_back(s.begin, s.end);
    auto at = [&](const gpu::ViewPlace& v) { return spans[v.span].data() + v.offset; };
    views = {.gate = at(p.gate), .up = at(p.up), .down = at(p.down)};
  }
};

TEST_P(GpuPipelineHostTest, MatchesLocalExecutorBitForBit) {
  const TestModel& m = TestModel::get(GetParam().spec);
  LocalExpertExecutor cpu(m.full, nullptr);
  ThreadPool pool(2);
  gpu::HostTileDevice device;
  gpu::PipelineScratch scratch;
  std::mt19937_64 rng(4242);
  const int32_t X = int32_t(m.moe.expert_count), E = int32_t(m.n_embd());
  std::set<uint32_t> seen;
  for (const MoeLayer& ml : m.moe.layers) {
    const int32_t layer = int32_t(ml.layer);
    std::span<const ExpertLayer> ranges = m.full.ranges(layer);
    ASSERT_EQ(ranges.size(), 1u);
    const ExpertLayer& l = ranges.front();
    const HostUpload up(l);
    for (int64_t n : {1, 6, 9}) {  // 9 rows: partial tiles of four
      const int32_t k = 3;
      std::vector<float> f(size_t(n) * size_t(E));
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (float& v : f) v = normal(rng);
      std::vector<uint8_t> act(size_t(n) * l.activation_row_bytes());
      quantize_activations(l.gate.type, f.data(), n, E, act.data());
      std::vector<int32_t> ids(size_t(n) * k);
      for (int64_t r = 0; r < n; ++r)
        for (int32_t s = 0; s < k; ++s) ids[size_t(r * k + s)] = (s == 1 && r % 4 == 1) ? -1 : int32_t(rng() % uint64_t(X));
      const ExpertBatch batch{.layer = layer, .n_rows = n, .k = k, .act_type = l.activation_type(), .act = act, .ids = ids};
      std::vector<float> want(size_t(n) * k * E, -3.5f), got(want.size(), -3.5f);
      ASSERT_TRUE(cpu.compute(batch, want).is_ok());
      ASSERT_TRUE(validate_expert_batch(batch, l, got.size()).is_ok());
      const Status s = gpu::expert_pipeline_run(l, up.views, batch, got.data(), device, scratch, &pool);
      ASSERT_TRUE(s.is_ok()) << s.message();
      expect_bits_equal(got, want, std::string(GetParam().name) + " layer " + std::to_string(layer) + " n=" + std::to_string(n));
      for (size_t i = 0; i < want.size(); i += size_t(E)) seen.insert(std::bit_cast<uint32_t>(want[i]));
    }
  }
  EXPECT_GT(device.products(), 0);
  EXPECT_GT(seen.size(), size_t(10));  // the outputs vary (and include the untouched -3.5 slots)
}

// The activation layouts: Q4_K and Q5_K kernels read lanes4 rows, the others the plain format.
TEST(GpuPipelineLayoutTest, OnlyQ4kAndQ5kRowsArePrepared) {
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K}) EXPECT_TRUE(gpu::activation_layout_prepared(t));
  for (GgmlType t : {GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::F32, GgmlType::F16, GgmlType::BF16})
    EXPECT_FALSE(gpu::activation_layout_prepared(t));
}

INSTANTIATE_TEST_SUITE_P(Models, GpuPipelineHostTest,
                         ::testing::Values(Case{"Qwen3MoeQ4KM", {.types = SynthTypeMix::Q4_K_M}},
                                           Case{"Qwen3MoeF32", {.types = SynthTypeMix::F32}},
                                           Case{"Qwen35MoeQ4KM", {.arch = SynthArch::QWEN35MOE, .types = SynthTypeMix::Q4_K_M}},
                                           Case{"Qwen35MoeQ4KMFused", {.arch = SynthArch::QWEN35MOE,
                                                                       .types = SynthTypeMix::Q4_K_M,
                                                                       .fused_gate_up = true}}),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace essaim::worker::testing
