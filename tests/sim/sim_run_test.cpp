// essaim-sim end to end on a small scenario (a few seconds): one JSON document whose pairs add up (every
// token's 8 experts in each of 48 layers are served once: remotely, from the hot cache, by fallback, or
// failed), the same seed gives the same run (decisions, holdings, latencies; only the wall time differs),
// another seed another one, and a bad scenario is refused with its field named.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>

#include "temp_dir.h"

namespace {

using json = nlohmann::json;

std::pair<int, std::string> run(const std::string& args) {
  const std::string cmd = std::string(ESSAIM_SIM_BIN) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

class SimRun : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = essaim::testing::make_temp_dir("essaim-sim-run");
    std::ofstream(dir_ / "small.json") << R"({"workers": 16, "hours": 0.15, "warmup_s": 240, "probe_every_s": 60,
      "probe_steps": 2, "sequences": 4, "coverage_every_s": 60, "heartbeat_while_downloading": true,
      "classes": [{"name": "laptop", "budget_mb": 4096, "speed": 2, "downlink_mbps": 400, "uplink_mbps": 100,
                   "rtt_ms": 20, "online_hours": 0.1, "offline_hours": 0.05, "kill_share": 0.5}]})";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  json sim(const std::string& extra) {
    auto [rc, out] = run("--scenario " + (dir_ / "small.json").string() + " --json --holdings " + extra);
    EXPECT_EQ(rc, 0) << out;
    json j = json::parse(out, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << out;
    return j;
  }
  std::filesystem::path dir_;
};

TEST_F(SimRun, PairsAddUpAndTheSameSeedGivesTheSameRun) {
  json a = sim("--seed 1"), b = sim("--seed 1"), c = sim("--seed 2");
  ASSERT_TRUE(a.is_object() && b.is_object() && c.is_object());
  const json& p = a["pairs"];
  EXPECT_GT(a["tokens"].get<uint64_t>(), 0u);
  EXPECT_EQ(p["total"].get<uint64_t>(), a["tokens"].get<uint64_t>() * 48 * 8);
  EXPECT_EQ(p["remote"].get<uint64_t>() + p["hot_cache"].get<uint64_t>() + p["fallback"].get<uint64_t>() +
                p["failed"].get<uint64_t>(),
            p["total"].get<uint64_t>());
  EXPECT_GT(p["remote"].get<uint64_t>(), 0u);
  EXPECT_GT(a["tok_s"].get<double>(), 0);
  EXPECT_GE(a["token_latency_s"]["p99"].get<double>(), a["token_latency_s"]["p50"].get<double>());
  EXPECT_GT(a["coverage"]["points"].size(), 3u);
  EXPECT_GT(a["coordinator"]["assigned"].get<uint64_t>(), 0u);
  EXPECT_GT(a["churn"]["kills"].get<uint64_t>() + a["churn"]["leaves"].get<uint64_t>(), 0u);
  for (json* j : {&a, &b, &c}) j->erase("wall_s");
  EXPECT_EQ(a, b);
  EXPECT_NE(a["holdings"], c["holdings"]);
}

TEST_F(SimRun, TheIdlePoolChangesNothingButTheCost) {
  // The same run with every idle worker heartbeating and volunteering to be told nothing.
  // The default classes without churn: the budgets hold 2 replicas several times over, so once they are
  // placed (~15 min) 38 of the 100 workers are idle.
  json s = {{"workers", 100}, {"hours", 0.4}, {"warmup_s", 900}, {"probe_every_s", 120}, {"probe_steps", 2},
            {"sequences", 4}, {"coverage_every_s", 120}, {"heartbeat_while_downloading", true}};
  json classes = json::array();
  for (auto [name, share, mb, speed, up, down, rtt] :
       {std::tuple{"phone", 0.6, 1536, 0.5, 10, 40, 40}, {"laptop", 0.35, 6144, 2.0, 20, 100, 20},
        {"gpu", 0.05, 20480, 30.0, 100, 500, 10}}) {
    classes.push_back({{"name", name}, {"share", share}, {"budget_mb", mb}, {"speed", speed}, {"uplink_mbps", up},
                       {"downlink_mbps", down}, {"rtt_ms", rtt}});
  }
  s["classes"] = classes;
  std::ofstream(dir_ / "pooled.json") << s.dump();
  s["idle_pool"] = false;
  std::ofstream(dir_ / "polling.json") << s.dump();
  const auto both = [&](const char* file) {
    auto [rc, out] = run("--scenario " + (dir_ / file).string() + " --json --holdings --seed 3");
    EXPECT_EQ(rc, 0) << out;
    return json::parse(out);
  };
  json pooled = both("pooled.json"), polling = both("polling.json");
  for (const char* k : {"holdings", "tokens", "token_latency_s", "pairs", "calls", "churn", "coverage", "rewards"})
    EXPECT_EQ(pooled[k], polling[k]) << k;
  for (const char* k : {"assigned", "decisions", "swaps", "drops", "slice_downloads"})
    EXPECT_EQ(pooled["coordinator"][k], polling["coordinator"][k]) << k;
  // The requests the pool answered without asking are counted as the polling workers made them.
  const double a = pooled["coordinator"]["heartbeats"], b = polling["coordinator"]["heartbeats"];
  EXPECT_NEAR(a, b, 0.01 * b);
  EXPECT_GT(pooled["coordinator"]["decisions_skipped"].get<uint64_t>(), 5000u);
  EXPECT_EQ(pooled["coverage"]["points"].back()["covered"], 1.0);
}

TEST_F(SimRun, TheSliceServersLinkIsSharedByEveryDownload) {
  // 16 laptops (400 Mbit/s down) place one replica of the 384 slices (65 GB): 3.5 s a slice over their own
  // downlinks, but 90 minutes for them all through a 100 Mbit/s slice server's link. After 3 minutes:
  json s = {{"workers", 16}, {"hours", 0.05}, {"replicas", 1}, {"warmup_s", 150}, {"probe_steps", 1},
            {"sequences", 1}, {"coverage_every_s", 60},
            {"classes", {{{"name", "laptop"}, {"budget_mb", 8192}, {"speed", 2}, {"downlink_mbps", 400},
                          {"uplink_mbps", 100}, {"rtt_ms", 20}}}}};
  s["slice_server_mbps"] = 100;
  std::ofstream(dir_ / "shared.json") << s.dump();
  s["slice_server_mbps"] = 0;
  std::ofstream(dir_ / "cdn.json") << s.dump();
  const auto covered = [&](const char* file) {
    auto [rc, out] = run("--scenario " + (dir_ / file).string() + " --json");
    EXPECT_EQ(rc, 0) << out;
    return json::parse(out)["coverage"]["points"].back()["covered"].get<double>();
  };
  const double shared = covered("shared.json"), cdn = covered("cdn.json");
  EXPECT_LT(shared, 0.1);
  EXPECT_GT(cdn, 0.2);
  EXPECT_GT(cdn, 4 * shared) << shared;
}

TEST_F(SimRun, ABadScenarioIsRefusedByName) {
  std::ofstream(dir_ / "bad.json") << R"({"workers": 16, "replicsa": 2})";
  auto [rc, out] = run("--scenario " + (dir_ / "bad.json").string() + " --json");
  EXPECT_EQ(rc, 2);
  EXPECT_NE(out.find("unknown field \"replicsa\""), std::string::npos) << out;
}

}  // namespace
