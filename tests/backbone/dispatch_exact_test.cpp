// Exactness of dispatch in-process (docs/invariants.md invariants 1 and 2): the backbone with its experts on real
// worker cores, reached over in-memory pipes, gives the monolithic logits bit for bit — all experts remote,
// some remote, replicas, batches split to fit small frames, a worker going down and coming back — for
// qwen3moe q4_k_m and f32 and qwen35moe q4_k_m.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "backbone_test_util.h"

namespace essaim::backbone::testing {
namespace {

std::unique_ptr<RemoteExpertExecutor> connect(const SwarmModel& m, std::vector<DispatchEndpoint> endpoints,
                                              ThreadPool* pool, DispatchOptions options = patient_options()) {
  const size_t n = endpoints.size();
  auto ex = RemoteExpertExecutor::create(m.model->expert_store(), m.identity, std::move(endpoints), pool, options);
  EXPECT_EQ(ex->wait_connected(net::deadline_in(30s)), n);
  return ex;
}

void expect_accounting(const DispatchStats& s) {
  EXPECT_EQ(s.pairs, s.pairs_remote + s.pairs_local + s.pairs_fallback) << s.to_json();
  uint64_t served = 0;
  for (const WorkerReport& w : s.workers) served += w.pairs_served;
  EXPECT_EQ(served, s.pairs_remote) << s.to_json();
}

class DispatchExact : public ::testing::TestWithParam<ModelSpec> {};

TEST_P(DispatchExact, EveryExpertOnThreeWorkersGivesTheMonolithicLogits) {
  const SwarmModel& m = SwarmModel::get(GetParam());
  const std::vector<int32_t> tokens = m.tokens(16);
  const std::vector<float> want = mono_logits(m, tokens);
  const auto parts = m.split_experts(3);
  std::vector<std::unique_ptr<PipeWorker>> workers;
  std::vector<DispatchEndpoint> endpoints;
  for (size_t i = 0; i < parts.size(); ++i) {
    workers.push_back(std::make_unique<PipeWorker>(parts[i]));
    endpoints.push_back(workers.back()->endpoint("w" + std::to_string(i)));
  }
  ThreadPool pool(2);
  auto ex = connect(m, std::move(endpoints), &pool);

  expect_same_bits(eval_logits(m, tokens, *ex), want, "prefill");
  expect_same_bits(eval_logits(m, tokens, *ex, /*batch=*/1), want, "one token at a time");
  expect_same_bits(eval_logits(m, tokens, *ex, /*batch=*/5), want, "chunks of 5");

  const DispatchStats s = ex->stats();
  EXPECT_EQ(s.pairs_local, 0u) << s.to_json();
  EXPECT_EQ(s.pairs_fallback, 0u) << s.to_json();
  EXPECT_EQ(s.pairs_remote, s.pairs) << s.to_json();
  EXPECT_EQ(s.pairs, 3 * tokens.size() * m.moe_layers.size() * size_t(m.model->info().n_expert_used));
  EXPECT_EQ(s.responses, s.requests);
  expect_accounting(s);
  for (size_t i = 0; i < workers.size(); ++i)
    EXPECT_GT(s.workers[i].pairs_served, 0u) << "worker " << i << " was never used: " << s.to_json();
  // A worker counts a request after writing its answer, so the backbone can hold the answer a moment
  // before the worker's count catches up: wait (bounded) for the counts to settle.
  uint64_t worker_side = 0;
  for (int attempt = 0; attempt < 200; ++attempt) {
    worker_side = 0;
    for (const auto& w : workers) worker_side += w->stats().pairs;
    if (worker_side == s.pairs_remote) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(worker_side, s.pairs_remote) << "the workers' own counts disagree with the backbone's";
  for (uint32_t l : m.moe_layers) EXPECT_GT(s.layers.at(l).bytes_sent, 0u) << "layer " << l;
}

TEST_P(DispatchExact, PartialCoverageWithReplicasGivesTheMonolithicLogits) {
  const SwarmModel& m = SwarmModel::get(GetParam());
  const std::vector<int32_t> tokens = m.tokens(16, /*seed=*/11);
  const std::vector<float> want = mono_logits(m, tokens);
  const uint32_t first = m.moe_layers.front(), last = m.moe_layers.back();
  // a: experts 0-2 of the first layer; b: 1-5 of it (1-2 are replicas, a preferred) and 0-1 of the last.
  PipeWorker a({m.slice(first, 0, 3)});
  PipeWorker b({m.slice(first, 1, m.n_expert - 1), m.slice(last, 0, 2)});
  ThreadPool pool(2);
  auto ex = connect(m, {a.endpoint("a"), b.endpoint("b")}, &pool);

  expect_same_bits(eval_logits(m, tokens, *ex), want, "prefill");
  expect_same_bits(eval_logits(m, tokens, *ex, 3), want, "chunks of 3");
  const DispatchStats s = ex->stats();
  EXPECT_GT(s.pairs_local, 0u) << s.to_json();
  EXPECT_GT(s.workers[0].pairs_served, 0u) << s.to_json();
  EXPECT_GT(s.workers[1].pairs_served, 0u) << s.to_json();
  EXPECT_EQ(s.pairs_fallback, 0u) << s.to_json();
  expect_accounting(s);
}

TEST_P(DispatchExact, GreedyGenerationGivesTheMonolithicTokens) {
  const SwarmModel& m = SwarmModel::get(GetParam());
  const std::vector<int32_t> prompt = m.tokens(5, /*seed=*/3);
  ThreadPool pool(2);
  LocalExpertExecutor local(m.model->expert_store(), &pool);
  const std::vector<int32_t> want = greedy(m, prompt, 10, local);
  const auto parts = m.split_experts(2);
  PipeWorker a(parts[0]), b(parts[1]);
  auto ex = connect(m, {a.endpoint("a"), b.endpoint("b")}, &pool);
  EXPECT_EQ(greedy(m, prompt, 10, *ex), want);
  EXPECT_EQ(ex->stats().pairs_fallback, 0u);
}

INSTANTIATE_TEST_SUITE_P(Models, DispatchExact, ::testing::ValuesIn(exactness_specs()),
                         [](const auto& info) { return spec_name(info.param); });

const SwarmModel& q4() { return SwarmModel::get({SynthArch::QWEN3MOE, SynthTypeMix::Q4_K_M}); }

TEST(Dispatch, BatchesAreSplitToFitTheWorkersFrameLimit) {
  const SwarmModel& m = q4();
  const std::vector<int32_t> tokens = m.tokens(48, 5);
  const std::vector<float> want = mono_logits(m, tokens);
  // 64 KiB frames: 96 pairs of 256 floats (96 KiB of answers per layer) need at least two requests.
  PipeWorker w(m.split_experts(1)[0], {.max_payload_bytes = proto::kMinMaxPayloadBytes});
  ThreadPool pool(2);
  DispatchOptions o = patient_options();
  o.link.max_payload_bytes = proto::kMinMaxPayloadBytes;
  auto ex = connect(m, {w.endpoint("w")}, &pool, o);
  expect_same_bits(eval_logits(m, tokens, *ex), want);
  const DispatchStats s = ex->stats();
  EXPECT_GE(s.requests, 2 * s.layer_calls) << s.to_json();
  EXPECT_EQ(s.pairs_remote, s.pairs) << s.to_json();
}

TEST(Dispatch, RequestsBeyondTheInFlightCapAreComputedLocally) {
  const SwarmModel& m = q4();
  const std::vector<int32_t> tokens = m.tokens(48, 5);
  PipeWorker w(m.split_experts(1)[0], {.max_payload_bytes = proto::kMinMaxPayloadBytes});
  ThreadPool pool(2);
  DispatchOptions o = patient_options();
  o.link.max_payload_bytes = proto::kMinMaxPayloadBytes;
  o.max_requests_per_worker = 1;
  auto ex = connect(m, {w.endpoint("w")}, &pool, o);
  expect_same_bits(eval_logits(m, tokens, *ex), mono_logits(m, tokens));
  const DispatchStats s = ex->stats();
  EXPECT_GT(s.fallback_pairs[size_t(FallbackReason::OVERLOADED)], 0u) << s.to_json();
  EXPECT_GT(s.pairs_remote, 0u) << s.to_json();
  expect_accounting(s);
}

TEST(Dispatch, TheMapsDeclarationRestrictsWhatIsRouted) {
  const SwarmModel& m = q4();
  const std::vector<int32_t> tokens = m.tokens(16, 9);
  const uint32_t first = m.moe_layers.front(), last = m.moe_layers.back();
  ASSERT_NE(first, last);
  PipeWorker w(m.split_experts(1)[0]);  // holds everything
  ThreadPool pool(2);
  auto ex = connect(m, {w.endpoint("w", std::vector<proto::Holding>{{first, 0, m.n_expert}})}, &pool);
  expect_same_bits(eval_logits(m, tokens, *ex), mono_logits(m, tokens));
  const DispatchStats s = ex->stats();
  EXPECT_GT(s.layers.at(first).requests, 0u) << s.to_json();
  EXPECT_EQ(s.layers.at(last).requests, 0u) << "layer " << last << " was not declared: " << s.to_json();
  EXPECT_GT(s.pairs_local, 0u);
}

TEST(Dispatch, ABatchTheReplicaCannotComputeIsRefusedBeforeAnythingIsSent) {
  const SwarmModel& m = q4();
  PipeWorker w(m.split_experts(1)[0]);
  ThreadPool pool(2);
  auto ex = connect(m, {w.endpoint("w")}, &pool);
  const ExpertLayer* l = m.model->expert_store().any(int32_t(m.moe_layers.front()));
  ASSERT_NE(l, nullptr);
  std::vector<uint8_t> act(l->activation_row_bytes());
  const std::vector<int32_t> ids = {0, int32_t(m.n_expert)};  // one row, K = 2: expert X does not exist
  std::vector<float> out(2 * size_t(l->n_embd));
  const Status s = ex->compute({.layer = int32_t(m.moe_layers.front()), .n_rows = 1, .k = 2,
                                .act_type = l->activation_type(), .act = act, .ids = ids},
                               out);
  EXPECT_FALSE(s.is_ok());
  EXPECT_EQ(ex->stats().requests, 0u);
  EXPECT_FALSE(ex->compute({.layer = 999, .n_rows = 1, .k = 2, .act_type = l->activation_type(), .act = act,
                            .ids = std::vector<int32_t>{0, 1}},
                           out)
                   .is_ok());
}

TEST(Dispatch, AReplicaTakesOverAndAWorkerThatComesBackIsUsedAgain) {
  const SwarmModel& m = q4();
  const std::vector<int32_t> prompt = m.tokens(4, 21);
  ThreadPool pool(2);
  LocalExpertExecutor local(m.model->expert_store(), &pool);
  const std::vector<int32_t> want = greedy(m, prompt, 12, local);
  const auto all = m.split_experts(1)[0];
  PipeWorker a(all), b(all);  // full replicas; a is preferred
  DispatchOptions o = patient_options();
  o.link.backoff_initial = 10ms;
  o.link.backoff_max = 50ms;
  auto ex = connect(m, {a.endpoint("a"), b.endpoint("b")}, &pool, o);
  uint64_t a_before_down = 0, b_before_down = 0;
  const std::vector<int32_t> got = greedy(m, prompt, 12, *ex, [&](int i) {
    if (i == 3) {
      a_before_down = ex->stats().workers[0].pairs_served;
      b_before_down = ex->stats().workers[1].pairs_served;
      a.down();
    }
  });
  EXPECT_EQ(got, want);
  DispatchStats s = ex->stats();
  EXPECT_GT(a_before_down, 0u);
  EXPECT_EQ(b_before_down, 0u) << "the second replica served while the first was up";
  EXPECT_GT(s.workers[1].pairs_served, 0u) << "the replica did not take over: " << s.to_json();
  EXPECT_FALSE(s.workers[0].connected);

  // a comes back: the link reconnects in the background and a is preferred again.
  a.up();
  const auto give_up = std::chrono::steady_clock::now() + 20s;
  while (ex->connected() < 2 && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(ex->connected(), 2u) << ex->stats().to_json();
  const uint64_t a_after = ex->stats().workers[0].pairs_served;
  EXPECT_EQ(greedy(m, prompt, 4, *ex), std::vector<int32_t>(want.begin(), want.begin() + 4));
  s = ex->stats();
  EXPECT_GT(s.workers[0].pairs_served, a_after) << s.to_json();
  EXPECT_GE(s.workers[0].sessions, 2u);
}

}  // namespace
}  // namespace essaim::backbone::testing
