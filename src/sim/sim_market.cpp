#include "sim/sim_market.h"

#include <algorithm>
#include <limits>

namespace essaim::sim {

void SimMarket::add_node(const std::string& node_id, int64_t now_ms) {
  if (index_.count(node_id)) return;
  index_.emplace(node_id, nodes_.size());
  Node n;
  n.row.node_id = node_id;
  n.row.name = node_id;
  n.row.registered_ms = now_ms;
  nodes_.push_back(std::move(n));
  changed();
}

coord::MarketSnapshot SimMarket::involved_snapshot() const {
  coord::MarketSnapshot s;
  for (size_t i : involved_) {
    s.nodes.push_back(nodes_[i].row);
    s.holdings.insert(s.holdings.end(), nodes_[i].holdings.begin(), nodes_[i].holdings.end());
  }
  return s;
}

void SimMarket::index_node(size_t i, int64_t now_ms) {
  const Node& n = nodes_[i];
  std::vector<const coord::HoldingRow*> holdings;
  for (const coord::HoldingRow& h : n.holdings) holdings.push_back(&h);
  std::vector<const coord::PendingRow*> live;
  for (const coord::PendingRow& p : n.pending) {
    if (p.until_ms > now_ms) live.push_back(&p);
  }
  market_index_.set_node(n.row.node_id, &n.row, holdings, live, now_ms);
  if (boundary_of_.size() < nodes_.size()) boundary_of_.resize(nodes_.size(), 0);
  if (boundary_of_[i] != 0) boundaries_.erase({boundary_of_[i], i});
  boundary_of_[i] = 0;
  const int64_t b = coord::MarketIndex::term_boundary(&n.row, live, now_ms, rules_.heartbeat_s);
  if (involved_.count(i) && b != std::numeric_limits<int64_t>::max()) {
    boundary_of_[i] = b;
    boundaries_.insert({b, i});
  }
}

void SimMarket::pass_boundaries(int64_t now_ms) {
  while (!boundaries_.empty() && boundaries_.begin()->first <= now_ms) index_node(boundaries_.begin()->second, now_ms);
}

void SimMarket::set_pending(const std::string& node_id, std::vector<coord::PendingRow> rows, int64_t now_ms) {
  Node& n = nodes_[index_.at(node_id)];
  if (rows.empty() && n.pending.empty()) return;
  n.pending = std::move(rows);
  // The store forgets every expired reservation at the same time; they no longer count either way.
  for (size_t i : involved_) {
    std::vector<coord::PendingRow>& p = nodes_[i].pending;
    p.erase(std::remove_if(p.begin(), p.end(), [&](const coord::PendingRow& r) { return r.until_ms <= now_ms; }), p.end());
  }
  const size_t me = index_.at(node_id);
  if (n.pending.empty() && n.holdings.empty()) involved_.erase(me); else involved_.insert(me);
  index_node(me, now_ms);
  changed();
}

bool SimMarket::heartbeat(const std::string& node_id, const std::vector<size_t>& held, int64_t capacity_bytes,
                          bool leaving, int64_t now_ms) {
  ++counters_.heartbeats;
  pass_boundaries(now_ms);
  Node& n = nodes_[index_.at(node_id)];
  const bool was_fresh = coord::node_is_holder(n.row, now_ms, rules_.heartbeat_s);
  static const std::vector<size_t> kNothing;
  const std::vector<size_t>& now_held = leaving ? kNothing : held;  // a leaving heartbeat holds nothing
  const bool same = now_held.size() == n.holdings.size() &&
                    std::equal(now_held.begin(), now_held.end(), n.holdings.begin(), [&](size_t s, const auto& h) {
                      return cat_.slices[s].layer == h.layer && cat_.slices[s].expert_first == h.expert_first;
                    });
  n.row.fingerprint_ok = true;
  n.row.model_identity = cat_.model_identity;
  n.row.protocol_version = cat_.protocol_version;
  n.row.kernel_abi = cat_.kernel_abi;
  n.row.address = node_id;
  n.row.last_heartbeat_ms = now_ms;
  n.row.capacity_bytes = capacity_bytes;
  if (!same) {  // the rows are rebuilt only when they change (most heartbeats repeat the last one)
    n.holdings.clear();
    for (size_t s : now_held) {
      const coord::CatalogueSlice& c = cat_.slices[s];
      n.holdings.push_back({node_id, c.layer, c.expert_first, c.expert_count, c.sha256});
    }
  }
  const size_t me = index_.at(node_id);
  if (!n.holdings.empty()) involved_.insert(me);
  // The index is current before anyone is told of the change: a waiting actor may run at once and read it.
  index_node(me, now_ms);
  if (!same || !was_fresh) changed();
  if (leaving) set_pending(node_id, {}, now_ms);
  if (n.pending.empty() && n.holdings.empty()) involved_.erase(me);
  index_node(me, now_ms);
  if (leaving) return false;
  if (n.pending.empty() && nothing_needed(now_ms)) {
    ++counters_.skipped;
    return false;
  }
  ++counters_.decisions;
  return !market_index_.decide({node_id, held, capacity_bytes, now_ms}, rules_.replicas).empty();
}

coord::VolunteerChoice SimMarket::volunteer(const std::string& node_id, const std::vector<size_t>& held,
                                            int64_t budget_bytes, int64_t now_ms) {
  ++counters_.volunteers;
  pass_boundaries(now_ms);
  const Node& n = nodes_[index_.at(node_id)];
  coord::VolunteerChoice c;
  if (n.pending.empty() && nothing_needed(now_ms)) {
    ++counters_.skipped;
  } else {
    ++counters_.decisions;
    c = market_index_.decide({node_id, held, budget_bytes, now_ms}, rules_.replicas);
  }
  counters_.assigned += c.assign.size();
  counters_.swaps += c.swap.size();
  counters_.drops += c.drop.size();
  set_pending(node_id, coord::reservations(cat_, node_id, c, now_ms), now_ms);
  return c;
}

bool SimMarket::nothing_needed(int64_t now_ms) {
  pass_boundaries(now_ms);
  if (needed_generation_ == generation_ && now_ms < needed_valid_until_) return nothing_needed_;
  const std::vector<int64_t> h = market_index_.future_holders("");
  nothing_needed_ = std::all_of(h.begin(), h.end(), [&](int64_t x) { return x >= rules_.replicas; });
  // Valid until a fresh holder could go stale or a reservation expire (heartbeats only push these later).
  needed_generation_ = generation_;
  needed_valid_until_ = boundaries_.empty() ? std::numeric_limits<int64_t>::max() : boundaries_.begin()->first;
  return nothing_needed_;
}

std::vector<coord::MapWorker> SimMarket::expert_map(int64_t now_ms) {
  ++counters_.map_reads;
  pass_boundaries(now_ms);
  if (map_generation_ == generation_ && now_ms < map_valid_until_) return map_;
  // What coord::expert_map lists, read from the index (its terms are current once the boundaries passed):
  // healthy holders with an address, in registration order, each with its valid holdings.
  map_.clear();
  for (size_t i : involved_) {
    const coord::NodeRow& row = nodes_[i].row;
    const std::vector<size_t>* slices = market_index_.map_slices(row.node_id);
    if (slices) map_.push_back({row.node_id, row.address, *slices});
  }
  map_generation_ = generation_;
  map_valid_until_ = boundaries_.empty() ? std::numeric_limits<int64_t>::max() : boundaries_.begin()->first;
  return map_;
}

std::vector<int64_t> SimMarket::holders(int64_t now_ms) const {
  const coord::MarketSnapshot s = involved_snapshot();
  return coord::count_holders(cat_, s.nodes, s.holdings, now_ms, rules_.heartbeat_s);
}

std::map<std::string, std::vector<size_t>> SimMarket::holdings() const {
  std::map<std::string, std::vector<size_t>> out;
  for (const Node& n : nodes_) {
    std::vector<size_t>& v = out[n.row.node_id];
    for (const coord::HoldingRow& h : n.holdings) v.push_back(*cat_.find(h.layer, h.expert_first, h.expert_count));
    std::sort(v.begin(), v.end());
  }
  return out;
}

}  // namespace essaim::sim
