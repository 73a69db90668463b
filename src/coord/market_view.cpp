#include "coord/market_view.h"

#include <algorithm>
#include <limits>

#include "coord/placement_index.h"

namespace essaim::coord {

bool MarketState::has_pending(const std::string& node_id) const {
  return std::any_of(pending.begin(), pending.end(), [&](const PendingRow& p) { return p.node_id == node_id; });
}

bool MarketView::fresh(const NodeRow& n, int64_t now_ms) const {
  return n.last_heartbeat_ms > 0 && now_ms - n.last_heartbeat_ms <= 3 * rules_.heartbeat_s * 1000;
}

Result<std::shared_ptr<const MarketState>> MarketView::load(Store& db, int64_t now_ms) {
  auto s = std::make_shared<MarketState>();
  // One transaction: the generation is read first, so rows are never older than the generation they carry.
  Status st = db.exclusive([&]() -> Status {
    ESSAIM_ASSIGN_OR_RETURN(s->generation, db.market_generation());
    ESSAIM_ASSIGN_OR_RETURN(s->snapshot.nodes, db.list_market_nodes(now_ms));
    ESSAIM_ASSIGN_OR_RETURN(s->snapshot.holdings, db.list_holdings());
    ESSAIM_ASSIGN_OR_RETURN(s->snapshot.usage, db.list_usage());
    ESSAIM_ASSIGN_OR_RETURN(s->pending, db.list_pending(now_ms));
    return Status::ok();
  });
  if (!st) return st;
  ++reloads_;
  s->loaded_ms = now_ms;
  // The window closes when a fresh node in it would go stale or a reservation expire: both change decisions
  // with no write to signal them. A stale node only turns fresh by a heartbeat, which moves the generation.
  int64_t until = std::numeric_limits<int64_t>::max();
  for (const NodeRow& n : s->snapshot.nodes) {
    if (fresh(n, now_ms)) until = std::min(until, n.last_heartbeat_ms + 3 * rules_.heartbeat_s * 1000 + 1);
  }
  for (const PendingRow& p : s->pending) until = std::min(until, p.until_ms);
  s->valid_until_ms = until;
  const std::vector<int64_t> h =
      MarketIndex::from_snapshot(cat_, s->snapshot, s->pending, now_ms, rules_.heartbeat_s).future_holders("");
  s->nothing_needed = std::all_of(h.begin(), h.end(), [&](int64_t x) { return x >= rules_.replicas; });
  return std::shared_ptr<const MarketState>(std::move(s));
}

Result<std::shared_ptr<const MarketState>> MarketView::current(Store& db, int64_t now_ms) {
  ESSAIM_ASSIGN_OR_RETURN(std::optional<int64_t> generation, db.market_generation());
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ && generation && state_->generation == generation && state_->valid_at(now_ms)) return state_;
  }
  ESSAIM_ASSIGN_OR_RETURN(std::shared_ptr<const MarketState> s, load(db, now_ms));
  std::lock_guard<std::mutex> lock(mu_);
  state_ = s;
  return s;
}

Result<bool> MarketView::tells_nothing(Store& db, const std::string& node_id, int64_t now_ms) {
  ESSAIM_ASSIGN_OR_RETURN(std::shared_ptr<const MarketState> s, current(db, now_ms));
  // Without a reservation of its own the asker sees future_holders(""), all at `replicas`: choose_volunteer
  // finds no needed slice, so it assigns, swaps and drops nothing.
  const bool nothing = s->nothing_needed && !s->has_pending(node_id);
  if (nothing) ++skipped_;
  return nothing;
}

Result<VolunteerChoice> MarketView::decide(Store& db, const VolunteerAsk& ask) {
  ESSAIM_ASSIGN_OR_RETURN(std::shared_ptr<const MarketState> s, current(db, ask.now_ms));
  if (s->nothing_needed && !s->has_pending(ask.node_id)) {
    ++skipped_;
    return VolunteerChoice{};
  }
  ++decisions_;
  // The nodes left out hold and reserve nothing: they add no holder, no move and no room, so the choice is
  // the one the whole store would give.
  return decide_volunteer(cat_, s->snapshot, s->pending, ask, rules_);
}

Status MarketView::heartbeat(Store& db, const NodeRow& f, const std::vector<HoldingRow>& holdings, bool leaving,
                             int64_t now_ms) {
  return db.exclusive([&]() -> Status {
    ESSAIM_ASSIGN_OR_RETURN(HeartbeatChange ch, db.record_heartbeat(f, holdings));
    if (leaving) ESSAIM_RETURN_IF_ERROR(db.set_pending(f.node_id, {}, now_ms));  // moves the generation itself
    if (!ch.had_holdings && holdings.empty() && !ch.has_pending) return Status::ok();  // idle: in no decision
    const bool changed = !ch.before || ch.holdings_changed || !fresh(*ch.before, now_ms) ||
                         ch.before->fingerprint_ok != f.fingerprint_ok || ch.before->capacity_bytes != f.capacity_bytes ||
                         ch.before->address != f.address;
    return changed ? db.bump_market_generation() : Status::ok();
  });
}

}  // namespace essaim::coord
