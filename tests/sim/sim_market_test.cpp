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
#include <set>

#include "coord/coordinator.h"
#include "sim/sim_market.h"
#include "temp_dir.h"

namespace essaim::sim {
namespace {

using json = nlohmann::json;
const std::string kAdmin = "admin-token-for-sim-tests-0123456789";

coord::Catalogue small_catalogue() {
  coord::Catalogue c;
  c.model_identity = std::string(64, 'a');
  c.architecture = "qwen35moe";
  c.n_layers = 3;
  c.n_experts = 16;
  c.n_expert_used = 4;
  c.protocol_version = 3;
  c.kernel_abi = "1";
  for (int64_t l = 0; l < 3; ++l) {
    for (int64_t f = 0; f < 16; f += 4) {
      c.slices.push_back({"s" + std::to_string(l) + "." + std::to_string(f), l, f, 4, 100 + 10 * ((l + f) % 3),
                          std::string(63, 'b') + "0123456789abcdef"[l * 4 + f / 4]});
    }
  }
  return c;
}

// The real coordinator, asked through its handlers.
class RealMarket {
 public:
  RealMarket(const coord::Catalogue& cat, const std::filesystem::path& dir, int64_t& now) : cat_(cat) {
    auto store = coord::open_store((dir / "coord.sqlite").string());
    EXPECT_TRUE(store) << store.status().message();
    coord_ = std::make_unique<coord::Coordinator>(
        cat, std::move(*store),
        coord::CoordinatorConfig{.admin_token = kAdmin, .slices_dir = dir.string(), .replicas = 2, .heartbeat_s = 10,
                                 .threads = 1, .now_ms = [&now] { return now; }});
  }
  ~RealMarket() { coord_->stop(); }
  std::string add_node(const std::string& name) {
    json r = call("POST", "/api/nodes", {{"name", name}}, kAdmin);
    tokens_[r["node_id"]] = r["token"];
    return r["node_id"];
  }
  bool heartbeat(const std::string& id, const std::vector<size_t>& held, int64_t capacity, bool leaving) {
    json holdings = json::array();
    for (size_t s : held) holdings.push_back(range(s, true));
    json b = {{"node_id", id}, {"address", "10.0.0.1:9000"}, {"holdings", leaving ? json::array() : holdings},
              {"fingerprint", {{"model_identity", cat_.model_identity}, {"protocol_version", cat_.protocol_version},
                               {"kernel_abi", cat_.kernel_abi}}},
              {"capacity_bytes", capacity}, {"load", 0}};
    if (leaving) b["leaving"] = true;
    return call("POST", "/api/expert-coverage", b, tokens_.at(id))["volunteer"];
  }
  coord::VolunteerChoice volunteer(const std::string& id, const std::vector<size_t>& held, int64_t budget) {
    json holding = json::array();
    for (size_t s : held) holding.push_back(range(s, false));
    json a = call("POST", "/api/expert-volunteer", {{"node_id", id}, {"budget_bytes", budget}, {"holding", holding}},
                  tokens_.at(id));
    coord::VolunteerChoice c;
    for (const json& x : a["assign"]) c.assign.push_back(index(x));
    for (const json& x : a["drop"]) c.drop.push_back(index(x));
    for (const json& x : a["swap"]) c.swap.push_back({index(x["take"]), index(x["give_up"])});
    return c;
  }

 private:
  json call(const std::string& method, const std::string& path, const json& body, const std::string& token) {
    net::HttpReply r = coord_->answer({.method = method, .target = path, .body = body.dump(),
                                       .authorization = "Bearer " + token});
    EXPECT_LT(r.status, 300) << path << ": " << r.body;
    return json::parse(r.body);
  }
  json range(size_t s, bool with_sha) const {
    const coord::CatalogueSlice& c = cat_.slices[s];
    json j = {{"layer", c.layer}, {"expert_first", c.expert_first}, {"expert_count", c.expert_count}};
    if (with_sha) j["sha256"] = c.sha256;
    return j;
  }
  size_t index(const json& r) const {
    return *cat_.find(r["layer"].get<int64_t>(), r["expert_first"].get<int64_t>(), r["expert_count"].get<int64_t>());
  }
  const coord::Catalogue& cat_;
  std::unique_ptr<coord::Coordinator> coord_;
  std::map<std::string, std::string> tokens_;
};

struct Node {
  std::string id;
  int64_t budget = 0;
  std::vector<size_t> held;
  bool alive = true;
};

class Schedule {
 public:
  Schedule(uint64_t seed, const std::filesystem::path& dir)
      : rng_(seed), cat_(small_catalogue()), real_(cat_, dir, now_), sim_(cat_, {.heartbeat_s = 10, .replicas = 2}) {}

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
  int64_t bytes(const std::vector<size_t>& held) const {
    int64_t b = 0;
    for (size_t s : held) b += cat_.slices[s].bytes;
    return b;
  }
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
      EXPECT_EQ(real_.heartbeat(n.id, n.held, n.budget, true), sim_.heartbeat(n.id, n.held, n.budget, true, now_));
      return;
    }
    market_round(n);
  }
  void join() {
    Node n;
    n.id = real_.add_node("node-" + std::to_string(nodes_.size()));
    sim_.add_node(n.id, now_);
    n.budget = std::uniform_int_distribution<int64_t>(100, 900)(rng_);
    nodes_.push_back(n);
    now_ += 1;  // registration order is (registered_ms, node_id)
  }
  bool heartbeat(Node& n) {
    const bool a = real_.heartbeat(n.id, n.held, n.budget, false);
    const bool b = sim_.heartbeat(n.id, n.held, n.budget, false, now_);
    EXPECT_EQ(a, b) << "heartbeat of " << n.id << " at " << now_;
    told += a;
    return a;
  }
  // worker/joined_worker.cpp's loop body: heartbeat; volunteer when told or with room; after a change, again.
  void market_round(Node& n) {
    const bool t = heartbeat(n);
    if (!t && bytes(n.held) + 100 > n.budget && std::uniform_int_distribution<int>(0, 4)(rng_) != 0) return;
    for (int again = 0; again < 4; ++again) {
      const coord::VolunteerChoice a = real_.volunteer(n.id, n.held, n.budget);
      const coord::VolunteerChoice b = sim_.volunteer(n.id, n.held, n.budget, now_);
      EXPECT_EQ(a.assign, b.assign) << n.id << " at " << now_;
      EXPECT_EQ(a.drop, b.drop) << n.id << " at " << now_;
      EXPECT_EQ(a.swap, b.swap) << n.id << " at " << now_;
      if (!apply(n, a)) break;
      heartbeat(n);
    }
  }
  bool apply(Node& n, const coord::VolunteerChoice& c) {
    bool changed = false;
    for (size_t d : c.drop) {
      std::erase(n.held, d);
      ++drops;
      changed = true;
    }
    for (size_t s : c.assign) {
      if (bytes(n.held) + cat_.slices[s].bytes > n.budget) continue;
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
  RealMarket real_;
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
