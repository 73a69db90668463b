// The lean wire (--expert-output bf16, protocol v3): expert outputs rounded to bf16 wherever they are
// computed. Each test compares against a reference computed another way:
// - the local executor in bf16 mode = the f32 local executor's rows rounded one by one (round to nearest even);
// - two `essaim-worker` processes over TCP in bf16 mode = the monolithic run in bf16 mode, logits bit for bit,
//   for the three exactness models, with half the answer bytes of f32 mode and no fallback;
// - a worker that goes down mid-run, and a worker that refuses bf16 (only_output = f32): the backbone's
//   fallback rounds the same way, so the logits still equal the monolithic bf16 ones;
// - bf16 mode really changes the logits (a test that compared f32 with f32 could not fail).
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "core/fp16.h"

#include "backbone_test_util.h"

namespace essaim::backbone::testing {
namespace {

class LeanWire : public ::testing::TestWithParam<ModelSpec> {};

DispatchOptions bf16_options() {
  DispatchOptions o = patient_options();
  o.expert_output = ExpertOutput::BF16;
  return o;
}

TEST(LeanWireLocal, Bf16ModeIsTheF32ResultRoundedToNearestEven) {
  const SwarmModel& m = SwarmModel::get({});
  ThreadPool pool(2);
  const int32_t layer = int32_t(m.moe_layers.front());
  const ExpertLayer* l = m.model->expert_store().any(layer);
  ASSERT_NE(l, nullptr);
  constexpr int64_t n = 5;
  constexpr int32_t k = 2;
  std::mt19937_64 rng(21);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> f(size_t(n) * size_t(l->n_embd));
  for (float& v : f) v = normal(rng);
  std::vector<uint8_t> act(size_t(n) * l->activation_row_bytes());
  quantize_activations(l->gate.type, f.data(), n, l->n_embd, act.data());
  std::vector<int32_t> ids;
  for (int64_t r = 0; r < n * k; ++r) ids.push_back(r == 3 ? -1 : int32_t(rng() % m.n_expert));
  const ExpertBatch b{.layer = layer, .n_rows = n, .k = k, .act_type = l->activation_type(), .act = act, .ids = ids};
  const size_t E = size_t(l->n_embd);
  std::vector<float> f32(size_t(n * k) * E, 7.0f), bf16(f32.size(), 7.0f);
  ASSERT_TRUE(LocalExpertExecutor(m.model->expert_store(), &pool).compute(b, f32).is_ok());
  ASSERT_TRUE(LocalExpertExecutor(m.model->expert_store(), &pool, ExpertOutput::BF16).compute(b, bf16).is_ok());
  size_t changed = 0;
  for (size_t i = 0; i < f32.size(); ++i) {
    const bool requested = ids[i / E] != -1;
    const float want = requested ? bf16_to_f32(f32_to_bf16(f32[i])) : 7.0f;  // untouched slots stay untouched
    ASSERT_EQ(f32_bits(bf16[i]), f32_bits(want)) << "value " << i;
    ASSERT_EQ(f32_bits(bf16[i]) & 0xFFFFu, 0u);
    changed += f32_bits(bf16[i]) != f32_bits(f32[i]) ? 1 : 0;
  }
  EXPECT_GT(changed, f32.size() / 2);  // most f32 values are not bf16 values
}

TEST_P(LeanWire, WorkerProcessesInBf16EqualMonolithicBf16BitForBitWithHalfTheAnswerBytes) {
  const SwarmModel& m = SwarmModel::get(GetParam());
  constexpr uint32_t kWorkers = 2;
  WorkerSwarm swarm = start_worker_swarm(m, kWorkers);
  ASSERT_TRUE(swarm.ok());
  const ExpertMap& map = swarm.map;
  ThreadPool pool(2);
  const std::vector<int32_t> tokens = m.tokens(7);
  const size_t n_embd = size_t(m.model->info().n_embd);

  LocalExpertExecutor mono_bf16(m.model->expert_store(), &pool, ExpertOutput::BF16);
  const std::vector<float> want = eval_logits(m, tokens, mono_bf16);
  const std::vector<float> f32 = mono_logits(m, tokens);
  ASSERT_EQ(want.size(), f32.size());
  EXPECT_NE(std::memcmp(want.data(), f32.data(), want.size() * sizeof(float)), 0)
      << "bf16 mode left every logit unchanged: the rounding is not applied";

  DispatchStats stats[2];
  for (ExpertOutput mode : {ExpertOutput::F32, ExpertOutput::BF16}) {
    DispatchOptions o = patient_options();
    o.expert_output = mode;
    Result<std::unique_ptr<RemoteExpertExecutor>> remote =
        RemoteExpertExecutor::create(m.model->expert_store(), m.identity, map, &pool, o);
    ASSERT_TRUE(remote.is_ok()) << remote.status().message();
    ASSERT_EQ((*remote)->wait_connected(net::deadline_in(30s)), kWorkers) << (*remote)->stats().to_json();
    // Prefill at once, then one token at a time: both shapes of request.
    expect_same_bits(eval_logits(m, tokens, **remote), mode == ExpertOutput::BF16 ? want : f32, "all at once");
    expect_same_bits(eval_logits(m, tokens, **remote, 1), mode == ExpertOutput::BF16 ? want : f32, "one by one");
    stats[size_t(mode)] = (*remote)->stats();
    EXPECT_EQ(stats[size_t(mode)].fallbacks(), 0u) << stats[size_t(mode)].to_json();
    EXPECT_EQ(stats[size_t(mode)].pairs_remote, stats[size_t(mode)].pairs) << stats[size_t(mode)].to_json();
  }
  // Same requests, same pairs; an answer is a frame header, 17 bytes of fields, then 2 bytes a value
  // instead of 4: exactly 2·pairs·n_embd bytes fewer received, requests unchanged.
  const DispatchStats& a = stats[0];
  const DispatchStats& b = stats[1];
  ASSERT_EQ(a.pairs, b.pairs);
  ASSERT_EQ(a.responses, b.responses);
  uint64_t sent_a = 0, sent_b = 0, recv_a = 0, recv_b = 0;
  for (const LayerWire& w : a.layers) sent_a += w.bytes_sent, recv_a += w.bytes_received;
  for (const LayerWire& w : b.layers) sent_b += w.bytes_sent, recv_b += w.bytes_received;
  EXPECT_EQ(sent_a, sent_b);
  EXPECT_EQ(recv_a - recv_b, 2 * a.pairs_remote * n_embd);
  EXPECT_EQ(recv_b - a.responses * (proto::kFrameHeaderBytes + 17), 2 * b.pairs_remote * n_embd);
}

INSTANTIATE_TEST_SUITE_P(Models, LeanWire, ::testing::ValuesIn(exactness_specs()),
                         [](const auto& info) { return spec_name(info.param); });

TEST(LeanWireFallback, AWorkerGoingDownOrRefusingBf16LeavesTheBf16LogitsUnchanged) {
  const SwarmModel& m = SwarmModel::get({});
  ThreadPool pool(2);
  const std::vector<std::vector<std::string>> parts = m.split_experts(2);
  PipeWorker lean(parts[0]);
  worker::WorkerOptions f32_only;
  f32_only.only_output = ExpertOutput::F32;
  PipeWorker stubborn(parts[1], f32_only);
  std::unique_ptr<RemoteExpertExecutor> ex = RemoteExpertExecutor::create(
      m.model->expert_store(), m.identity, {lean.endpoint("lean"), stubborn.endpoint("f32-only")}, &pool,
      bf16_options());
  ASSERT_EQ(ex->wait_connected(net::deadline_in(10s)), 2u);
  LocalExpertExecutor mono_bf16(m.model->expert_store(), &pool, ExpertOutput::BF16);
  const std::vector<int32_t> tokens = m.tokens(6, 3);
  const std::vector<float> want = eval_logits(m, tokens, mono_bf16);

  // The f32-only worker answers BAD_ENCODING: its pairs are recomputed (and rounded) on the backbone.
  expect_same_bits(eval_logits(m, tokens, *ex), want, "one worker refuses bf16");
  DispatchStats s = ex->stats();
  EXPECT_GT(s.fallback_pairs[size_t(FallbackReason::ERROR_RESPONSE)], 0u) << s.to_json();
  EXPECT_GT(s.workers[0].pairs_served, 0u) << s.to_json();
  EXPECT_EQ(s.workers[1].pairs_served, 0u) << s.to_json();

  // The bf16 worker down: everything from the replica, in bf16, the same bits.
  lean.down();
  expect_same_bits(eval_logits(m, tokens, *ex, 2), want, "the other worker down");
  EXPECT_GT(ex->stats().fallbacks(), s.fallbacks());
}

}  // namespace
}  // namespace essaim::backbone::testing
