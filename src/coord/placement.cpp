#include "coord/placement.h"

#include "coord/placement_index.h"

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

VolunteerChoice decide_volunteer(const Catalogue& cat, const MarketSnapshot& s, const std::vector<PendingRow>& pending,
                                 const VolunteerAsk& ask, const MarketRules& rules) {
  return MarketIndex::from_snapshot(cat, s, pending, ask.now_ms, rules.heartbeat_s).decide(ask, rules.replicas);
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
