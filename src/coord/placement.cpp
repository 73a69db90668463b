#include "coord/placement.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>

namespace essaim::coord {

std::optional<size_t> Catalogue::find(int64_t layer, int64_t expert_first, int64_t expert_count) const {
  auto it = std::lower_bound(slices.begin(), slices.end(), std::make_pair(layer, expert_first),
                             [](const CatalogueSlice& s, const std::pair<int64_t, int64_t>& k) {
                               return std::make_pair(s.layer, s.expert_first) < k;
                             });
  if (it == slices.end() || it->layer != layer || it->expert_first != expert_first || it->expert_count != expert_count)
    return std::nullopt;
  return size_t(it - slices.begin());
}

std::optional<size_t> Catalogue::find_name(const std::string& name) const {
  for (size_t i = 0; i < slices.size(); ++i) {
    if (slices[i].name == name) return i;
  }
  return std::nullopt;
}

bool node_is_holder(const NodeRow& n, int64_t now_ms, int64_t heartbeat_s) {
  return !n.revoked && n.status == "active" && n.fingerprint_ok && n.last_heartbeat_ms > 0 &&
         now_ms - n.last_heartbeat_ms <= 3 * heartbeat_s * 1000;
}

std::string node_status(const NodeRow& n, int64_t now_ms, int64_t heartbeat_s) {
  if (n.revoked) return "revoked";
  if (n.status == "dropped") return "dropped";
  if (n.last_heartbeat_ms > 0 && now_ms - n.last_heartbeat_ms <= 3 * heartbeat_s * 1000) return "active";
  return "stale";
}

namespace {
// The valid holdings of healthy nodes, as (node index, slice index).
template <typename F>
void for_each_valid_holding(const Catalogue& cat, const std::vector<NodeRow>& nodes,
                            const std::vector<HoldingRow>& holdings, int64_t now_ms, int64_t heartbeat_s, F&& f) {
  std::map<std::string, size_t> healthy;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (node_is_holder(nodes[i], now_ms, heartbeat_s)) healthy.emplace(nodes[i].node_id, i);
  }
  for (const HoldingRow& h : holdings) {
    auto it = healthy.find(h.node_id);
    if (it == healthy.end()) continue;
    std::optional<size_t> s = cat.find(h.layer, h.expert_first, h.expert_count);
    if (!s || cat.slices[*s].sha256 != h.sha256) continue;
    f(it->second, *s);
  }
}
}  // namespace

std::vector<int64_t> count_holders(const Catalogue& cat, const std::vector<NodeRow>& nodes,
                                   const std::vector<HoldingRow>& holdings, int64_t now_ms, int64_t heartbeat_s) {
  std::vector<int64_t> h(cat.slices.size(), 0);
  for_each_valid_holding(cat, nodes, holdings, now_ms, heartbeat_s, [&](size_t, size_t s) { ++h[s]; });
  return h;
}

std::vector<double> usage_shares(const Catalogue& cat, const std::vector<UsageRow>& usage) {
  std::map<int64_t, std::map<int64_t, int64_t>> by_layer;
  for (const UsageRow& u : usage) {
    if (u.expert < cat.n_experts) by_layer[u.layer][u.expert] += u.count;
  }
  std::vector<double> out(cat.slices.size(), 0);
  for (size_t i = 0; i < cat.slices.size(); ++i) {
    const CatalogueSlice& s = cat.slices[i];
    auto it = by_layer.find(s.layer);
    double total = 0, mine = 0;
    if (it != by_layer.end()) {
      for (const auto& [e, n] : it->second) {
        total += double(n);
        if (e >= s.expert_first && e < s.expert_first + s.expert_count) mine += double(n);
      }
    }
    out[i] = total > 0 ? mine / total : cat.n_experts > 0 ? double(s.expert_count) / double(cat.n_experts) : 0;
  }
  return out;
}

std::vector<RangeDemand> compute_demand(const Catalogue& cat, const std::vector<int64_t>& holders,
                                        const std::vector<double>& usage, int64_t replicas) {
  std::vector<RangeDemand> d;
  d.reserve(cat.slices.size());
  for (size_t i = 0; i < cat.slices.size(); ++i) {
    const int64_t h = i < holders.size() ? holders[i] : 0;
    const double u = i < usage.size() ? usage[i] : 0;
    d.push_back({i, replicas, h, u, double(std::max<int64_t>(0, replicas - h)) * u});
  }
  std::stable_sort(d.begin(), d.end(), [&](const RangeDemand& a, const RangeDemand& b) {
    if (a.scarcity != b.scarcity) return a.scarcity > b.scarcity;
    const CatalogueSlice &x = cat.slices[a.slice], &y = cat.slices[b.slice];
    return std::make_pair(x.layer, x.expert_first) < std::make_pair(y.layer, y.expert_first);
  });
  return d;
}

namespace {

int64_t slice_bytes(const Catalogue& cat, size_t s) { return s < cat.slices.size() ? cat.slices[s].bytes : 0; }

// The needed slices (fewer holders than wanted) the node lacks: holes first, then demand order.
std::vector<const RangeDemand*> needed_order(const std::vector<RangeDemand>& demand, const std::set<size_t>& held) {
  std::vector<const RangeDemand*> out;
  for (const RangeDemand& d : demand) {
    if (d.holders < d.wanted && !held.count(d.slice)) out.push_back(&d);
  }
  std::stable_partition(out.begin(), out.end(), [](const RangeDemand* d) { return d->holders == 0; });
  return out;
}

int64_t at(const std::vector<int64_t>& v, size_t i) { return i < v.size() ? v[i] : 0; }

// One held slice to give up for `take`, or nullopt: see choose_volunteer in placement.h.
std::optional<size_t> give_up_for(const Catalogue& cat, const std::vector<RangeDemand>& demand, const RangeDemand& take,
                                  const std::set<size_t>& held, int64_t left, const SwarmRoom& room) {
  std::vector<const RangeDemand*> candidates;
  for (const RangeDemand& d : demand) {
    if (held.count(d.slice)) candidates.push_back(&d);
  }
  std::stable_sort(candidates.begin(), candidates.end(), [](const RangeDemand* a, const RangeDemand* b) {
    if (a->usage != b->usage) return a->usage < b->usage;  // least used first
    return a->holders > b->holders;
  });
  for (const RangeDemand* x : candidates) {
    if (slice_bytes(cat, take.slice) > left + slice_bytes(cat, x->slice)) continue;
    const int64_t serving = room.serving.empty() ? x->holders : at(room.serving, x->slice);
    if (serving < 2) continue;
    if (x->holders - 1 >= take.holders + 1) return x->slice;
    if (x->holders - 1 == take.holders && x->holders >= 2 && at(room.takers, x->slice) > 0) return x->slice;
  }
  return std::nullopt;
}

}  // namespace

VolunteerChoice choose_volunteer(const Catalogue& cat, const std::vector<RangeDemand>& demand,
                                 const std::vector<size_t>& held, int64_t budget_bytes, const SwarmRoom& room) {
  VolunteerChoice c;
  const std::set<size_t> held_set(held.begin(), held.end());
  int64_t left = budget_bytes;
  for (size_t s : held_set) left -= slice_bytes(cat, s);
  std::vector<const RangeDemand*> left_out;
  for (const RangeDemand* d : needed_order(demand, held_set)) {
    const int64_t bytes = slice_bytes(cat, d->slice);
    if (bytes <= left) {
      c.assign.push_back(d->slice);
      left -= bytes;
    } else {
      left_out.push_back(d);
    }
  }
  if (left_out.empty()) return c;
  for (const RangeDemand* d : left_out) {
    if (std::optional<size_t> x = give_up_for(cat, demand, *d, held_set, left, room)) {
      c.swap.push_back({d->slice, *x});
      break;
    }
  }
  for (const RangeDemand& d : demand) {
    const bool given_up = !c.swap.empty() && c.swap[0].give_up == d.slice;
    if (held_set.count(d.slice) && d.holders > d.wanted && !given_up) c.drop.push_back(d.slice);
  }
  std::sort(c.drop.begin(), c.drop.end());
  return c;
}

SwarmRoom swarm_room(const Catalogue& cat, const std::vector<NodeHoldings>& nodes, const std::string& asker,
                     const std::vector<size_t>& held) {
  SwarmRoom r{std::vector<int64_t>(cat.slices.size(), 0), std::vector<int64_t>(cat.slices.size(), 0)};
  for (const NodeHoldings& n : nodes) {
    for (size_t s : n.serving) {
      if (s < r.serving.size()) ++r.serving[s];
    }
    if (n.node_id == asker) continue;
    const std::set<size_t> mine(n.slices.begin(), n.slices.end());
    int64_t left = n.budget_bytes;
    for (size_t s : mine) left -= slice_bytes(cat, s);
    for (size_t s : held) {
      if (s < cat.slices.size() && !mine.count(s) && cat.slices[s].bytes <= left) ++r.takers[s];
    }
  }
  return r;
}

namespace {

// A reservation stands for a download in progress; one of a node that is gone (revoked, dropped, or
// heartbeating before and silent for 3 heartbeats now) downloads nothing, so it must not hide a scarce range.
std::set<std::string> gone_nodes(const std::vector<NodeRow>& nodes, int64_t now_ms, int64_t heartbeat_s) {
  std::set<std::string> gone;
  for (const NodeRow& n : nodes) {
    const std::string st = node_status(n, now_ms, heartbeat_s);
    if (st == "revoked" || st == "dropped" || (st == "stale" && n.last_heartbeat_ms > 0)) gone.insert(n.node_id);
  }
  return gone;
}

// The pending assignments of live nodes still to land: takes of slices not held yet, give-ups of slices
// still held.
struct InFlight {
  std::string node_id;
  size_t slice = 0;
  bool give_up = false;
};
std::vector<InFlight> in_flight(const Catalogue& cat, const MarketSnapshot& s, const std::vector<PendingRow>& pending,
                                const std::set<std::string>& gone) {
  std::set<std::tuple<std::string, int64_t, int64_t>> holds;
  for (const HoldingRow& h : s.holdings) holds.emplace(h.node_id, h.layer, h.expert_first);
  std::map<std::pair<int64_t, int64_t>, size_t> slice_at;  // (layer, expert_first) -> slice
  for (size_t i = 0; i < cat.slices.size(); ++i) slice_at.emplace(std::make_pair(cat.slices[i].layer, cat.slices[i].expert_first), i);
  std::vector<InFlight> out;
  for (const PendingRow& p : pending) {
    if (gone.count(p.node_id) || holds.count({p.node_id, p.layer, p.expert_first}) != size_t(p.give_up)) continue;
    auto it = slice_at.find({p.layer, p.expert_first});
    if (it != slice_at.end()) out.push_back({p.node_id, it->second, p.give_up});
  }
  return out;
}

// Every healthy node's valid holdings as they will be once its pending assignments land, what it serves and
// is not giving up, and its budget (its heartbeat's capacity).
std::vector<NodeHoldings> future_holdings(const Catalogue& cat, const MarketSnapshot& s, const std::vector<InFlight>& moves,
                                          int64_t now_ms, int64_t heartbeat_s) {
  std::map<std::string, int64_t> budget;
  for (const NodeRow& row : s.nodes) budget[row.node_id] = row.capacity_bytes;
  std::map<std::string, std::vector<const InFlight*>> moves_of;
  for (const InFlight& m : moves) moves_of[m.node_id].push_back(&m);
  std::vector<NodeHoldings> out;
  for (const MapWorker& w : expert_map(cat, s.nodes, s.holdings, now_ms, heartbeat_s)) {
    NodeHoldings n{w.node_id, w.slices, w.slices, budget[w.node_id]};
    for (const InFlight* mp : moves_of[n.node_id]) {
      const InFlight& m = *mp;
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

}  // namespace

namespace {
std::vector<int64_t> holders_after(const Catalogue& cat, const MarketSnapshot& s, const std::vector<InFlight>& moves,
                                   const std::string& asker, int64_t now_ms, int64_t heartbeat_s) {
  std::vector<int64_t> holders = count_holders(cat, s.nodes, s.holdings, now_ms, heartbeat_s);
  for (const InFlight& m : moves) {
    if (m.node_id != asker) holders[m.slice] += m.give_up ? -1 : 1;
  }
  return holders;
}
}  // namespace

std::vector<int64_t> future_holders(const Catalogue& cat, const MarketSnapshot& s, const std::vector<PendingRow>& pending,
                                    const std::string& asker, int64_t now_ms, int64_t heartbeat_s) {
  return holders_after(cat, s, in_flight(cat, s, pending, gone_nodes(s.nodes, now_ms, heartbeat_s)), asker, now_ms,
                       heartbeat_s);
}

VolunteerChoice decide_volunteer(const Catalogue& cat, const MarketSnapshot& s, const std::vector<PendingRow>& pending,
                                 const VolunteerAsk& ask, const MarketRules& rules) {
  const std::vector<InFlight> moves = in_flight(cat, s, pending, gone_nodes(s.nodes, ask.now_ms, rules.heartbeat_s));
  // Holders as they will be once the other nodes' moves land; this node's own are offered again.
  const std::vector<int64_t> holders = holders_after(cat, s, moves, ask.node_id, ask.now_ms, rules.heartbeat_s);
  return choose_volunteer(cat, compute_demand(cat, holders, usage_shares(cat, s.usage), rules.replicas), ask.held,
                          ask.budget_bytes,
                          swarm_room(cat, future_holdings(cat, s, moves, ask.now_ms, rules.heartbeat_s), ask.node_id,
                                     ask.held));
}

std::vector<PendingRow> reservations(const Catalogue& cat, const std::string& node_id, const VolunteerChoice& choice,
                                     int64_t now_ms) {
  std::vector<PendingRow> out;
  const auto row = [&](size_t i, bool give_up) {
    return PendingRow{node_id, cat.slices[i].layer, cat.slices[i].expert_first, now_ms + kPendingMs, give_up};
  };
  for (size_t i : choice.assign) out.push_back(row(i, false));
  for (const SwapOrder& s : choice.swap) {
    out.push_back(row(s.take, false));
    out.push_back(row(s.give_up, true));
  }
  return out;
}

double usage_decay_factor(int64_t elapsed_ms, int64_t half_life_ms) {
  if (half_life_ms <= 0 || elapsed_ms <= 0) return 1;
  return std::exp2(-double(elapsed_ms) / double(half_life_ms));
}

std::vector<MapWorker> expert_map(const Catalogue& cat, const std::vector<NodeRow>& nodes,
                                  const std::vector<HoldingRow>& holdings, int64_t now_ms, int64_t heartbeat_s) {
  std::vector<std::vector<size_t>> per_node(nodes.size());
  for_each_valid_holding(cat, nodes, holdings, now_ms, heartbeat_s,
                         [&](size_t n, size_t s) { per_node[n].push_back(s); });
  std::vector<MapWorker> out;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (per_node[i].empty() || nodes[i].address.empty()) continue;
    std::sort(per_node[i].begin(), per_node[i].end());
    out.push_back({nodes[i].node_id, nodes[i].address, per_node[i]});
  }
  return out;
}

}  // namespace essaim::coord
