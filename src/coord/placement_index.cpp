#include "coord/placement_index.h"

#include <algorithm>
#include <limits>

namespace essaim::coord {

MarketIndex::MarketIndex(const Catalogue& cat, int64_t heartbeat_s)
    : cat_(&cat),
      heartbeat_s_(heartbeat_s),
      holders_(cat.slices.size(), 0),
      serving_(cat.slices.size(), 0),
      holders_fit_(cat.slices.size(), 0),
      usage_(usage_shares(cat, {})) {
  for (const CatalogueSlice& s : cat.slices) sizes_.push_back(s.bytes);
  std::sort(sizes_.begin(), sizes_.end());
  sizes_.erase(std::unique(sizes_.begin(), sizes_.end()), sizes_.end());
  for (const CatalogueSlice& s : cat.slices)
    size_class_.push_back(size_t(std::lower_bound(sizes_.begin(), sizes_.end(), s.bytes) - sizes_.begin()));
  fit_.assign(sizes_.size(), 0);
}

MarketIndex MarketIndex::from_snapshot(const Catalogue& cat, const MarketSnapshot& s,
                                       const std::vector<PendingRow>& pending, int64_t now_ms, int64_t heartbeat_s) {
  MarketIndex idx(cat, heartbeat_s);
  idx.set_usage(usage_shares(cat, s.usage));
  std::unordered_map<std::string, std::vector<const HoldingRow*>> holdings_of;
  for (const HoldingRow& h : s.holdings) holdings_of[h.node_id].push_back(&h);
  std::unordered_map<std::string, std::vector<const PendingRow*>> pending_of;
  for (const PendingRow& p : pending) pending_of[p.node_id].push_back(&p);
  for (const NodeRow& row : s.nodes) {
    idx.set_node(row.node_id, &row, holdings_of[row.node_id], pending_of[row.node_id], now_ms);
    pending_of.erase(row.node_id);
  }
  // Reservations of nodes with no node row: never gone, so their moves count.
  for (const auto& [id, rows] : pending_of) idx.set_node(id, nullptr, holdings_of[id], rows, now_ms);
  return idx;
}

namespace {

// The first slice at (layer, expert_first), whatever its expert count, as a reservation names it.
std::optional<size_t> slice_at(const Catalogue& cat, int64_t layer, int64_t expert_first) {
  auto it = std::lower_bound(cat.slices.begin(), cat.slices.end(), std::make_pair(layer, expert_first),
                             [](const CatalogueSlice& s, const std::pair<int64_t, int64_t>& k) {
                               return std::make_pair(s.layer, s.expert_first) < k;
                             });
  if (it == cat.slices.end() || it->layer != layer || it->expert_first != expert_first) return std::nullopt;
  return size_t(it - cat.slices.begin());
}

bool holds_row(const std::vector<const HoldingRow*>& holdings, int64_t layer, int64_t expert_first) {
  return std::any_of(holdings.begin(), holdings.end(),
                     [&](const HoldingRow* h) { return h->layer == layer && h->expert_first == expert_first; });
}

// A reservation stands for a download in progress; one of a node that is gone (revoked, dropped, or
// heartbeating before and silent for 3 heartbeats now) downloads nothing, so it must not hide a scarce range.
bool node_is_gone(const NodeRow* row, int64_t now_ms, int64_t heartbeat_s) {
  if (!row) return false;
  const std::string st = node_status(*row, now_ms, heartbeat_s);
  return st == "revoked" || st == "dropped" || (st == "stale" && row->last_heartbeat_ms > 0);
}

void erase_all(std::vector<size_t>& v, size_t x) { v.erase(std::remove(v.begin(), v.end(), x), v.end()); }

}  // namespace

MarketIndex::Terms MarketIndex::terms_of(const NodeRow* row, const std::vector<const HoldingRow*>& holdings,
                                         const std::vector<const PendingRow*>& pending, int64_t now_ms) const {
  const Catalogue& cat = *cat_;
  Terms t;
  if (row && node_is_holder(*row, now_ms, heartbeat_s_)) {
    for (const HoldingRow* h : holdings) {
      std::optional<size_t> s = cat.find(h->layer, h->expert_first, h->expert_count);
      if (s && cat.slices[*s].sha256 == h->sha256) t.valid.push_back(*s);
    }
    std::sort(t.valid.begin(), t.valid.end());
  }
  // The moves still to land: takes of slices not held yet, give-ups of slices still held.
  if (!node_is_gone(row, now_ms, heartbeat_s_)) {
    for (const PendingRow* p : pending) {
      if (holds_row(holdings, p->layer, p->expert_first) != p->give_up) continue;
      const std::optional<size_t> s = slice_at(cat, p->layer, p->expert_first);
      if (s) t.moves.push_back({*s, p->give_up ? -1 : 1});
    }
  }
  t.in_room = !t.valid.empty() && !row->address.empty();
  if (!t.in_room) return t;
  // Its holdings once its moves land, what it serves and is not giving up, and its budget's room.
  std::vector<size_t> future = t.valid;
  t.serving = t.valid;
  for (const Move& m : t.moves) {
    if (m.delta < 0) {
      erase_all(future, m.slice);
      erase_all(t.serving, m.slice);
    } else {
      future.push_back(m.slice);
    }
  }
  std::sort(future.begin(), future.end());
  future.erase(std::unique(future.begin(), future.end()), future.end());
  t.left = row->capacity_bytes;
  for (size_t s : future) t.left -= cat.slices[s].bytes;
  t.future = std::move(future);
  return t;
}

void MarketIndex::apply(const Terms& t, int sign) {
  for (size_t s : t.valid) holders_[s] += sign;
  for (const Move& m : t.moves) holders_[m.slice] += sign * m.delta;
  if (!t.in_room) return;
  for (size_t s : t.serving) serving_[s] += sign;
  for (size_t k = 0; k < sizes_.size() && sizes_[k] <= t.left; ++k) fit_[k] += sign;
  for (size_t s : t.future) {
    if (cat_->slices[s].bytes <= t.left) holders_fit_[s] += sign;
  }
}

void MarketIndex::set_node(const std::string& node_id, const NodeRow* row,
                           const std::vector<const HoldingRow*>& holdings, const std::vector<const PendingRow*>& pending,
                           int64_t now_ms) {
  remove_node(node_id);
  Terms t = terms_of(row, holdings, pending, now_ms);
  if (t.valid.empty() && t.moves.empty() && !t.in_room) return;
  apply(t, +1);
  nodes_.emplace(node_id, std::move(t));
}

void MarketIndex::remove_node(const std::string& node_id) {
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return;
  apply(it->second, -1);
  nodes_.erase(it);
}

std::vector<int64_t> MarketIndex::future_holders(const std::string& asker) const {
  std::vector<int64_t> h = holders_;
  if (auto it = nodes_.find(asker); it != nodes_.end()) {
    for (const Move& m : it->second.moves) h[m.slice] -= m.delta;  // the asker's own moves are offered again
  }
  return h;
}

const std::vector<size_t>* MarketIndex::map_slices(const std::string& node_id) const {
  auto it = nodes_.find(node_id);
  return it != nodes_.end() && it->second.in_room ? &it->second.valid : nullptr;
}

// The other room nodes that lack `slice` and have room for it: those with room for its size, less those
// that will hold it, less the asker if it is one of the first and not of the second.
int64_t MarketIndex::takers(size_t slice, const Terms* asker) const {
  const int64_t bytes = cat_->slices[slice].bytes;
  int64_t n = fit_[size_class_[slice]] - holders_fit_[slice];
  if (asker && asker->in_room && asker->left >= bytes &&
      !std::binary_search(asker->future.begin(), asker->future.end(), slice))
    --n;
  return n;
}

VolunteerChoice MarketIndex::decide(const VolunteerAsk& ask, int64_t replicas) const {
  auto it = nodes_.find(ask.node_id);
  const Terms* asker = it == nodes_.end() ? nullptr : &it->second;
  SwarmRoom room{std::vector<int64_t>(cat_->slices.size(), 0), serving_};
  for (size_t s : ask.held) {
    if (s < cat_->slices.size()) room.takers[s] += takers(s, asker);
  }
  return choose_volunteer(*cat_, compute_demand(*cat_, future_holders(ask.node_id), usage_, replicas), ask.held,
                          ask.budget_bytes, room);
}

int64_t MarketIndex::term_boundary(const NodeRow* row, const std::vector<const PendingRow*>& pending, int64_t now_ms,
                                   int64_t heartbeat_s) {
  int64_t t = std::numeric_limits<int64_t>::max();
  if (row && row->last_heartbeat_ms > 0) {
    const int64_t stale_at = row->last_heartbeat_ms + 3 * heartbeat_s * 1000 + 1;
    if (stale_at > now_ms) t = stale_at;
  }
  for (const PendingRow* p : pending) {
    if (p->until_ms > now_ms) t = std::min(t, p->until_ms);
  }
  return t;
}

}  // namespace essaim::coord
