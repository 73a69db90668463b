// The coverage market end to end, every part a real process on loopback: `essaim coordinator`, workers that
// join by themselves (`essaim-worker --coordinator`), and `essaim eval|run --coordinator`.
//   - a swarm from nothing: 4 workers whose budgets hold one slice each cover the model; the eval through
//     the coordinator's map equals the monolithic eval bit for bit, and the ledger credits each worker;
//   - churn: 2 replicas wanted and held; kill -9 one worker while a generation runs; the other replica answers
//     meanwhile, a spare with free budget picks the killed worker's ranges up within the documented time,
//     and the generation's text equals the monolithic text;
//   - healing (issue 41, the held-out scenario): 2 replicas wanted, 4 workers covering every range once, a
//     spare that took second replicas until its budget is full; kill -9 of a worker whose range the spare
//     lacks: a full node holding a second replica (the spare, or the worker sharing that range) swaps it for
//     the hole within 5 heartbeats, and a generation from the backbone file equals the monolithic one; a
//     worker stopped with SIGTERM leaves the map at once.
//   - a worker whose download takes longer than 3 heartbeats (its link to the coordinator paced) stays live
//     at the coordinator all along: it heartbeats while it downloads.
// Every backbone here runs from the backbone file (`--backbone-file`: no expert bytes), so a range no live
// worker holds fails the run instead of being computed from a local copy (docs/invariants.md, invariant 5).
// Time to full coverage and to re-coverage are printed ("[ measure ]") for docs/market.md.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "cli_test_util.h"
#if ESSAIM_TEST_DELAY_PROXY
#include "delay_proxy.h"
#endif
#include "net/http_client.h"
#include "model_fixture.h"

namespace essaim::cli_test {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr const char* kAdmin = "market-test-admin-token";

class Market {
 public:
  Market(int replicas, int heartbeat_s)
      : dir_(make_temp_dir("market")),
        coord_("essaim coordinator --model " + tiny_model() + " --slices " + tiny_slices_dir() + " --db " + dir_ +
               "/coord.sqlite --listen 127.0.0.1:0 --admin-token " + kAdmin + " --replicas " + std::to_string(replicas) +
               " --heartbeat-s " + std::to_string(heartbeat_s)) {}

  bool up() const { return coord_.port() != 0; }
  uint16_t port() const { return coord_.port(); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(coord_.port()); }
  std::string log() const { return coord_.stderr_text(); }

  json call(const std::string& method, const std::string& target, const std::string& body = "") const {
    net::HttpUrl u{.host = "127.0.0.1", .port = coord_.port(), .base_path = ""};
    Result<net::HttpAnswer> a = net::http_call(u, {.method = method, .target = target, .bearer = kAdmin,
                                                         .body = body, .headers = {}});
    if (!a || a->status / 100 != 2) return json();
    return json::parse(a->body, nullptr, false);
  }
  // (node_id, token)
  std::pair<std::string, std::string> add_node(const std::string& name) const {
    json j = call("POST", "/api/nodes", json{{"name", name}}.dump());
    if (!j.is_object()) return {};
    return {j.value("node_id", ""), j.value("token", "")};
  }
  // Per healthy node id: the (layer, first expert) ranges it holds.
  std::map<std::string, std::set<std::pair<int, int>>> holdings() const {
    json m = call("GET", "/api/expert-map");
    std::map<std::string, std::set<std::pair<int, int>>> out;
    if (!m.is_object() || !m["workers"].is_array()) return out;
    for (const json& w : m["workers"]) {
      for (const json& h : w["holdings"]) out[w.value("label", "")].insert({h.value("layer", -1), h.value("expert_first", -1)});
    }
    return out;
  }
  // Distinct (layer, first expert) ranges with a healthy holder, and the node ids holding anything.
  std::pair<size_t, std::set<std::string>> coverage() const {
    json m = call("GET", "/api/expert-map");
    std::set<std::pair<int, int>> ranges;
    std::set<std::string> holders;
    if (!m.is_object() || !m["workers"].is_array()) return {0, {}};
    for (const json& w : m["workers"]) {
      holders.insert(w.value("label", ""));
      for (const json& h : w["holdings"]) ranges.insert({h.value("layer", -1), h.value("expert_first", -1)});
    }
    return {ranges.size(), holders};
  }
  // The fewest healthy holders any of the tiny model's 4 ranges has (0 while one has none).
  int min_holders() const {
    json m = call("GET", "/api/expert-map");
    std::map<std::pair<int, int>, int> n;
    if (!m.is_object() || !m["workers"].is_array()) return 0;
    for (const json& w : m["workers"])
      for (const json& h : w["holdings"]) ++n[{h.value("layer", -1), h.value("expert_first", -1)}];
    if (n.size() < 4) return 0;
    int least = INT32_MAX;
    for (const auto& [range, holders] : n) least = std::min(least, holders);
    return least;
  }
  // Seconds until each of the 4 ranges of the tiny model has `replicas` holders (and `must_hold` is among the
  // holders), or -1.
  double wait_full(double timeout_s, const std::string& must_hold = "", int replicas = 1) const {
    const auto t0 = Clock::now();
    while (Clock::now() - t0 < std::chrono::duration<double>(timeout_s)) {
      if (min_holders() >= replicas && (must_hold.empty() || coverage().second.count(must_hold))) {
        return std::chrono::duration<double>(Clock::now() - t0).count();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return -1;
  }

  const std::string dir_;

 private:
  BackgroundProcess coord_;
};

std::unique_ptr<BackgroundProcess> join_worker_at(const std::string& coordinator_url, const std::string& token,
                                                  const std::string& data_dir, double budget_mb = 0.4) {
  return std::make_unique<BackgroundProcess>("essaim-worker --coordinator " + coordinator_url + " --token " + token +
                                             " --budget-mb " + std::to_string(budget_mb) + " --data-dir " + data_dir +
                                             " --listen 127.0.0.1:0");
}

std::unique_ptr<BackgroundProcess> join_worker(const Market& m, const std::string& token, const std::string& data_dir,
                                               double budget_mb = 0.4) {
  return join_worker_at(m.url(), token, data_dir, budget_mb);
}

// Each tiny slice is 325-375 KiB: a 0.4 MiB budget holds exactly one, so covering 4 slices needs all 4.
TEST(MarketSwarm, FromNothingToFullCoverageAndAnExactEval) {
  Market m(/*replicas=*/1, /*heartbeat_s=*/1);
  ASSERT_TRUE(m.up()) << m.log();
  const auto t0 = Clock::now();
  std::vector<std::unique_ptr<BackgroundProcess>> workers;
  std::vector<std::string> ids;
  for (int i = 0; i < 4; ++i) {
    auto [id, token] = m.add_node("w" + std::to_string(i));
    ASSERT_FALSE(token.empty());
    ids.push_back(id);
    workers.push_back(join_worker(m, token, m.dir_ + "/w" + std::to_string(i)));
    ASSERT_NE(workers.back()->port(), 0) << workers.back()->stderr_text();
  }
  ASSERT_GE(m.wait_full(30), 0) << m.log() << workers[0]->stderr_text();
  std::printf("[ measure ] full coverage of the tiny model by 4 self-joining workers: %.2f s from the first start\n",
              std::chrono::duration<double>(Clock::now() - t0).count());
  EXPECT_EQ(m.coverage().second.size(), 4u) << "the budgets need all 4 workers";

  const std::string prompt = " -p 'The swarm covers every expert of the model' ";
  const CliRun mono = run_cli("essaim eval -m " + tiny_model() + prompt + "--logits-out " + m.dir_ + "/mono.npy");
  ASSERT_EQ(mono.code, 0) << mono.err;
  const CliRun swarm = run_cli("essaim eval --backbone-file " + tiny_backbone() + prompt + "--logits-out " + m.dir_ +
                               "/swarm.npy" + " --coordinator " + m.url() + " --token " + kAdmin + " --json");
  ASSERT_EQ(swarm.code, 0) << swarm.err;
  EXPECT_EQ(read_text(m.dir_ + "/mono.npy"), read_text(m.dir_ + "/swarm.npy")) << "not bit-identical";
  json summary = json::parse(swarm.out, nullptr, false);
  ASSERT_TRUE(summary.is_object()) << swarm.out;
  EXPECT_EQ(summary["dispatch"]["pairs_local"], 0) << swarm.out;
  EXPECT_EQ(summary["dispatch"]["pairs_fallback"], 0) << swarm.out;

  // The ledger: the backbone's accepted pairs, per node.
  json rewards = m.call("GET", "/api/rewards");
  ASSERT_TRUE(rewards.is_object());
  uint64_t credited = 0;
  for (const json& n : rewards["nodes"]) {
    EXPECT_GT(n.value("pairs_credited", 0), 0) << n.dump();
    EXPECT_EQ(n.value("audits_failed", 1), 0) << n.dump();
    credited += n.value("pairs_credited", 0);
  }
  EXPECT_EQ(credited, summary["dispatch"]["pairs_remote"].get<uint64_t>()) << rewards.dump();

  // A restarted worker re-verifies its slice instead of downloading it again.
  auto [id, token] = m.add_node("again");
  const std::string dir = m.dir_ + "/w0";
  workers[0].reset();
  std::filesystem::create_directories(dir);
  auto again = join_worker(m, token, dir);
  ASSERT_NE(again->port(), 0) << again->stderr_text();
  EXPECT_NE(again->stderr_text().find("re-verified"), std::string::npos) << again->stderr_text();
}

#if ESSAIM_TEST_DELAY_PROXY
// The worker reaches the coordinator through a link paced at 40 KB/s per connection: its one slice (325-375
// KiB) takes 8-9 s to download, more than 3 heartbeats of 1 s, while the heartbeats on their own connection
// pass at once. Polled every 100 ms, the coordinator never saw the node silent for 3 heartbeats (stale).
TEST(MarketSwarm, AWorkerStaysLiveAtTheCoordinatorWhileItDownloads) {
  Market m(/*replicas=*/1, /*heartbeat_s=*/1);
  ASSERT_TRUE(m.up()) << m.log();
  auto link = bench::DelayProxy::start("127.0.0.1", m.port(), bench::LinkDelay{.bytes_per_s = 40000});
  ASSERT_TRUE(link) << link.error().message;
  auto [id, token] = m.add_node("slow-link");
  ASSERT_FALSE(token.empty());
  auto worker = join_worker_at("http://" + (*link)->address(), token, m.dir_ + "/slow");
  ASSERT_NE(worker->port(), 0) << worker->stderr_text();
  int64_t longest_silence_ms = 0;
  bool held = false, stale = false;
  for (const auto until = Clock::now() + std::chrono::seconds(60); !held && Clock::now() < until;) {
    const json nodes = m.call("GET", "/api/nodes");
    for (const json& n : nodes.value("nodes", json::array())) {
      if (n.value("node_id", "") != id) continue;
      if (!n["last_seen_ms_ago"].is_number()) continue;  // not heartbeated yet (listed as stale until then)
      stale |= n.value("status", "") == "stale";
      longest_silence_ms = std::max(longest_silence_ms, n["last_seen_ms_ago"].get<int64_t>());
    }
    held = m.coverage().second.count(id) > 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(held) << worker->stderr_text() << m.log();
  const std::string log = worker->stderr_text();
  const size_t in = log.find(" bytes in ");
  ASSERT_NE(in, std::string::npos) << log;
  EXPECT_GT(std::stod(log.substr(in + 10)), 3.0) << "the download must outlast 3 heartbeats: " << log;
  EXPECT_FALSE(stale) << log;
  EXPECT_LT(longest_silence_ms, 3000) << log;
}
#endif

// essaim serve on the market (--coordinator) from the backbone file: /health is 503 with the reason while a range
// has no live holder (a worker killed, no spare yet), and 200 again once a new worker has taken it.
TEST(MarketSwarm, ServeHealthFollowsTheMarketsCoverage) {
  Market m(/*replicas=*/1, /*heartbeat_s=*/1);
  ASSERT_TRUE(m.up()) << m.log();
  std::vector<std::unique_ptr<BackgroundProcess>> workers;
  for (int i = 0; i < 4; ++i) {
    auto [id, token] = m.add_node("w" + std::to_string(i));
    workers.push_back(join_worker(m, token, m.dir_ + "/w" + std::to_string(i)));
    ASSERT_NE(workers.back()->port(), 0) << workers.back()->stderr_text();
  }
  ASSERT_GE(m.wait_full(30), 0) << m.log();
  BackgroundProcess serve("essaim serve --backbone-file " + tiny_backbone() + " --coordinator " + m.url() + " --token " +
                          kAdmin + " --map-refresh-ms 200 --port 0 -np 1 -t 1");
  ASSERT_NE(serve.port(), 0) << serve.stderr_text();
  ASSERT_TRUE(wait_for_health(serve.port(), 200, std::chrono::seconds(60))) << serve.stderr_text();
  ::kill(workers[0]->pid(), SIGKILL);
  ASSERT_TRUE(wait_for_health(serve.port(), 503, std::chrono::seconds(30))) << serve.stderr_text();
  const auto [status, body] = health(serve.port());
  EXPECT_NE(body.find("swarm_unavailable"), std::string::npos) << body;
  EXPECT_NE(body.find("layer"), std::string::npos) << body;
  auto [spare_id, spare_token] = m.add_node("spare");
  auto spare = join_worker(m, spare_token, m.dir_ + "/spare");
  ASSERT_NE(spare->port(), 0) << spare->stderr_text();
  EXPECT_TRUE(wait_for_health(serve.port(), 200, std::chrono::seconds(60))) << m.log() << serve.stderr_text();
}

TEST(MarketSwarm, ChurnASpareTakesOverAKilledWorkersRangeAndTheTextStaysExact) {
  // 2 s heartbeats: with 1 s, live workers on a loaded 2-core machine (CI runs two tests at once) could miss
  // 3 heartbeats and go stale themselves, which sends the spare to the wrong range.
  constexpr int kHeartbeatS = 2;
  // 2 replicas wanted, and 4 workers whose budgets (0.8 MiB) hold 2 slices each: every range has 2 holders,
  // so while the killed worker's ranges wait for the spare, the other replica answers. The backbone has no
  // copy of the experts to fall back on. The spare joins once every range has its 2 holders, so it waits
  // with free budget for 2 slices (when every budget is full, a node holding a second replica swaps it for the hole:
  // AFullSwarmSwapsASecondReplicaForAKilledWorkersRange).
  Market m(/*replicas=*/2, kHeartbeatS);
  ASSERT_TRUE(m.up()) << m.log();
  std::vector<std::unique_ptr<BackgroundProcess>> workers;
  for (int i = 0; i < 4; ++i) {
    auto [id, token] = m.add_node("w" + std::to_string(i));
    workers.push_back(join_worker(m, token, m.dir_ + "/w" + std::to_string(i), /*budget_mb=*/0.8));
    ASSERT_NE(workers.back()->port(), 0) << workers.back()->stderr_text();
  }
  ASSERT_GE(m.wait_full(30, "", /*replicas=*/2), 0) << m.log() << m.call("GET", "/api/expert-demand").dump();
  auto [spare_id, spare_token] = m.add_node("spare");
  auto spare = join_worker(m, spare_token, m.dir_ + "/spare", /*budget_mb=*/0.8);  // nothing is scarce: it waits
  ASSERT_NE(spare->port(), 0) << spare->stderr_text();

  const std::string gen = " -p Hello -n 5000 -c 8192 --temp 0 ";
  CliRun swarm;
  double run_s = 0;
  std::thread generation([&] {
    const auto t = Clock::now();
    swarm = run_cli("essaim run --backbone-file " + tiny_backbone() + gen + "--coordinator " + m.url() +
                    " --token " + kAdmin + " --map-refresh-ms 200 --json");
    run_s = std::chrono::duration<double>(Clock::now() - t).count();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ::kill(workers[0]->pid(), SIGKILL);
  // Documented bound (docs/market.md): stale after 3 heartbeats, volunteer within 1 more, download, 1 more
  // heartbeat for the map: about 5 heartbeats. The limit here leaves room for a loaded machine.
  const double recovered = m.wait_full(60, spare_id, /*replicas=*/2);
  generation.join();
  ASSERT_GE(recovered, 0) << m.log() << spare->stderr_text() << m.call("GET", "/api/expert-demand").dump();
  std::printf("[ measure ] re-coverage after kill -9 (heartbeat %d s): %.2f s\n", kHeartbeatS, recovered);
  EXPECT_LT(recovered, 5.0 * kHeartbeatS + 10.0);
  ASSERT_EQ(swarm.code, 0) << "a range had no live holder and no copy to fall back on: " << swarm.err;
  const CliRun mono = run_cli("essaim run -m " + tiny_model() + gen + "--json");
  ASSERT_EQ(mono.code, 0) << mono.err;
  json s = json::parse(swarm.out, nullptr, false), mo = json::parse(mono.out, nullptr, false);
  ASSERT_TRUE(s.is_object() && mo.is_object()) << swarm.out;
  EXPECT_EQ(s["text"], mo["text"]) << "the generation changed under churn";
  EXPECT_EQ(s["tokens"], mo["tokens"]);
  // The run took the new map between layer calls: the spare served part of it (when the run outlasted the
  // re-coverage by a margin; on a very slow machine the run may end first).
  if (recovered + 0.5 + 2.0 < run_s) {
    bool spare_served = false;
    for (const json& w : s["dispatch"]["workers"]) spare_served |= w.value("pairs_served", 0) > 0 &&
                                                                  w.value("address", "") == "127.0.0.1:" + std::to_string(spare->port());
    EXPECT_TRUE(spare_served) << s["dispatch"].dump();
  }
  std::printf("[ measure ] churn run %.1f s: %s\n", run_s, s["dispatch"].dump().substr(0, 300).c_str());
}

// The held-out scenario of issue 41. Before the healing market, the spare's budget stayed full of second
// replicas (drops were offered only above `wanted`) and the killed worker's range stayed at 0 holders.
TEST(MarketSwarm, AFullSwarmSwapsASecondReplicaForAKilledWorkersRange) {
  // 2 s heartbeats, as the churn test: with 1 s, live workers on a loaded 2-core machine could miss 3
  // heartbeats and go stale themselves.
  constexpr int kHeartbeatS = 2;
  Market m(/*replicas=*/2, kHeartbeatS);
  ASSERT_TRUE(m.up()) << m.log();
  std::map<std::string, std::unique_ptr<BackgroundProcess>> workers;  // by node id
  for (int i = 0; i < 4; ++i) {
    auto [id, token] = m.add_node("w" + std::to_string(i));
    workers[id] = join_worker(m, token, m.dir_ + "/w" + std::to_string(i));  // 0.4 MiB: one slice each
    ASSERT_NE(workers[id]->port(), 0) << workers[id]->stderr_text();
  }
  ASSERT_GE(m.wait_full(30), 0) << m.log();
  auto [spare_id, spare_token] = m.add_node("spare");
  auto spare = join_worker(m, spare_token, m.dir_ + "/spare", /*budget_mb=*/0.8);  // room for 2 slices
  ASSERT_NE(spare->port(), 0) << spare->stderr_text();
  const auto t_spare = Clock::now();
  while (m.holdings()[spare_id].size() < 2 && Clock::now() - t_spare < std::chrono::seconds(30)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::map<std::string, std::set<std::pair<int, int>>> before = m.holdings();
  ASSERT_EQ(before[spare_id].size(), 2u) << "the spare's budget is full of second replicas\n" << spare->stderr_text();
  // A worker holding a range the spare lacks: killing it leaves that range with no holder at all.
  std::string victim;
  for (const auto& [id, ranges] : before) {
    if (id != spare_id && ranges.size() == 1 && !before[spare_id].count(*ranges.begin())) victim = id;
  }
  ASSERT_FALSE(victim.empty());
  const std::pair<int, int> hole = *before[victim].begin();
  ::kill(workers[victim]->pid(), SIGKILL);
  const auto t_kill = Clock::now();
  bool seen_hole = false;
  double recovered = -1;
  while (Clock::now() - t_kill < std::chrono::seconds(60)) {
    std::map<std::string, std::set<std::pair<int, int>>> now = m.holdings();
    const bool held = std::any_of(now.begin(), now.end(), [&](const auto& n) { return n.second.count(hole) > 0; });
    seen_hole |= !held;
    if (held && seen_hole && m.min_holders() >= 1) {
      recovered = std::chrono::duration<double>(Clock::now() - t_kill).count();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(recovered, 0) << "the hole was never re-covered\n" << m.log() << spare->stderr_text()
                          << m.call("GET", "/api/expert-demand").dump();
  std::printf("[ measure ] re-coverage of a hole by a swap after kill -9 (heartbeat %d s): %.2f s\n", kHeartbeatS,
              recovered);
  EXPECT_LE(recovered, 5.0 * kHeartbeatS) << "stale after 3 heartbeats, swapped within 2 more";
  // The hole is covered once a full node serving a second replica (the spare, or the worker holding the
  // same range) serves both and says so; it gives the old range up right after.
  const auto swapper_log = [&](const std::string& id) {
    return id == spare_id ? spare->stderr_text() : workers.count(id) ? workers[id]->stderr_text() : std::string();
  };
  std::string swapper;
  const auto t_swap = Clock::now();
  while (swapper.empty() && Clock::now() - t_swap < std::chrono::seconds(10)) {
    for (const auto& [id, ranges] : m.holdings()) {
      if (ranges.count(hole) && swapper_log(id).find("swapped for") != std::string::npos) swapper = id;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_FALSE(swapper.empty()) << "no node swapped a second replica for the hole\n" << spare->stderr_text();
  while (m.holdings()[swapper].size() != before[swapper].size() && Clock::now() - t_swap < std::chrono::seconds(10)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(m.holdings()[swapper].size(), before[swapper].size()) << "it gave up a second replica for the hole";
  std::printf("[ measure ] the hole was taken by %s\n", swapper == spare_id ? "the spare" : "a worker");

  // The swarm as it is now serves a generation from the backbone file, equal to the monolithic one.
  const std::string gen = " -p 'The swarm heals' -n 48 --temp 0 --json ";
  const CliRun swarm = run_cli("essaim run --backbone-file " + tiny_backbone() + gen + "--coordinator " + m.url() +
                               " --token " + kAdmin);
  ASSERT_EQ(swarm.code, 0) << swarm.err;
  const CliRun mono = run_cli("essaim run -m " + tiny_model() + gen);
  ASSERT_EQ(mono.code, 0) << mono.err;
  json s = json::parse(swarm.out, nullptr, false), mo = json::parse(mono.out, nullptr, false);
  ASSERT_TRUE(s.is_object() && mo.is_object()) << swarm.out;
  EXPECT_EQ(s["tokens"], mo["tokens"]);
  EXPECT_EQ(s["text"], mo["text"]);

  // A worker stopped with SIGTERM says it is leaving: it is out of the map at once, not 3 heartbeats later.
  std::string leaver;
  for (const auto& [id, ranges] : m.holdings()) {
    if (id != spare_id) leaver = id;
  }
  ASSERT_FALSE(leaver.empty());
  const auto t_term = Clock::now();
  workers[leaver].reset();  // SIGTERM, then waits for it to exit
  const double left_s = std::chrono::duration<double>(Clock::now() - t_term).count();
  EXPECT_EQ(m.holdings().count(leaver), 0u) << "still in the map " << left_s << " s after SIGTERM";
  std::printf("[ measure ] a SIGTERM'd worker left the map in %.2f s (its process exit included)\n", left_s);
}

}  // namespace
}  // namespace essaim::cli_test
