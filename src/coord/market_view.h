// The rows a market decision reads, kept in memory by one coordinator process and reread from the store
// only when the store's market generation moved (another request or process changed something a decision
// reads) or when the copy's time window ends (a holder in it would go stale, a reservation expire). The
// store stays the truth: a restarted coordinator starts with no copy, and every reread goes through the
// store's validation. Decisions are the placement functions' own, on the same rows they read before
// (docs/market.md, "What a request costs"): only nodes that hold or reserved something are kept, and an
// asker without a reservation is told "nothing" without deciding while every slice has its replicas
// (MarketIndex::future_holders), as essaim-sim's SimMarket does.
//
//   MarketView view(cat, {.heartbeat_s = 10, .replicas = 2});
//   ESSAIM_RETURN_IF_ERROR(view.heartbeat(db, fields, holdings, /*leaving=*/false, now_ms));
//   ESSAIM_ASSIGN_OR_RETURN(VolunteerChoice c, view.decide(db, {node_id, held, budget, now_ms}));
//   ESSAIM_ASSIGN_OR_RETURN(std::shared_ptr<const MarketState> s, view.current(db, now_ms));  // map, demand
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "coord/placement.h"
#include "coord/store.h"

namespace essaim::coord {

// One consistent read of the market, valid for `now` in [loaded_ms, valid_until_ms) while the store's
// generation is `generation`. Rows of nodes in it carry their fields as read: their time and load may be
// older than the store's (a heartbeat that only refreshes a fresh node moves no generation).
struct MarketState {
  std::optional<int64_t> generation;  // nullopt: unreadable, so never reused
  int64_t loaded_ms = 0, valid_until_ms = 0;
  MarketSnapshot snapshot;            // list_market_nodes, every holding, usage
  std::vector<PendingRow> pending;    // live at loaded_ms (and so throughout the window)
  bool nothing_needed = false;        // every slice has `replicas` future holders
  bool valid_at(int64_t now_ms) const { return now_ms >= loaded_ms && now_ms < valid_until_ms; }
  bool has_pending(const std::string& node_id) const;
};

struct MarketViewCounters {
  uint64_t reloads = 0, decisions = 0, skipped = 0;  // skipped: told "nothing" without deciding
};

class MarketView {
 public:
  MarketView(const Catalogue& cat, MarketRules rules) : cat_(cat), rules_(rules) {}

  // The state the store holds now (reread when the generation moved or now_ms is outside the window).
  // Called inside Store::exclusive, the check and any reread join that transaction.
  Result<std::shared_ptr<const MarketState>> current(Store& db, int64_t now_ms);
  // What decide_volunteer answers for `ask` on the store's rows now.
  Result<VolunteerChoice> decide(Store& db, const VolunteerAsk& ask);
  // Whether decide() would answer `node_id` "nothing" without deciding (no reservation of its own, and
  // every slice has its replicas): then it is, whatever it holds and whatever its budget.
  Result<bool> tells_nothing(Store& db, const std::string& node_id, int64_t now_ms);
  // One heartbeat written (a leaving node's reservations forgotten with it), in one exclusive transaction
  // that moves the generation when the heartbeat can change a decision: the node holds or reserved
  // something (before or now) and its holdings, fingerprint, capacity or address changed, or it was stale.
  Status heartbeat(Store& db, const NodeRow& fields, const std::vector<HoldingRow>& holdings, bool leaving, int64_t now_ms);

  MarketViewCounters counters() const { return {reloads_.load(), decisions_.load(), skipped_.load()}; }

 private:
  Result<std::shared_ptr<const MarketState>> load(Store& db, int64_t now_ms);
  bool fresh(const NodeRow& n, int64_t now_ms) const;

  const Catalogue& cat_;
  const MarketRules rules_;
  std::mutex mu_;
  std::shared_ptr<const MarketState> state_;  // under mu_
  std::atomic<uint64_t> reloads_{0}, decisions_{0}, skipped_{0};
};

}  // namespace essaim::coord
