// The many-node harness (bench/support/swarm_harness.h) in CI: 6 `essaim-worker` processes on loopback, the
// tiny model's experts cut into 3 parts with 2 replicas each, every worker behind its own delay proxy (the
// replicas of a part at different speeds: 1 ms + up to 1 ms and 3 ms + up to 3 ms of seeded jitter each
// way), a backbone serving 8 concurrent greedy requests through the serve scheduler with the
// nearest-replica choice and hedging, and 3 seeded SIGKILLs each followed by a restart on a new port while
// the requests run.
// The backbone of the swarm runs from the backbone file (no expert bytes): a part with no live replica fails
// its requests instead of being computed locally, so the tokens prove the swarm covered every expert
// throughout the churn (docs/invariants.md, invariant 5).
// - every request's tokens equal the same request's run alone on one node (the local executor, one
//   sequence at a time), token for token;
// - no request waits past its deadline (kRequestDeadline, measured per request from submit to its last
//   token);
// - the kills hit live workers and every restarted worker is reconnected and handshaken again; a second
//   round on the healed swarm gives the same tokens again.
#include <gtest/gtest.h>

#include <cstdio>
#include <set>
#include <thread>

#include "backbone_test_util.h"
#include "swarm_harness.h"
#include "swarm_requests.h"

namespace essaim::backbone::testing {
namespace {

constexpr int kRequests = 8, kPromptTokens = 10, kMaxTokens = 32;
// The bound each request must finish within (submit → last token). The run takes about a second on an
// idle machine; a backbone that waited for a dead worker beyond the layer deadline, or hung, exceeds it.
constexpr double kRequestDeadline = 15.0;

bench::NodeSpeed speed(int /*part*/, int replica) {
  using std::chrono::microseconds;
  return replica == 0 ? bench::NodeSpeed{.one_way = microseconds(1000), .jitter = microseconds(1000), .threads = 1}
                      : bench::NodeSpeed{.one_way = microseconds(3000), .jitter = microseconds(3000), .threads = 1};
}

DispatchOptions swarm_options() {
  DispatchOptions o;
  o.timeout = std::chrono::milliseconds(2000);  // the layer-call deadline (essaim's default)
  o.link.connect_timeout = std::chrono::seconds(20);
  o.link.backoff_initial = std::chrono::milliseconds(20);
  o.link.backoff_max = std::chrono::milliseconds(300);  // a restarted worker rejoins within a fraction of a second
  o.replicas = {.policy = ReplicaPolicy::NEAREST, .hedge = true, .hedge_factor = 3.0};
  return o;
}

serve::SchedulerOptions scheduler_options(int parallel) {
  return {.parallel = parallel, .batch_tokens = 128, .queue_capacity = 64,
          .cache = {.n_ctx = kPromptTokens + kMaxTokens + 4}};
}

TEST(SwarmHarness, ConcurrentRequestsThroughSeededKillsAndRestartsGiveTheSingleNodeTokens) {
  const SwarmModel& m = SwarmModel::get({});
  const Model& model = *m.model;
  ThreadPool pool(2);
  const std::vector<serve::SequenceRequest> requests =
      bench::greedy_requests(model, kRequests, kPromptTokens, kMaxTokens, /*seed=*/11);

  // The single-node reference: each request alone (one sequence in flight), the experts computed locally.
  LocalExpertExecutor local(model.expert_store(), &pool);
  Result<bench::ServedRun> alone =
      bench::serve_concurrently(model, &local, &pool, requests, scheduler_options(1), std::chrono::seconds(60));
  ASSERT_TRUE(alone) << alone.status().message();
  std::set<std::vector<int32_t>> distinct;
  for (const bench::ServedRequest& r : alone->requests) {
    ASSERT_EQ(r.tokens.size(), size_t(kMaxTokens));
    distinct.insert(r.tokens);
  }
  EXPECT_GT(distinct.size(), size_t(kRequests / 2));  // equal answers everywhere would prove nothing

  Result<std::unique_ptr<bench::Swarm>> swarm = bench::Swarm::start(
      {.worker_bin = WorkerProcess::worker_binary(), .parts = m.split_experts(3), .replicas = 2, .speed = speed,
       .seed = 5});
  ASSERT_TRUE(swarm) << swarm.status().message();
  bench::Swarm& s = **swarm;
  ASSERT_EQ(s.size(), 6u);
  const std::unique_ptr<Model> lean = backbone_only_model(m);
  ASSERT_NE(lean, nullptr);
  Result<std::unique_ptr<RemoteExpertExecutor>> remote =
      remote_executor_for_model(*lean, s.map(), &pool, swarm_options());
  ASSERT_TRUE(remote) << remote.status().message();
  RemoteExpertExecutor& ex = **remote;
  ASSERT_EQ(ex.connected(), 6u) << ex.stats().to_text();

  // Kills in the first three quarters of the traffic (counted in generated tokens), seeded; the victims are
  // the fast replicas, which the nearest-replica choice gives most requests, so a kill is likely to find
  // requests in flight on the killed worker (each one then goes to the other replica: nothing is recomputed).
  const uint64_t total = uint64_t(kRequests) * kMaxTokens;
  const std::vector<bench::ChaosEvent> plan =
      bench::chaos_schedule({.seed = 7, .kills = 3, .nodes = s.size(), .replicas = 2, .first = total / 8,
                             .last = total * 3 / 4, .victims = {0, 2, 4}});
  ASSERT_EQ(plan.size(), 6u);
  std::set<size_t> victims;
  for (const bench::ChaosEvent& e : plan) victims.insert(e.node);
  EXPECT_EQ(victims, (std::set<size_t>{0, 2, 4}));  // drawn without replacement: each fast replica once
  bench::ChaosRunner chaos(s, plan);
  Result<bench::ServedRun> served =
      bench::serve_concurrently(*lean, &ex, &pool, requests, scheduler_options(kRequests), std::chrono::seconds(60),
                                [&](uint64_t tokens) { chaos.progress(tokens); });
  chaos.finish();
  ASSERT_TRUE(served) << served.status().message();

  double slowest = 0;
  for (int i = 0; i < kRequests; ++i) {  // first: a request that failed says why (a part with no live replica)
    const bench::ServedRequest& r = served->requests[size_t(i)];
    EXPECT_EQ(r.reason, serve::FinishReason::LENGTH) << "request " << i << ": " << r.error;
    EXPECT_EQ(r.tokens, alone->requests[size_t(i)].tokens) << "request " << i;
    EXPECT_LT(r.latency_s, kRequestDeadline) << "request " << i;
    slowest = std::max(slowest, r.latency_s);
  }
  const std::vector<bench::ChaosRunner::Applied> applied = chaos.applied();
  ASSERT_EQ(applied.size(), plan.size()) << "the traffic ended before the schedule did";
  for (const bench::ChaosRunner::Applied& a : applied) EXPECT_EQ(a.error, "") << "node " << a.event.node;
  const DispatchStats during = ex.stats();
  std::fprintf(stderr, "swarm harness: %zu requests, slowest %.2f s (bound %.0f s), steps %llu, hedges %llu (%llu won)\n%s\n",
               served->requests.size(), slowest, kRequestDeadline, (unsigned long long)served->scheduler.steps,
               (unsigned long long)during.hedges, (unsigned long long)during.hedge_wins, during.to_text().c_str());
  EXPECT_EQ(during.calls_failed, 0u) << "a part had no live replica: " << during.to_text();
  EXPECT_EQ(during.pairs_local, 0u) << during.to_text();  // nothing to compute it from
  EXPECT_GT(during.pairs_remote, during.pairs / 2);

  // Healed: every killed node's restart is reconnected (a second handshake), then the same tokens again.
  std::set<size_t> killed;
  for (const bench::ChaosEvent& e : plan) killed.insert(e.node);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (ex.connected() < s.size() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(ex.connected(), s.size()) << ex.stats().to_text();
  const DispatchStats healed = ex.stats();
  for (size_t n : killed) {
    EXPECT_GE(s.restarts(n), 1u);
    EXPECT_GE(healed.workers[n].sessions, 1u + s.restarts(n)) << "node " << n;
  }
  Result<bench::ServedRun> again =
      bench::serve_concurrently(*lean, &ex, &pool, requests, scheduler_options(kRequests), std::chrono::seconds(60));
  ASSERT_TRUE(again) << again.status().message();
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_EQ(again->requests[size_t(i)].tokens, alone->requests[size_t(i)].tokens) << "request " << i;
    EXPECT_LT(again->requests[size_t(i)].latency_s, kRequestDeadline);
  }
  EXPECT_GT(ex.stats().pairs_remote, healed.pairs_remote);
  remote->reset();  // links closed before the proxies go
}

// The schedule is a pure function of its seed: same seed, same events; one node down at a time.
TEST(SwarmHarness, ChaosScheduleIsSeededAndKeepsOneReplicaUp) {
  const bench::ChaosPlan p{.seed = 3, .kills = 5, .nodes = 6, .replicas = 2, .first = 10, .last = 200};
  const std::vector<bench::ChaosEvent> a = bench::chaos_schedule(p), b = bench::chaos_schedule(p);
  ASSERT_EQ(a.size(), 10u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].at, b[i].at);
    EXPECT_EQ(a[i].node, b[i].node);
  }
  bench::ChaosPlan other = p;
  other.seed = 4;
  const std::vector<bench::ChaosEvent> c = bench::chaos_schedule(other);
  bool differs = false;
  for (size_t i = 0; i < a.size(); ++i) differs |= a[i].at != c[i].at || a[i].node != c[i].node;
  EXPECT_TRUE(differs);
  std::set<size_t> first_round;  // 5 kills over 6 nodes: 5 different victims
  for (size_t i = 0; i < a.size(); i += 2) first_round.insert(a[i].node);
  EXPECT_EQ(first_round.size(), 5u);
  for (size_t i = 0; i < a.size(); i += 2) {  // kill, then its own restart, before the next kill
    EXPECT_EQ(a[i].kind, bench::ChaosEvent::Kind::KILL);
    EXPECT_EQ(a[i + 1].kind, bench::ChaosEvent::Kind::RESTART);
    EXPECT_EQ(a[i + 1].node, a[i].node);
    EXPECT_LT(a[i].at, a[i + 1].at);
    if (i + 2 < a.size()) {
      EXPECT_LT(a[i + 1].at, a[i + 2].at);
    }
    EXPECT_GE(a[i].at, p.first);
    EXPECT_LT(a[i + 1].at, p.last);
  }
}

}  // namespace
}  // namespace essaim::backbone::testing
