// The market's pure decisions: holders, usage shares, scarcity order, volunteer choice, the expert map.
#include <gtest/gtest.h>

#include "coord/placement.h"

namespace essaim::coord {
namespace {

constexpr int64_t kNow = 1'000'000'000;

Catalogue catalogue() {
  Catalogue c;
  c.model_identity = std::string(64, 'a');
  c.n_layers = 2;
  c.n_experts = 8;
  for (int64_t l : {0, 1}) {
    for (int64_t f : {0, 4}) {
      c.slices.push_back({"m.L" + std::to_string(l) + ".E" + std::to_string(f), l, f, 4, 100 + l * 10 + f,
                          std::string(64, char('0' + l * 2 + f / 4))});
    }
  }
  return c;
}
NodeRow healthy(const std::string& id, int64_t reg) {
  NodeRow n;
  n.node_id = id;
  n.name = id;
  n.registered_ms = reg;
  n.address = "127.0.0.1:" + std::to_string(reg);
  n.fingerprint_ok = true;
  n.last_heartbeat_ms = kNow - 1000;
  return n;
}
HoldingRow hold(const NodeRow& n, const Catalogue& c, size_t s) {
  return {n.node_id, c.slices[s].layer, c.slices[s].expert_first, c.slices[s].expert_count, c.slices[s].sha256};
}

TEST(Placement, HoldersCountOnlyHealthyNodesWithTheCatalogueDigest) {
  const Catalogue c = catalogue();
  NodeRow a = healthy("n-a", 1), stale = healthy("n-s", 2), bad_fp = healthy("n-f", 3), dropped = healthy("n-d", 4),
          revoked = healthy("n-r", 5);
  stale.last_heartbeat_ms = kNow - 3 * 10 * 1000 - 1;
  bad_fp.fingerprint_ok = false;
  dropped.status = "dropped";
  revoked.revoked = true;
  std::vector<HoldingRow> h;
  for (const NodeRow& n : {a, stale, bad_fp, dropped, revoked}) h.push_back(hold(n, c, 0));
  HoldingRow wrong_sha = hold(a, c, 1);
  wrong_sha.sha256 = std::string(64, 'f');
  h.push_back(wrong_sha);
  const auto holders = count_holders(c, {a, stale, bad_fp, dropped, revoked}, h, kNow, 10);
  EXPECT_EQ(holders, (std::vector<int64_t>{1, 0, 0, 0}));
  EXPECT_EQ(node_status(stale, kNow, 10), "stale");
  EXPECT_EQ(node_status(a, kNow, 10), "active");
  EXPECT_EQ(node_status(dropped, kNow, 10), "dropped");
  EXPECT_EQ(node_status(revoked, kNow, 10), "revoked");
}

TEST(Placement, UsageIsUniformUntilReported) {
  const Catalogue c = catalogue();
  EXPECT_EQ(usage_shares(c, {}), (std::vector<double>{0.5, 0.5, 0.5, 0.5}));
  // Layer 1: experts 4..7 picked 3 times as often as 0..3.
  const auto u = usage_shares(c, {{1, 0, 10}, {1, 5, 30}, {0, 2, 7}});
  EXPECT_EQ(u, (std::vector<double>{1.0, 0.0, 0.25, 0.75}));
}

TEST(Placement, DemandSortsByScarcityThenPosition) {
  const Catalogue c = catalogue();
  const auto d = compute_demand(c, {2, 1, 0, 1}, {0.5, 0.5, 0.25, 0.75}, 2);
  ASSERT_EQ(d.size(), 4u);
  EXPECT_EQ(d[0].slice, 3u);  // 1 missing x 0.75 ... vs 2 missing x 0.25 = 0.5 : 0.75 first
  EXPECT_DOUBLE_EQ(d[0].scarcity, 0.75);
  EXPECT_EQ(d[1].slice, 1u);  // 0.5, layer 0 before layer 1's 0.5
  EXPECT_EQ(d[2].slice, 2u);
  EXPECT_EQ(d[3].slice, 0u);  // fully replicated: 0
  EXPECT_EQ(d[3].scarcity, 0);
}

TEST(Placement, VolunteerTakesTheScarcestThatFitAndNeverWhatItHolds) {
  const Catalogue c = catalogue();  // bytes 100, 104, 110, 114
  const auto d = compute_demand(c, {0, 0, 0, 0}, usage_shares(c, {}), 1);
  // All equally scarce: (layer, expert_first) order; 250 bytes take slices 0 and 1 (204), not 2.
  auto v = choose_volunteer(c, d, {}, 250);
  EXPECT_EQ(v.assign, (std::vector<size_t>{0, 1}));
  EXPECT_TRUE(v.drop.empty());
  v = choose_volunteer(c, d, {0}, 250);  // holds 0 (100 bytes): 150 left, slice 1 fits, then nothing
  EXPECT_EQ(v.assign, (std::vector<size_t>{1}));
  EXPECT_TRUE(choose_volunteer(c, d, {}, 99).assign.empty());
}

TEST(Placement, VolunteerIsToldToDropOverReplicatedRangesWhenFull) {
  const Catalogue c = catalogue();
  const auto d = compute_demand(c, {3, 0, 0, 0}, usage_shares(c, {}), 2);
  const auto v = choose_volunteer(c, d, {0}, 100);  // full with slice 0, which has 3 > 2 holders
  EXPECT_TRUE(v.assign.empty());
  EXPECT_EQ(v.drop, (std::vector<size_t>{0}));
  EXPECT_TRUE(choose_volunteer(c, compute_demand(c, {2, 0, 0, 0}, usage_shares(c, {}), 2), {0}, 100).drop.empty());
}

TEST(Placement, MapListsHealthyHoldersInRegistrationOrder) {
  const Catalogue c = catalogue();
  NodeRow first = healthy("n-b", 1), second = healthy("n-a", 2), gone = healthy("n-c", 3);
  gone.last_heartbeat_ms = 0;
  const auto m = expert_map(c, {first, second, gone}, {hold(second, c, 2), hold(first, c, 3), hold(first, c, 0),
                                                       hold(gone, c, 1)}, kNow, 10);
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].node_id, "n-b");
  EXPECT_EQ(m[0].slices, (std::vector<size_t>{0, 3}));
  EXPECT_EQ(m[1].node_id, "n-a");
}

}  // namespace
}  // namespace essaim::coord
