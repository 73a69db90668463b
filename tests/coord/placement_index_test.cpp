// The market's index decides as the scan it replaced: decide_volunteer before MarketIndex (git d5f62fa) is
// kept here as the reference, written from the definitions in placement.h over the whole snapshot, and
// seeded random states (every node status, wrong digests, nodes without an address, reservations of gone
// and of unknown nodes, duplicate rows, two slice sizes, usage reports) are decided by both for every node
// and a stranger, and the map's listing is the index's. The index built node by node, in any order and with
// nodes set twice, equals the one built from the snapshot.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <tuple>

#include "coord/placement.h"
#include "coord/placement_index.h"

namespace essaim::coord {
namespace {

constexpr int64_t kNow = 1'000'000'000;
constexpr int64_t kHeartbeatS = 10;

// ---- the reference: decide_volunteer as it was, one scan of the snapshot per decision ----

struct InFlight {
  std::string node_id;
  size_t slice = 0;
  bool give_up = false;
};

std::vector<InFlight> reference_in_flight(const Catalogue& cat, const MarketSnapshot& s,
                                          const std::vector<PendingRow>& pending, int64_t now_ms) {
  std::set<std::string> gone;
  for (const NodeRow& n : s.nodes) {
    const std::string st = node_status(n, now_ms, kHeartbeatS);
    if (st == "revoked" || st == "dropped" || (st == "stale" && n.last_heartbeat_ms > 0)) gone.insert(n.node_id);
  }
  std::set<std::tuple<std::string, int64_t, int64_t>> holds;
  for (const HoldingRow& h : s.holdings) holds.emplace(h.node_id, h.layer, h.expert_first);
  std::map<std::pair<int64_t, int64_t>, size_t> slice_at;
  for (size_t i = 0; i < cat.slices.size(); ++i)
    slice_at.emplace(std::make_pair(cat.slices[i].layer, cat.slices[i].expert_first), i);
  std::vector<InFlight> out;
  for (const PendingRow& p : pending) {
    if (gone.count(p.node_id) || holds.count({p.node_id, p.layer, p.expert_first}) != size_t(p.give_up)) continue;
    auto it = slice_at.find({p.layer, p.expert_first});
    if (it != slice_at.end()) out.push_back({p.node_id, it->second, p.give_up});
  }
  return out;
}

std::vector<NodeHoldings> reference_future_holdings(const Catalogue& cat, const MarketSnapshot& s,
                                                    const std::vector<InFlight>& moves, int64_t now_ms) {
  std::map<std::string, int64_t> budget;
  for (const NodeRow& row : s.nodes) budget[row.node_id] = row.capacity_bytes;
  std::vector<NodeHoldings> out;
  for (const MapWorker& w : expert_map(cat, s.nodes, s.holdings, now_ms, kHeartbeatS)) {
    NodeHoldings n{w.node_id, w.slices, w.slices, budget[w.node_id]};
    for (const InFlight& m : moves) {
      if (m.node_id != n.node_id) continue;
      if (m.give_up) {
        n.slices.erase(std::remove(n.slices.begin(), n.slices.end(), m.slice), n.slices.end());
        n.serving.erase(std::remove(n.serving.begin(), n.serving.end(), m.slice), n.serving.end());
      } else {
        n.slices.push_back(m.slice);
      }
    }
    out.push_back(std::move(n));
  }
  return out;
}

std::vector<int64_t> reference_future_holders(const Catalogue& cat, const MarketSnapshot& s,
                                              const std::vector<InFlight>& moves, const std::string& asker) {
  std::vector<int64_t> holders = count_holders(cat, s.nodes, s.holdings, kNow, kHeartbeatS);
  for (const InFlight& m : moves) {
    if (m.node_id != asker) holders[m.slice] += m.give_up ? -1 : 1;
  }
  return holders;
}

VolunteerChoice reference_decide(const Catalogue& cat, const MarketSnapshot& s, const std::vector<PendingRow>& pending,
                                 const VolunteerAsk& ask, int64_t replicas) {
  const std::vector<InFlight> moves = reference_in_flight(cat, s, pending, ask.now_ms);
  const std::vector<int64_t> holders = reference_future_holders(cat, s, moves, ask.node_id);
  return choose_volunteer(
      cat, compute_demand(cat, holders, usage_shares(cat, s.usage), replicas), ask.held, ask.budget_bytes,
      swarm_room(cat, reference_future_holdings(cat, s, moves, ask.now_ms), ask.node_id, ask.held));
}

// ---- seeded random states ----

Catalogue catalogue() {
  Catalogue c;
  c.n_layers = 3;
  c.n_experts = 16;
  for (int64_t l = 0; l < 3; ++l) {
    for (int64_t f = 0; f < 16; f += 4) {
      c.slices.push_back({"s" + std::to_string(l) + "." + std::to_string(f), l, f, 4, (l == 1 ? 120 : 100),
                          std::string(64, char('a' + l))});
    }
  }
  return c;
}

struct State {
  MarketSnapshot snapshot;
  std::vector<PendingRow> pending;
};

NodeRow random_node(std::mt19937_64& rng, int i) {
  std::uniform_int_distribution<int> pick(0, 9);
  NodeRow n;
  n.node_id = "n-" + std::to_string(1000 + i);
  n.registered_ms = i;
  n.address = pick(rng) == 0 ? "" : "10.0.0." + std::to_string(i);
  n.fingerprint_ok = pick(rng) != 0;
  n.capacity_bytes = std::uniform_int_distribution<int64_t>(0, 700)(rng);
  const int kind = pick(rng);
  n.last_heartbeat_ms = kind == 0 ? 0 : kind == 1 ? kNow - 3 * kHeartbeatS * 1000 - 1 : kNow - 1000 * pick(rng);
  if (kind == 2) n.status = "dropped";
  if (kind == 3) n.revoked = true;
  return n;
}

State random_state(const Catalogue& cat, std::mt19937_64& rng, int nodes) {
  State st;
  std::uniform_int_distribution<size_t> slice(0, cat.slices.size() - 1);
  std::uniform_int_distribution<int> pick(0, 9);
  for (int i = 0; i < nodes; ++i) {
    const NodeRow n = random_node(rng, i);
    st.snapshot.nodes.push_back(n);
    for (int k = pick(rng) % 6; k > 0; --k) {
      const CatalogueSlice& c = cat.slices[slice(rng)];
      st.snapshot.holdings.push_back({n.node_id, c.layer, c.expert_first, c.expert_count,
                                      pick(rng) == 0 ? std::string(64, 'z') : c.sha256});
    }
  }
  // Reservations: takes and give-ups of known nodes, of a node with no row, and one naming no slice; and
  // give-ups of slices their nodes hold (a swap in flight), which is what takes a holder out of `serving`.
  for (int k = nodes; k > 0; --k) {
    const CatalogueSlice& c = cat.slices[slice(rng)];
    const std::string who = pick(rng) == 0 ? "n-unknown" : st.snapshot.nodes[size_t(pick(rng)) % size_t(nodes)].node_id;
    const int64_t first = pick(rng) == 0 ? c.expert_first + 1 : c.expert_first;  // 1 in 10 names no slice
    st.pending.push_back({who, c.layer, first, kNow + 5000, pick(rng) < 3});
  }
  for (const HoldingRow& h : st.snapshot.holdings) {
    if (pick(rng) < 2) st.pending.push_back({h.node_id, h.layer, h.expert_first, kNow + 5000, true});
  }
  for (int64_t l = 0; l < cat.n_layers; ++l) {
    for (int64_t e = 0; e < cat.n_experts; e += 1 + pick(rng)) st.snapshot.usage.push_back({l, e, pick(rng) * 7});
  }
  return st;
}

void expect_same(const VolunteerChoice& a, const VolunteerChoice& b, const std::string& what) {
  EXPECT_EQ(a.assign, b.assign) << what;
  EXPECT_EQ(a.drop, b.drop) << what;
  EXPECT_EQ(a.swap, b.swap) << what;
}

TEST(MarketIndex, DecidesAsTheScanOnRandomStates) {
  const Catalogue cat = catalogue();
  std::mt19937_64 rng(43);
  std::set<size_t> assigns, drops, swaps;  // the states must reach every kind of answer
  for (int round = 0; round < 300; ++round) {
    const State st = random_state(cat, rng, 2 + round % 12);
    const MarketIndex idx = MarketIndex::from_snapshot(cat, st.snapshot, st.pending, kNow, kHeartbeatS);
    // The map's listing, node by node.
    const std::vector<MapWorker> map = expert_map(cat, st.snapshot.nodes, st.snapshot.holdings, kNow, kHeartbeatS);
    size_t listed = 0;
    for (const NodeRow& n : st.snapshot.nodes) {
      const std::vector<size_t>* mine = idx.map_slices(n.node_id);
      if (!mine) continue;
      ASSERT_LT(listed, map.size());
      EXPECT_EQ(map[listed].node_id, n.node_id);
      EXPECT_EQ(map[listed++].slices, *mine);
    }
    EXPECT_EQ(listed, map.size());
    std::vector<std::string> askers{"n-stranger", "n-unknown"};
    for (const NodeRow& n : st.snapshot.nodes) askers.push_back(n.node_id);
    for (const std::string& who : askers) {
      std::vector<size_t> held;
      for (const HoldingRow& h : st.snapshot.holdings) {
        if (h.node_id == who) held.push_back(*cat.find(h.layer, h.expert_first, h.expert_count));
      }
      // A node may say it holds what its rows do not show (a download landed since, a digest gone wrong).
      for (size_t s = 0; s < cat.slices.size(); ++s) {
        if (std::uniform_int_distribution<int>(0, 15)(rng) == 0) held.push_back(s);
      }
      const VolunteerAsk ask{who, held, std::uniform_int_distribution<int64_t>(0, 700)(rng), kNow};
      for (int64_t replicas : {1, 2, 3}) {
        const VolunteerChoice want = reference_decide(cat, st.snapshot, st.pending, ask, replicas);
        expect_same(idx.decide(ask, replicas), want, who + " round " + std::to_string(round));
        expect_same(decide_volunteer(cat, st.snapshot, st.pending, ask, {kHeartbeatS, replicas}), want, who);
        assigns.insert(want.assign.size());
        drops.insert(want.drop.size());
        swaps.insert(want.swap.size());
      }
      const std::vector<InFlight> moves = reference_in_flight(cat, st.snapshot, st.pending, kNow);
      EXPECT_EQ(idx.future_holders(who), reference_future_holders(cat, st.snapshot, moves, who));
    }
  }
  EXPECT_GT(assigns.size(), 2u);
  EXPECT_GT(drops.size(), 1u);
  EXPECT_EQ(swaps, (std::set<size_t>{0, 1}));
}

TEST(MarketIndex, ASwapKeepsAHolderServingTheGivenUpSlice) {
  // Slice 0 is held by a and b, b gives it up (its swap), d and e are downloading it: 3 future holders but
  // only a serves it and keeps serving it, so a, full, is not offered a swap of slice 0 for a hole.
  const Catalogue cat = catalogue();
  State st;
  for (const char* id : {"n-a", "n-b", "n-d", "n-e"}) {
    NodeRow n;
    n.node_id = id;
    n.address = std::string("10.0.0.") + id;
    n.fingerprint_ok = true;
    n.last_heartbeat_ms = kNow - 1000;
    n.capacity_bytes = 100;
    st.snapshot.nodes.push_back(n);
  }
  const CatalogueSlice& x = cat.slices[0];
  for (const char* id : {"n-a", "n-b"}) st.snapshot.holdings.push_back({id, x.layer, x.expert_first, x.expert_count, x.sha256});
  st.pending = {{"n-b", x.layer, x.expert_first, kNow + 5000, true},
                {"n-d", x.layer, x.expert_first, kNow + 5000, false},
                {"n-e", x.layer, x.expert_first, kNow + 5000, false}};
  const VolunteerAsk ask{"n-a", {0}, 100, kNow};
  const VolunteerChoice c = MarketIndex::from_snapshot(cat, st.snapshot, st.pending, kNow, kHeartbeatS).decide(ask, 2);
  expect_same(c, reference_decide(cat, st.snapshot, st.pending, ask, 2), "n-a");
  EXPECT_TRUE(c.swap.empty());
  // Without b's give-up, b still serves slice 0, and the swap is offered.
  st.pending.erase(st.pending.begin());
  EXPECT_EQ(MarketIndex::from_snapshot(cat, st.snapshot, st.pending, kNow, kHeartbeatS).decide(ask, 2).swap.size(), 1u);
}

TEST(MarketIndex, NodeByNodeEqualsTheSnapshotsIndex) {
  const Catalogue cat = catalogue();
  std::mt19937_64 rng(7);
  for (int round = 0; round < 100; ++round) {
    const State a = random_state(cat, rng, 10), b = random_state(cat, rng, 10);
    // Set every node of state a, then of state b in a shuffled order: the index must forget a entirely.
    MarketIndex idx(cat, kHeartbeatS);
    idx.set_usage(usage_shares(cat, b.snapshot.usage));
    for (const State* st : {&a, &b}) {
      std::vector<size_t> order(st->snapshot.nodes.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::shuffle(order.begin(), order.end(), rng);
      for (size_t i : order) {
        const NodeRow& row = st->snapshot.nodes[i];
        std::vector<const HoldingRow*> h;
        for (const HoldingRow& x : st->snapshot.holdings) {
          if (x.node_id == row.node_id) h.push_back(&x);
        }
        std::vector<const PendingRow*> p;
        for (const PendingRow& x : st->pending) {
          if (x.node_id == row.node_id) p.push_back(&x);
        }
        idx.set_node(row.node_id, &row, h, p, kNow);
      }
    }
    idx.remove_node("n-unknown");  // b's unknown node's reservations, set below as from_snapshot does
    std::vector<const PendingRow*> unknown;
    for (const PendingRow& x : b.pending) {
      if (x.node_id == "n-unknown") unknown.push_back(&x);
    }
    if (!unknown.empty()) idx.set_node("n-unknown", nullptr, {}, unknown, kNow);
    const MarketIndex want = MarketIndex::from_snapshot(cat, b.snapshot, b.pending, kNow, kHeartbeatS);
    for (const NodeRow& n : b.snapshot.nodes) {
      const VolunteerAsk ask{n.node_id, {0, 5}, 400, kNow};
      expect_same(idx.decide(ask, 2), want.decide(ask, 2), n.node_id);
      EXPECT_EQ(idx.future_holders(n.node_id), want.future_holders(n.node_id));
    }
  }
}

TEST(MarketIndex, TermsChangeWhenAHeartbeatGoesStaleOrAReservationExpires) {
  NodeRow n;
  n.fingerprint_ok = true;
  n.last_heartbeat_ms = kNow - 1000;
  const int64_t stale_at = MarketIndex::term_boundary(&n, {}, kNow, kHeartbeatS);
  EXPECT_TRUE(node_is_holder(n, stale_at - 1, kHeartbeatS));
  EXPECT_FALSE(node_is_holder(n, stale_at, kHeartbeatS));
  const PendingRow p{"n", 0, 0, kNow + 5000, false};
  EXPECT_EQ(MarketIndex::term_boundary(&n, {&p}, kNow, kHeartbeatS), kNow + 5000);
  n.last_heartbeat_ms = 0;  // never heartbeated: stale whatever the clock says
  EXPECT_EQ(MarketIndex::term_boundary(&n, {}, kNow, kHeartbeatS), std::numeric_limits<int64_t>::max());
}

}  // namespace
}  // namespace essaim::coord
