// The worker's answers are bit-identical to the backbone's own LocalExpertExecutor over the full model
// (docs/invariants.md invariant 1), for random batches, several slices, F32 and Q4_K_M experts, qwen3moe and
// qwen35moe (separate and fused gate_up), Q8_K and F32 activations, many requests in flight.
#include <gtest/gtest.h>

#include <bit>
#include <set>

#include "worker_test_util.h"

namespace essaim::worker::testing {
namespace {

struct Case {
  const char* name;
  ModelSpec spec;
};

class WorkerExactTest : public ::testing::TestWithParam<Case> {};

// Two slices of layer 0 and one of the last MoE layer: holdings the way a plan cuts them.
TEST_P(WorkerExactTest, RandomBatchesMatchTheBackboneBitForBit) {
  const TestModel& m = TestModel::get(GetParam().spec);
  const uint32_t X = m.moe.expert_count;
  const uint32_t first = m.moe.layers.front().layer, last = m.moe.layers.back().layer;
  ASSERT_GE(X, 4u);
  const uint32_t half = X / 2;
  ServedWorker w({m.slice(first, 1, 0, half), m.slice(first, 1, half, X - half), m.slice(last, 1, 1, X - 2)});
  std::unique_ptr<net::FrameConnection> c = w.connect();

  std::mt19937_64 rng(20240611);
  std::vector<proto::ExpertRequest> reqs;
  uint64_t id = 1;
  for (int i = 0; i < 4; ++i) {
    // Across both slices of the first layer (one request, two ranges), and within the last layer's range.
    reqs.push_back(random_request(m, {.layer = first, .first = 0, .count = X}, rng,
                                  {.n_rows = 7, .max_k = 3, .f32 = false, .request_id = id++}));
    reqs.push_back(random_request(m, {.layer = last, .first = 1, .count = X - 2}, rng,
                                  {.n_rows = 3, .max_k = 2, .f32 = false, .request_id = id++}));
  }
  // F32 rows: the worker quantises them itself, exactly as the backbone does.
  reqs.push_back(random_request(m, {.layer = first, .first = 0, .count = X}, rng,
                                {.n_rows = 4, .max_k = 2, .f32 = true, .request_id = id++}));
  // One expert per row (the worker's no-copy path) and a single row.
  reqs.push_back(random_request(m, {.layer = last, .first = 1, .count = X - 2}, rng,
                                {.n_rows = 6, .max_k = 1, .f32 = false, .request_id = id++}));
  reqs.push_back(random_request(m, {.layer = first, .first = half, .count = X - half}, rng,
                                {.n_rows = 1, .max_k = 2, .f32 = false, .request_id = id++}));

  std::vector<proto::ExpertResponse> got = exchange_all(*c, reqs);
  ASSERT_EQ(got.size(), reqs.size());
  std::set<uint32_t> first_bits;  // the inputs vary, so the outputs do
  for (size_t i = 0; i < reqs.size(); ++i) {
    const std::vector<float> want = reference_outputs(m, reqs[i]);
    EXPECT_EQ(got[i].request_id, reqs[i].request_id);
    EXPECT_EQ(got[i].n_outputs, reqs[i].n_pairs());
    EXPECT_EQ(got[i].n_embd, m.n_embd());
    expect_bits_equal(got[i].outputs, want, "request " + std::to_string(reqs[i].request_id));
    for (size_t p = 0; p < reqs[i].n_pairs(); ++p) first_bits.insert(std::bit_cast<uint32_t>(want[p * m.n_embd()]));
  }
  EXPECT_GT(first_bits.size(), 20u);

  const WorkerStats s = stats_after(w.worker(), reqs.size());
  uint64_t pairs = 0, rows = 0;
  for (const auto& r : reqs) pairs += r.n_pairs(), rows += r.n_rows();
  EXPECT_EQ(s.pairs, pairs);
  EXPECT_EQ(s.rows, rows);
  EXPECT_GT(s.bytes_in, 0u);
  EXPECT_GT(s.bytes_out, pairs * m.n_embd() * sizeof(float));
  for (uint64_t e : s.errors) EXPECT_EQ(e, 0u);
}

// A layer range slice (both layers in one file) serves both layers; lanes and threads change no bit.
TEST_P(WorkerExactTest, MultiLayerSliceAndLanesChangeNothing) {
  const TestModel& m = TestModel::get(GetParam().spec);
  const uint32_t first = m.moe.layers.front().layer;
  const uint32_t n_moe = uint32_t(m.moe.layers.size());
  if (m.moe.layers.back().layer != first + n_moe - 1) GTEST_SKIP() << "MoE layers are not contiguous";
  ServedWorker w({m.slice(first, n_moe, 0, m.moe.expert_count)}, {.threads = 4, .lanes = 2});
  std::unique_ptr<net::FrameConnection> c = w.connect();
  std::mt19937_64 rng(7);
  std::vector<proto::ExpertRequest> reqs;
  for (uint64_t i = 0; i < 12; ++i)
    reqs.push_back(random_request(m, {.layer = first + uint32_t(i % n_moe), .first = 0, .count = m.moe.expert_count},
                                  rng, {.n_rows = 9, .max_k = m.moe.expert_used_count, .request_id = 100 + i}));
  std::vector<proto::ExpertResponse> got = exchange_all(*c, reqs);
  ASSERT_EQ(got.size(), reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i)
    expect_bits_equal(got[i].outputs, reference_outputs(m, reqs[i]), "request " + std::to_string(i));
}

INSTANTIATE_TEST_SUITE_P(
    Models, WorkerExactTest,
    ::testing::Values(Case{"Qwen3MoeF32", {.arch = SynthArch::QWEN3MOE, .types = SynthTypeMix::F32}},
                      Case{"Qwen3MoeQ4KM", {.arch = SynthArch::QWEN3MOE, .types = SynthTypeMix::Q4_K_M}},
                      Case{"Qwen35MoeQ4KM", {.arch = SynthArch::QWEN35MOE, .types = SynthTypeMix::Q4_K_M}},
                      Case{"Qwen35MoeFusedQ4KM",
                           {.arch = SynthArch::QWEN35MOE, .types = SynthTypeMix::Q4_K_M, .fused_gate_up = true}}),
    [](const ::testing::TestParamInfo<Case>& p) { return std::string(p.param.name); });

// A backbone that quantises its own rows and a worker given those bytes: the pure function of docs/invariants.md.
TEST(WorkerExact, DirectComputeEqualsTheBackboneForEveryExpert) {
  const TestModel& m = TestModel::get({.types = SynthTypeMix::Q4_K_M});
  const uint32_t layer = m.moe.layers.front().layer;
  ServedWorker w({m.slice(layer, 1, 0, m.moe.expert_count)});
  std::mt19937_64 rng(3);
  proto::ExpertRequest r = random_request(m, {.layer = layer, .first = 0, .count = m.moe.expert_count}, rng,
                                          {.n_rows = 4, .max_k = m.moe.expert_count, .request_id = 9});
  ASSERT_EQ(r.row_expert_counts[0], m.moe.expert_count);  // row 0 touches every expert
  std::unique_ptr<net::FrameConnection> c = w.connect();
  std::vector<proto::ExpertResponse> got = exchange_all(*c, {r});
  ASSERT_EQ(got.size(), 1u);
  expect_bits_equal(got[0].outputs, reference_outputs(m, r));
}

}  // namespace
}  // namespace essaim::worker::testing
