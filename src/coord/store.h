// The coordinator's state behind one interface, with two backends: SQLite (the embedded default, one file,
// WAL with synchronous=FULL so a kill -9 loses no committed row) and PostgreSQL (libpq; several coordinator
// processes may share one database). Every method is one transaction; writes that read-then-decide (a
// volunteer's assignment) run inside exclusive(), which serialises them across processes too (SQLite:
// BEGIN IMMEDIATE; PostgreSQL: a transaction-scoped advisory lock). Nothing the market needs lives only in
// one process's memory.
//
//   ESSAIM_ASSIGN_OR_RETURN(std::unique_ptr<Store> db, open_store("coord.sqlite"));  // or postgresql://...
//   ESSAIM_RETURN_IF_ERROR(db->add_node({.node_id = "n-...", .name = "phone-7", .token_sha256 = hex}));
//   ESSAIM_ASSIGN_OR_RETURN(std::vector<NodeRow> nodes, db->list_nodes());
//
// Rows read back are untrusted (a killed process, or another program, may have written them): each is
// validated; a row that does not validate is skipped and counted in invalid_rows(), never trusted.
//
// The market generation (meta 'market_generation') moves in the same transaction as every write that can
// change a market decision, so a process may keep the decisions' rows in memory (coord/market_view.h) and
// reread them only when it moved: the store bumps it itself for reservations, revocations, drops and usage;
// a heartbeat's effect depends on the market's freshness rule, so its writer bumps it (MarketView).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace essaim::coord {

inline constexpr int kStoreSchemaVersion = 2;  // 2: nodes.role

struct NodeRow {
  std::string node_id;        // "n-" + 16 hex
  std::string name;
  std::string token_sha256;   // 64 hex
  bool revoked = false;
  int64_t registered_ms = 0;  // wall clock; the map lists nodes in (registered_ms, node_id) order
  // From the latest heartbeat (empty/0 before the first).
  std::string address;
  std::string model_identity;
  int64_t protocol_version = 0;
  std::string kernel_abi;
  bool fingerprint_ok = false;
  int64_t last_heartbeat_ms = 0;
  int64_t capacity_bytes = 0;
  double load = 0;
  std::string status = "active";  // "active" or "dropped" (stale/revoked are derived, not stored)
  std::string role = "worker";    // "worker" (heartbeats, volunteers) or "backbone" (reports work)
  std::string reason;             // why it was dropped
};

struct HoldingRow {
  std::string node_id;
  int64_t layer = 0, expert_first = 0, expert_count = 0;
  std::string sha256;  // 64 hex, as reported
};

struct UsageRow {
  int64_t layer = 0, expert = 0;
  int64_t count = 0;
};

struct PendingRow {
  std::string node_id;
  int64_t layer = 0, expert_first = 0;
  int64_t until_ms = 0;
  bool give_up = false;  // false: a slice the node downloads; true: one it gives up once its swap's take is served
};

struct WorkRow {
  std::string node_id;
  int64_t pairs_credited = 0, audits = 0, audits_failed = 0, withheld = 0;
};

struct WorkIncrement {
  int64_t pairs = 0, audits = 0, audits_failed = 0;
};

// What a heartbeat found before it wrote: enough for its writer to tell whether a decision may change.
struct HeartbeatChange {
  std::optional<NodeRow> before;  // the node's row before (nullopt: no such node, or an invalid row)
  bool had_holdings = false;      // any holding row before
  bool holdings_changed = false;  // the holding rows differ from the new ones (then they were replaced)
  bool has_pending = false;       // reservations live at the heartbeat's time
};

// Writes through this store since it was opened: transactions that changed a row, and rows changed.
struct StoreWrites {
  uint64_t transactions = 0, rows = 0;
};

class Store {
 public:
  virtual ~Store() = default;
  virtual std::string kind() const = 0;  // "sqlite" or "postgresql"

  virtual Status add_node(const NodeRow& n) = 0;
  // False when no such node. Revoking also forgets its holdings and pending assignments.
  virtual Result<bool> revoke_node(const std::string& node_id) = 0;
  virtual Result<std::optional<NodeRow>> node_by_token_sha256(const std::string& hex) = 0;
  virtual Result<std::vector<NodeRow>> list_nodes() = 0;  // registration order

  // One heartbeat: the node's address, fingerprint, capacity, load and time, and its holdings replaced
  // (rewritten only when they differ). Does not move the market generation (see above).
  virtual Result<HeartbeatChange> record_heartbeat(const NodeRow& fields, const std::vector<HoldingRow>& holdings) = 0;
  Status heartbeat(const NodeRow& fields, const std::vector<HoldingRow>& holdings) {
    return record_heartbeat(fields, holdings).status();
  }
  virtual Result<std::vector<HoldingRow>> list_holdings() = 0;
  virtual Result<std::vector<HoldingRow>> holdings_of(const std::string& node_id) = 0;  // (layer, expert_first) order
  // The nodes that hold something or have a reservation live at now_ms, in registration order: the only
  // nodes a market decision reads (an idle node changes no holder count, reservation or swarm room).
  virtual Result<std::vector<NodeRow>> list_market_nodes(int64_t now_ms) = 0;

  virtual Status add_usage(int64_t layer, const std::vector<int64_t>& counts) = 0;
  // Multiplies every usage count by usage_decay_factor(now - the last decay, half_life_ms), rounded, at most
  // once per half_life / 32 (so rounding cannot eat counts), and forgets counts that reach 0. The first call
  // only records the time. Shares only change when counts are added, so decaying just before add_usage suffices.
  virtual Status decay_usage(int64_t now_ms, int64_t half_life_ms) = 0;
  virtual Result<std::vector<UsageRow>> list_usage() = 0;

  // Pending assignments: replaced for the node (and expired ones forgotten) in one step.
  virtual Status set_pending(const std::string& node_id, const std::vector<PendingRow>& rows, int64_t now_ms) = 0;
  virtual Result<std::vector<PendingRow>> list_pending(int64_t now_ms) = 0;

  // Adds to the node's ledger; audits_failed > 0 drops the node (status "dropped", `reason`) and moves its
  // credited pairs (and any later ones) to withheld.
  virtual Status add_work(const std::string& node_id, const WorkIncrement& w, const std::string& reason) = 0;
  virtual Result<std::vector<WorkRow>> list_work() = 0;

  // nullopt while the stored value is unreadable (a reader must then not trust what it kept); 0 before the first bump.
  virtual Result<std::optional<int64_t>> market_generation() = 0;
  virtual Status bump_market_generation() = 0;

  // Runs `body` as one exclusive transaction: every store call `body` makes (on this thread) joins it, and
  // no other exclusive() body — another thread's on this store, or another coordinator process's sharing
  // the database — runs at the same time.
  virtual Status exclusive(const std::function<Status()>& body) = 0;

  uint64_t invalid_rows() const { return invalid_rows_.load(); }
  virtual StoreWrites writes() const = 0;

 protected:
  std::atomic<uint64_t> invalid_rows_{0};
};

// "postgresql://..." or "postgres://..." → PostgreSQL, with `connections` connections (threads calling the
// store at once each use their own: give the coordinator's thread count); anything else is a SQLite file
// path (created), one connection.
Result<std::unique_ptr<Store>> open_store(const std::string& spec, int connections = 1);

}  // namespace essaim::coord
