// Nearest healthy replica (backbone/replica_choice.h, docs/dispatch.md): when several workers hold an
// expert the dispatcher chooses by measured round trip and this call's load, spreads pairs over equal
// replicas, and hedges a request that is late relative to its worker's own history. Whichever replica
// answers, the logits equal the monolithic ones bit for bit:
// - the chooser alone: equal replicas alternate, a 20× slower one is given little, map order under FIRST,
//   no hedging before a link has history;
// - two full replicas as `essaim-worker` processes, one behind a 20 ms round-trip delay proxy
//   (bench/support/delay_proxy): under NEAREST the fast one serves most pairs, listed second;
// - two equal replicas (worker processes behind equal 4 ms round trips) share the pairs;
// - a replica that turns slow (an injected 300 ms per request): its late requests are hedged to the other
//   replica, whose answers are used; no fallback, no wrong bit.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "backbone/replica_choice.h"
#include "backbone_test_util.h"
#include "delay_proxy.h"

namespace essaim::backbone::testing {
namespace {

TEST(ReplicaChooser, EqualReplicasAlternateASlowOneGetsLittleFirstKeepsMapOrder) {
  ReplicaChooser nearest(3, {.policy = ReplicaPolicy::NEAREST});
  const std::vector<size_t> both = {0, 1};
  std::vector<uint64_t> load(3, 0);
  for (int i = 0; i < 10; ++i) ++load[nearest.choose(both, load)];
  EXPECT_EQ(load[0], 5u);  // no history: spread by load, ties to map order
  EXPECT_EQ(load[1], 5u);
  for (int i = 0; i < 8; ++i) {
    nearest.record(0, 0.020, 4);  // 20 ms at 4 pairs a request
    nearest.record(1, 0.001, 4);  // 1 ms
  }
  std::fill(load.begin(), load.end(), 0);
  for (int i = 0; i < 84; ++i) ++load[nearest.choose(both, load)];
  EXPECT_LE(load[0], 4u) << "the slow replica was given " << load[0] << " of 84 pairs";
  EXPECT_GE(load[1], 80u);
  EXPECT_GT(load[0], 0u);  // but not nothing: enough load on the fast one makes the slow one worth it
  // Left unused, the slow one's average drifts toward the fast one's, so it is measured again later.
  nearest.decay_unused({true, true, false}, std::vector<uint64_t>{0, 5, 0});
  EXPECT_LT(nearest.estimated_round_trip(0), nearest.mean_round_trip(0));
  EXPECT_GT(nearest.estimated_round_trip(0), nearest.estimated_round_trip(1));
  EXPECT_DOUBLE_EQ(nearest.estimated_round_trip(1), 0.001);
  EXPECT_DOUBLE_EQ(nearest.mean_round_trip(0), 0.020);  // the measured average is not touched
  ReplicaChooser first(3, {.policy = ReplicaPolicy::FIRST});
  first.record(0, 1.0, 1);
  EXPECT_EQ(first.choose(both, load), 0u);

  ReplicaChooser hedging(2, {.policy = ReplicaPolicy::NEAREST, .hedge = true, .hedge_factor = 3.0});
  EXPECT_EQ(hedging.hedge_after(0), std::chrono::nanoseconds::max());  // no history: never late
  for (uint64_t i = 0; i < ReplicaChooser::kHedgeMinSamples; ++i) hedging.record(0, 0.010, 2);
  EXPECT_EQ(hedging.hedge_after(0), std::chrono::milliseconds(30));
  EXPECT_EQ(nearest.hedge_after(0), std::chrono::nanoseconds::max());  // hedging off
}

DispatchOptions nearest_options(bool hedge = false) {
  DispatchOptions o = patient_options();
  o.replicas = {.policy = ReplicaPolicy::NEAREST, .hedge = hedge};
  return o;
}

TEST(ReplicaChoice, TheFastReplicaServesMostWhenTheOtherIsBehindA20msRoundTrip) {
  const SwarmModel& m = SwarmModel::get({});
  const std::vector<std::string> all = m.split_experts(1).front();
  WorkerProcess slow_worker(all), fast_worker(all);
  ASSERT_TRUE(slow_worker.ok() && fast_worker.ok());
  net::NetResult<std::unique_ptr<bench::DelayProxy>> proxy =
      bench::DelayProxy::start("127.0.0.1", slow_worker.port(), std::chrono::microseconds(10'000));
  ASSERT_TRUE(proxy) << proxy.error().message;
  ExpertMap map;  // the slow one first: map order would give it everything
  map.workers.push_back({.address = (*proxy)->address(), .label = "slow", .holdings = std::nullopt});
  map.workers.push_back({.address = fast_worker.address(), .label = "fast", .holdings = std::nullopt});
  ThreadPool pool(2);
  const std::vector<int32_t> tokens = m.tokens(12, 5);
  const std::vector<float> want = mono_logits(m, tokens);
  for (ReplicaPolicy policy : {ReplicaPolicy::FIRST, ReplicaPolicy::NEAREST}) {
    DispatchOptions o = patient_options();
    o.replicas.policy = policy;
    Result<std::unique_ptr<RemoteExpertExecutor>> ex =
        RemoteExpertExecutor::create(m.model->expert_store(), m.identity, map, &pool, o);
    ASSERT_TRUE(ex.is_ok()) << ex.status().message();
    ASSERT_EQ((*ex)->wait_connected(net::deadline_in(30s)), 2u);
    expect_same_bits(eval_logits(m, tokens, **ex, 1), want, "one token at a time");
    const DispatchStats s = (*ex)->stats();
    EXPECT_EQ(s.fallbacks(), 0u) << s.to_json();
    const uint64_t slow = s.workers[0].pairs_served, fast = s.workers[1].pairs_served;
    EXPECT_EQ(slow + fast, s.pairs) << s.to_json();
    if (policy == ReplicaPolicy::FIRST) {
      EXPECT_EQ(fast, 0u) << s.to_json();
    } else {
      EXPECT_GT(fast, 4 * slow) << s.to_json();
      EXPECT_GT(s.workers[0].mean_round_trip_ms, 15.0) << s.to_json();
      EXPECT_LT(s.workers[1].mean_round_trip_ms, s.workers[0].mean_round_trip_ms) << s.to_json();
    }
  }
}

TEST(ReplicaChoice, EqualReplicasShareThePairs) {
  // Two full replicas, each behind the same 4 ms round trip: equal to within this machine's noise.
  const SwarmModel& m = SwarmModel::get({});
  const std::vector<std::string> all = m.split_experts(1).front();
  WorkerProcess wa(all), wb(all);
  ASSERT_TRUE(wa.ok() && wb.ok());
  ExpertMap map;
  std::vector<std::unique_ptr<bench::DelayProxy>> proxies;
  for (const WorkerProcess* w : {&wa, &wb}) {
    net::NetResult<std::unique_ptr<bench::DelayProxy>> p =
        bench::DelayProxy::start("127.0.0.1", w->port(), std::chrono::microseconds(2'000));
    ASSERT_TRUE(p) << p.error().message;
    map.workers.push_back({.address = (*p)->address(), .label = {}, .holdings = std::nullopt});
    proxies.push_back(std::move(*p));
  }
  ThreadPool pool(2);
  Result<std::unique_ptr<RemoteExpertExecutor>> ex =
      RemoteExpertExecutor::create(m.model->expert_store(), m.identity, map, &pool, nearest_options());
  ASSERT_TRUE(ex.is_ok()) << ex.status().message();
  ASSERT_EQ((*ex)->wait_connected(net::deadline_in(30s)), 2u);
  const std::vector<int32_t> tokens = m.tokens(24, 9);
  expect_same_bits(eval_logits(m, tokens, **ex), mono_logits(m, tokens), "prefill");
  expect_same_bits(eval_logits(m, tokens, **ex, 1), mono_logits(m, tokens), "one token at a time");
  const DispatchStats s = (*ex)->stats();
  EXPECT_EQ(s.fallbacks(), 0u) << s.to_json();
  EXPECT_EQ(s.workers[0].pairs_served + s.workers[1].pairs_served, s.pairs);
  EXPECT_GT(s.workers[0].pairs_served, s.pairs / 4) << s.to_json();
  EXPECT_GT(s.workers[1].pairs_served, s.pairs / 4) << s.to_json();
  ex->reset();  // links closed before the proxies go
}

// The real executor, after a delay that can be switched on: a replica that turns slow.
class SlowableExecutor final : public ExpertExecutor {
 public:
  explicit SlowableExecutor(const ExpertStore& store) : inner_(store, nullptr) {}
  Status compute(const ExpertBatch& b, std::span<float> out) override {
    const int ms = delay_ms.load();
    if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return inner_.compute(b, out);
  }
  std::atomic<int> delay_ms{0};

 private:
  LocalExpertExecutor inner_;
};

TEST(ReplicaChoice, ALateRequestIsHedgedToTheOtherReplicaWithTheSameBits) {
  const SwarmModel& m = SwarmModel::get({});
  const std::vector<std::string> all = m.split_experts(1).front();
  SlowableExecutor turns_slow(m.model->expert_store());
  worker::WorkerOptions slowable;
  slowable.executor = &turns_slow;
  PipeWorker a(all, slowable), b(all);
  ThreadPool pool(2);
  DispatchOptions o = patient_options();
  o.replicas = {.policy = ReplicaPolicy::FIRST, .hedge = true, .hedge_factor = 3.0};  // a is always asked first
  auto ex = RemoteExpertExecutor::create(m.model->expert_store(), m.identity, {a.endpoint("a"), b.endpoint("b")},
                                         &pool, o);
  ASSERT_EQ(ex->wait_connected(net::deadline_in(10s)), 2u);
  const std::vector<int32_t> tokens = m.tokens(10, 4);
  const std::vector<float> want = mono_logits(m, tokens);
  expect_same_bits(eval_logits(m, tokens, *ex, 1), want, "a fast: its history");
  const DispatchStats before = ex->stats();

  turns_slow.delay_ms = 300;
  expect_same_bits(eval_logits(m, tokens, *ex, 1), want, "a slow: hedged to b");
  const DispatchStats s = ex->stats();
  EXPECT_EQ(s.fallbacks(), 0u) << s.to_json();
  EXPECT_GT(s.hedges, before.hedges) << s.to_json();
  EXPECT_GT(s.hedge_wins, 0u) << s.to_json();
  EXPECT_GT(s.workers[1].pairs_served, 0u) << "the hedge's answers were not used: " << s.to_json();
  // Each duplicate sent while a was slow is the answer used (a never answers within 300 ms; once its queue
  // is full it answers OVERLOADED at once, and those requests go to b the same way): counts, not timings.
  EXPECT_EQ(s.hedge_wins - before.hedge_wins, s.hedges - before.hedges) << s.to_json();
  EXPECT_GT(s.workers[1].pairs_served - before.workers[1].pairs_served, (s.pairs - before.pairs) / 2) << s.to_json();
  EXPECT_TRUE(s.workers[0].connected) << "a slow replica is not a failed one: " << s.to_json();
}

}  // namespace
}  // namespace essaim::backbone::testing
