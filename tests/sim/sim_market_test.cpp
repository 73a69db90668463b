// essaim-sim's market decides as the coordinator does: one seeded schedule of joins, heartbeats, volunteer
// rounds (drops, downloads, swaps), kill -9s (heartbeats stop; the node goes stale after 3), graceful leaves
// and returns, played against the real Coordinator (SQLite store, its HTTP handlers through answer()) and
// against SimMarket; every heartbeat's `volunteer` flag, every volunteer answer and the final holdings must
// be identical. The schedule must exercise assignments, swaps and drops, or the test fails.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "coord/coordinator.h"
#include "market_driver.h"
#include "sim/sim_market.h"
#include "temp_dir.h"

namespace essaim::sim {
namespace {

using json = nlohmann::json;
using coord::testing::held_bytes;
using coord::testing::joined_worker_turn;
using coord::testing::MarketDriver;

size_t slice_index(const coord::Catalogue& cat, const json& r) {
  return *cat.find(r["layer"].get<int64_t>(), r["expert_first"].get<int64_t>(), r["expert_count"].get<int64_t>());
}

// The coordinator's volunteer answer as the decision SimMarket returns.
coord::VolunteerChoice volunteer_choice(const coord::Catalogue& cat, const json& a) {
  coord::VolunteerChoice c;
  for (const json& x : a["assign"]) c.assign.push_back(slice_index(cat, x));
  for (const json& x : a["drop"]) c.drop.push_back(slice_index(cat, x));
  for (const json& x : a["swap"]) c.swap.push_back({slice_index(cat, x["take"]), slice_index(cat, x["give_up"])});
  return c;
}

struct Node {
  std::string name, id;  // the coordinator's id, which SimMarket is given too
  int64_t budget = 0;
  std::vector<size_t> held;
  bool alive = true;
};

class Schedule {
 public:
  Schedule(uint64_t seed, const std::filesystem::path& dir)
      : rng_(seed),
        cat_(coord::testing::small_catalogue()),
        real_(cat_, dir / "coord.sqlite", now_),
        sim_(cat_, {.heartbeat_s = 10, .replicas = 2}) {}

  void run(int steps) {
    for (int i = 0; i < steps; ++i) step();
    now_ += 1000;
    for (Node& n : nodes_) {
      if (n.alive) heartbeat(n);  // the nodes back from a leave say what their disk holds
    }
    for (const Node& n : nodes_) {
      std::vector<size_t> h = n.held;
      std::sort(h.begin(), h.end());
      if (n.alive) final_[n.id] = h;
    }
  }
  int assigned = 0, swaps = 0, drops = 0, told = 0, stale_kills = 0;
  std::map<std::string, std::vector<size_t>> final_;
  SimMarket& sim() { return sim_; }

 private:
  void step() {
    now_ += std::uniform_int_distribution<int64_t>(1, 12000)(rng_);
    const int kind = std::uniform_int_distribution<int>(0, 19)(rng_);
    if (nodes_.size() < 3 || (kind == 0 && nodes_.size() < 14)) return join();
    Node& n = nodes_[std::uniform_int_distribution<size_t>(0, nodes_.size() - 1)(rng_)];
    if (!n.alive) {
      if (kind < 4) n.alive = true;  // back, with what its disk holds
      return;
    }
    if (kind == 1) {
      n.alive = false;  // kill -9: silent
      ++stale_kills;
      return;
    }
    if (kind == 2) {
      n.alive = false;
      EXPECT_EQ(real_.heartbeat(n.name, n.held, n.budget, true), sim_.heartbeat(n.id, n.held, n.budget, true, now_));
      return;
    }
    market_round(n);
  }
  void join() {
    Node n;
    n.name = "node-" + std::to_string(nodes_.size());
    real_.add_node(n.name);
    n.id = real_.id(n.name);
    sim_.add_node(n.id, now_);
    n.budget = std::uniform_int_distribution<int64_t>(100, 900)(rng_);
    nodes_.push_back(n);
    now_ += 1;  // registration order is (registered_ms, node_id)
  }
  bool heartbeat(Node& n) {
    const bool a = real_.heartbeat(n.name, n.held, n.budget, false);
    const bool b = sim_.heartbeat(n.id, n.held, n.budget, false, now_);
    EXPECT_EQ(a, b) << "heartbeat of " << n.id << " at " << now_;
    told += a;
    return a;
  }
  void market_round(Node& n) {
    joined_worker_turn(held_bytes(cat_, n.held), n.budget, rng_, [&] { return heartbeat(n); },
                       [&] { return volunteer_round(n); });
  }
  // The coordinator and SimMarket must decide alike; the choice applied, returns whether the held set changed.
  bool volunteer_round(Node& n) {
    const coord::VolunteerChoice a = volunteer_choice(cat_, real_.volunteer(n.name, n.held, n.budget));
    const coord::VolunteerChoice b = sim_.volunteer(n.id, n.held, n.budget, now_);
    EXPECT_EQ(a.assign, b.assign) << n.id << " at " << now_;
    EXPECT_EQ(a.drop, b.drop) << n.id << " at " << now_;
    EXPECT_EQ(a.swap, b.swap) << n.id << " at " << now_;
    return apply(n, a);
  }
  bool apply(Node& n, const coord::VolunteerChoice& c) {
    bool changed = false;
    for (size_t d : c.drop) {
      std::erase(n.held, d);
      ++drops;
      changed = true;
    }
    for (size_t s : c.assign) {
      if (held_bytes(cat_, n.held) + cat_.slices[s].bytes > n.budget) continue;
      n.held.push_back(s);
      ++assigned;
      changed = true;
    }
    for (const coord::SwapOrder& s : c.swap) {
      n.held.push_back(s.take);
      heartbeat(n);
      std::erase(n.held, s.give_up);
      ++swaps;
      changed = true;
    }
    return changed;
  }

  std::mt19937_64 rng_;
  int64_t now_ = 1'700'000'000'000;
  coord::Catalogue cat_;
  MarketDriver real_;
  SimMarket sim_;
  std::vector<Node> nodes_;
};

TEST(SimMarket, DecidesAsTheCoordinatorOverASeededChurnSchedule) {
  uint64_t skipped = 0;
  for (uint64_t seed : {1, 2, 3}) {
    const std::filesystem::path dir = essaim::testing::make_temp_dir("essaim-sim-market-" + std::to_string(seed));
    {
      Schedule s(seed, dir);
      s.run(300);
      EXPECT_GT(s.assigned, 20) << seed;
      EXPECT_GT(s.swaps + s.drops, 0) << seed;
      EXPECT_GT(s.told, 0) << seed;
      EXPECT_GT(s.stale_kills, 0) << seed;
      // Who holds what at the end, as the market last heard it, is what the schedule's nodes hold.
      const std::map<std::string, std::vector<size_t>> seen = s.sim().holdings();
      for (const auto& [id, held] : s.final_) EXPECT_EQ(seen.at(id), held) << id;
      skipped += s.sim().counters().skipped;
      EXPECT_GT(s.sim().counters().decisions, 0u) << seed;
    }
    std::filesystem::remove_all(dir);
  }
  EXPECT_GT(skipped, 0u);  // the shortcut (nothing needed, no reservation) was taken too, and agreed
}

}  // namespace
}  // namespace essaim::sim
