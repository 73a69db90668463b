// The coordinator's in-memory market view (coord/market_view.h) decides as the whole store would: two real
// coordinators (SQLite, handlers through answer()) play one seeded churn schedule — joins, heartbeats,
// volunteer rounds with downloads that land a step later, drops, swaps, kill -9s and leaves — one of them
// also holding 5,000 idle nodes (registered at times spread over the schedule, most heartbeating, some
// long silent, some revoked on the way, a few heartbeating through the API at every step). Every heartbeat's
// `volunteer` flag, every volunteer answer, the expert map and the demand must be identical. Then the first
// coordinator is restarted from its store file, reservations in flight, and must answer as before.
// Two coordinators sharing one database see each other's writes through the market generation.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "coord/coordinator.h"
#include "market_driver.h"
#include "slice/model_identity.h"
#include "temp_dir.h"

namespace essaim::coord {
namespace {

using json = nlohmann::json;
using testing::held_bytes;
using testing::joined_worker_turn;
using testing::MarketDriver;
using testing::small_catalogue;
constexpr int kIdleNodes = 5000;

std::string hex16(uint64_t x) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(x));
  return b;
}

struct Node {
  std::string name;
  int64_t budget = 0;
  std::vector<size_t> held, downloading;  // downloads land at the node's next step
  bool alive = true;
};

class TwinSchedule {
 public:
  TwinSchedule(uint64_t seed, const std::filesystem::path& dir)
      : rng_(seed), cat_(small_catalogue()), plain_(cat_, dir / "plain.sqlite", now_), crowded_(cat_, dir / "crowded.sqlite", now_) {
    add_idle_nodes();
  }

  void run(int steps) {
    for (int i = 0; i < steps; ++i) step();
  }
  // Both answer every non-mutating question alike, and each alive node's heartbeat alike.
  void compare_everything() {
    EXPECT_EQ(plain_.expert_map(), crowded_.expert_map()) << " at " << now_;
    EXPECT_EQ(plain_.demand(), crowded_.demand()) << " at " << now_;
    for (Node& n : nodes_) {
      if (n.alive) heartbeat(n);
    }
  }
  MarketDriver& plain() { return plain_; }
  Node* some_alive_node() {
    for (Node& n : nodes_) {
      if (n.alive) return &n;
    }
    return nullptr;
  }
  void round(Node& n) { market_round(n); }
  int assigned = 0, swaps = 0, drops = 0, told = 0, kills = 0, idle_beats = 0, revoked = 0;

 private:
  // kIdleNodes registered straight in the crowded store (one transaction, tokens known for a few): two
  // thirds heartbeated (fresh at the start, then stale unless they beat again), one third never.
  void add_idle_nodes() {
    Store& db = crowded_.store();
    Status st = db.exclusive([&]() -> Status {
      for (int i = 0; i < kIdleNodes; ++i) {
        const std::string name = "idle-" + std::to_string(i), id = "n-" + hex16(0xfeed0000u + uint64_t(i));
        const std::string token = hex16(rng_()) + hex16(rng_()) + hex16(rng_()) + hex16(rng_());
        const int64_t registered = now_ + std::uniform_int_distribution<int64_t>(-1000, 600'000)(rng_);
        ESSAIM_RETURN_IF_ERROR(db.add_node({.node_id = id, .name = name, .token_sha256 = token_hash(token),
                                            .registered_ms = registered}));
        if (i % 3 != 0) {
          NodeRow f{.node_id = id, .name = name, .address = "10.1.0.1:9000", .model_identity = cat_.model_identity,
                    .protocol_version = cat_.protocol_version, .kernel_abi = cat_.kernel_abi, .fingerprint_ok = true,
                    .last_heartbeat_ms = now_, .capacity_bytes = 1000};
          ESSAIM_RETURN_IF_ERROR(db.heartbeat(f, {}));
        }
        if (i < 300) idle_.push_back(name);
        crowded_.know(name, id, token);
      }
      return Status::ok();
    });
    ASSERT_TRUE(st) << st.message();
  }
  static std::string token_hash(const std::string& token) {
    return digest_hex(sha256({reinterpret_cast<const uint8_t*>(token.data()), token.size()}));
  }
  void step() {
    now_ += std::uniform_int_distribution<int64_t>(1, 12000)(rng_);
    idle_step();
    const int kind = std::uniform_int_distribution<int>(0, 19)(rng_);
    if (nodes_.size() < 3 || (kind == 0 && nodes_.size() < 14)) return join();
    Node& n = nodes_[std::uniform_int_distribution<size_t>(0, nodes_.size() - 1)(rng_)];
    land_downloads(n);
    if (!n.alive) {
      if (kind < 4) n.alive = true;  // back, with what its disk holds
      return;
    }
    if (kind == 1 || kind == 2) {
      n.alive = false;
      ++kills;
      if (kind == 2) EXPECT_EQ(plain_.heartbeat(n.name, n.held, n.budget, true), crowded_.heartbeat(n.name, n.held, n.budget, true));
      return;
    }
    if (kind == 3) return compare_everything();
    market_round(n);
  }
  // Idle nodes of the crowded coordinator heartbeat with room and hold nothing; now and then one is revoked.
  void idle_step() {
    for (int k = 0; k < 3; ++k) {
      const std::string& name = idle_[std::uniform_int_distribution<size_t>(0, idle_.size() - 1)(rng_)];
      if (revoked_.count(name)) continue;
      crowded_.heartbeat(name, {}, std::uniform_int_distribution<int64_t>(0, 2000)(rng_), false);
      ++idle_beats;
    }
    if (std::uniform_int_distribution<int>(0, 29)(rng_) == 0) {
      const std::string& name = idle_[std::uniform_int_distribution<size_t>(0, idle_.size() - 1)(rng_)];
      if (revoked_.insert(name).second) {
        crowded_.revoke(name);
        ++revoked;
      }
    }
  }
  void join() {
    Node n;
    n.name = "node-" + std::to_string(nodes_.size());
    plain_.add_node(n.name);
    crowded_.add_node(n.name);
    n.budget = std::uniform_int_distribution<int64_t>(100, 900)(rng_);
    nodes_.push_back(n);
    now_ += 1;  // registration order is (registered_ms, node_id)
  }
  bool heartbeat(Node& n) {
    const bool a = plain_.heartbeat(n.name, n.held, n.budget, false);
    const bool b = crowded_.heartbeat(n.name, n.held, n.budget, false);
    EXPECT_EQ(a, b) << "heartbeat of " << n.name << " at " << now_;
    told += a;
    return a;
  }
  void market_round(Node& n) {
    joined_worker_turn(held_bytes(cat_, n.held), n.budget, rng_, [&] { return heartbeat(n); },
                       [&] { return volunteer_round(n); });
  }
  // Both coordinators must answer alike; the answer applied, returns whether the node's held set changed.
  bool volunteer_round(Node& n) {
    const json a = plain_.volunteer(n.name, n.held, n.budget);
    const json b = crowded_.volunteer(n.name, n.held, n.budget);
    EXPECT_EQ(a, b) << n.name << " at " << now_;
    return apply(n, a);
  }
  size_t index(const json& r) const {
    return *cat_.find(r["layer"].get<int64_t>(), r["expert_first"].get<int64_t>(), r["expert_count"].get<int64_t>());
  }
  // Drops and swaps at once (a swap's take downloaded first); assignments land at the node's next step.
  bool apply(Node& n, const json& c) {
    bool changed = false;
    for (const json& d : c["drop"]) {
      std::erase(n.held, index(d));
      ++drops;
      changed = true;
    }
    for (const json& s : c["assign"]) {
      n.downloading.push_back(index(s));
      ++assigned;
    }
    for (const json& s : c["swap"]) {
      n.held.push_back(index(s["take"]));
      heartbeat(n);
      std::erase(n.held, index(s["give_up"]));
      ++swaps;
      changed = true;
    }
    return changed;
  }
  void land_downloads(Node& n) {
    for (size_t s : n.downloading) {
      if (held_bytes(cat_, n.held) + cat_.slices[s].bytes <= n.budget) n.held.push_back(s);
    }
    n.downloading.clear();
  }

  std::mt19937_64 rng_;
  int64_t now_ = 1'700'000'000'000;
  Catalogue cat_;
  MarketDriver plain_, crowded_;
  std::vector<Node> nodes_;
  std::vector<std::string> idle_;
  std::set<std::string> revoked_;
};

TEST(MarketView, FiveThousandIdleNodesChangeNoDecisionAndARestartKeepsTheState) {
  for (uint64_t seed : {1, 2}) {
    const std::filesystem::path dir = essaim::testing::make_temp_dir("essaim-market-view-" + std::to_string(seed));
    {
      TwinSchedule s(seed, dir);
      s.run(250);
      EXPECT_GT(s.assigned, 20) << seed;
      EXPECT_GT(s.swaps + s.drops, 0) << seed;
      EXPECT_GT(s.told, 0) << seed;
      EXPECT_GT(s.kills, 0) << seed;
      EXPECT_GT(s.idle_beats, 500) << seed;
      EXPECT_GT(s.revoked, 0) << seed;
      // Restarted from its file, with reservations in flight: the same answers as the crowded twin.
      s.plain().restart();
      s.compare_everything();
      Node* n = s.some_alive_node();
      ASSERT_NE(n, nullptr);
      s.round(*n);
      s.run(20);
    }
    std::filesystem::remove_all(dir);
  }
}

// A coordinator keeps the market in memory, but the store is shared: what another process writes (a
// heartbeat's holdings, a revocation) is in the next answer, and a holder that falls silent leaves the map
// when it goes stale, with no write to say so.
TEST(MarketView, AnotherCoordinatorsWritesAndTimeAreSeen) {
  const std::filesystem::path dir = essaim::testing::make_temp_dir("essaim-market-view-shared");
  {
    int64_t now = 1'700'000'000'000;
    const Catalogue cat = small_catalogue();
    MarketDriver a(cat, dir / "shared.sqlite", now), b(cat, dir / "shared.sqlite", now);
    a.add_node("w");
    b.know("w", a.id("w"), a.token("w"));
    EXPECT_TRUE(a.expert_map()["workers"].empty());  // a's copy is made: no worker
    b.heartbeat("w", {0, 1}, 1000, false);
    json map = a.expert_map();
    ASSERT_EQ(map["workers"].size(), 1u) << map.dump();
    EXPECT_EQ(map["workers"][0]["label"], "w");
    EXPECT_EQ(map["workers"][0]["holdings"].size(), 2u);
    now += 20'000;
    b.heartbeat("w", {0, 1}, 1000, false);  // a refresh: changes nothing a decision reads but the time
    now += 11'000;  // stale by the time a's copy holds, fresh by the store's
    EXPECT_EQ(a.expert_map()["workers"].size(), 1u);
    now += 20'000;  // 31 s after the refresh: stale, gone from the map, though nothing was written
    EXPECT_TRUE(a.expert_map()["workers"].empty());
    b.heartbeat("w", {0, 1}, 1000, false);
    EXPECT_EQ(a.expert_map()["workers"].size(), 1u);
    EXPECT_EQ(b.expert_map()["workers"].size(), 1u);
    a.revoke("w");
    EXPECT_TRUE(b.expert_map()["workers"].empty());
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace essaim::coord
