// The coordinator as essaim-sim runs it: the store's rows kept in memory with the store's semantics
// (a heartbeat replaces the node's holdings; set_pending replaces the node's reservations and forgets the
// expired ones; reservations count until until_ms), and every answer decided by the coordinator's own
// code (coord/placement.h, coord/placement_index.h: MarketIndex::decide, which decide_volunteer runs;
// reservations, expert_map, count_holders). It answers the heartbeat's `volunteer` flag and the volunteer
// endpoint as Coordinator::Impl::coverage/volunteer do (the decisions-identical test drives both with one
// schedule and compares).
//
// Scale: the coordinator indexes its whole state for each decision; SimMarket keeps one MarketIndex and
// sets in it only the node whose rows changed, and a node whose terms change with the clock (its heartbeat
// going stale, a reservation expiring) again once its boundary passes, so a decision costs the asker's
// rows, not the swarm's. The map is computed again only when the state changed or a boundary passed. A node
// with no reservation of its own is told "nothing" without deciding when no slice is needed.
//
//   SimMarket m(cat, {.heartbeat_s = 10, .replicas = 2});
//   m.add_node("n-0000000000000001", now_ms);
//   bool ask = m.heartbeat("n-...", held, capacity, /*leaving=*/false, now_ms);
//   coord::VolunteerChoice c = m.volunteer("n-...", held, budget, now_ms);
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "coord/placement.h"
#include "coord/placement_index.h"

namespace essaim::sim {

struct MarketCounters {
  uint64_t heartbeats = 0, volunteers = 0, map_reads = 0;
  uint64_t decisions = 0;       // decide_volunteer calls
  uint64_t skipped = 0;         // answers given without deciding (nothing needed, no reservation)
  uint64_t assigned = 0, swaps = 0, drops = 0;
};

class SimMarket {
 public:
  SimMarket(coord::Catalogue cat, coord::MarketRules rules)
      : cat_(std::move(cat)), rules_(rules), market_index_(cat_, rules_.heartbeat_s) {}
  SimMarket(const SimMarket&) = delete;  // market_index_ points at cat_
  SimMarket& operator=(const SimMarket&) = delete;

  void add_node(const std::string& node_id, int64_t now_ms);
  // POST /api/expert-coverage: the node's holdings (catalogue slices) replaced; the answer's `volunteer`.
  bool heartbeat(const std::string& node_id, const std::vector<size_t>& held, int64_t capacity_bytes, bool leaving,
                 int64_t now_ms);
  // POST /api/expert-volunteer with `holding`: the choice, reserved.
  coord::VolunteerChoice volunteer(const std::string& node_id, const std::vector<size_t>& held, int64_t budget_bytes,
                                   int64_t now_ms);
  // GET /api/expert-map.
  std::vector<coord::MapWorker> expert_map(int64_t now_ms);
  // Live holders per slice, as the coordinator counts them (fresh heartbeats).
  std::vector<int64_t> holders(int64_t now_ms) const;

  // Whether every slice has `replicas` future holders: then any node without a reservation is told nothing
  // (future_holders). The answer stands until the state changes (on_change) or needed_valid_until() (ms).
  bool nothing_needed(int64_t now_ms);
  int64_t needed_valid_until() const { return needed_valid_until_; }
  void set_on_change(std::function<void()> f) { on_change_ = std::move(f); }
  bool has_reservation(const std::string& node_id) const { return !nodes_[index_.at(node_id)].pending.empty(); }
  // Requests the simulation answered for idle nodes without asking (heartbeats and volunteers of nodes that
  // hold and reserve nothing while nothing is needed: each would have been told nothing).
  void count_idle_requests(uint64_t heartbeats, uint64_t volunteers) {
    counters_.heartbeats += heartbeats;
    counters_.volunteers += volunteers;
    counters_.skipped += heartbeats + volunteers;
  }

  const coord::Catalogue& catalogue() const { return cat_; }
  const MarketCounters& counters() const { return counters_; }
  // Every node's holdings as last heartbeaten, by node id (the decisions-identical test compares these).
  std::map<std::string, std::vector<size_t>> holdings() const;

 private:
  struct Node {
    coord::NodeRow row;
    std::vector<coord::HoldingRow> holdings;
    std::vector<coord::PendingRow> pending;
  };
  // The rows of the nodes that hold or reserved something (the others change no count and are not listed).
  coord::MarketSnapshot involved_snapshot() const;
  // Sets node i's rows in the index as of now_ms, and its next term boundary (if it is involved).
  void index_node(size_t i, int64_t now_ms);
  void pass_boundaries(int64_t now_ms);  // index again every node whose boundary is <= now_ms
  void set_pending(const std::string& node_id, std::vector<coord::PendingRow> rows, int64_t now_ms);
  void changed() {
    ++generation_;
    if (on_change_) on_change_();
  }

  coord::Catalogue cat_;
  coord::MarketRules rules_;
  std::vector<Node> nodes_;                 // registration order
  std::map<std::string, size_t> index_;
  std::set<size_t> involved_;               // nodes with holdings or reservations
  coord::MarketIndex market_index_;
  std::set<std::pair<int64_t, size_t>> boundaries_;  // (time its terms change, involved node)
  std::vector<int64_t> boundary_of_;                 // per node: its entry's time, or 0 if none
  std::vector<coord::MapWorker> map_;                // expert_map's answer, while map_generation_ is current
  uint64_t map_generation_ = 0;
  int64_t map_valid_until_ = 0;
  MarketCounters counters_;
  uint64_t generation_ = 1;
  // nothing_needed's answer, valid while the state is unchanged and before the next time boundary (a
  // holder going stale, a reservation expiring).
  uint64_t needed_generation_ = 0;
  int64_t needed_valid_until_ = 0;
  bool nothing_needed_ = false;
  std::function<void()> on_change_;
};

}  // namespace essaim::sim
