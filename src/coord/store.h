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

class Store {
 public:
  virtual ~Store() = default;
  virtual std::string kind() const = 0;  // "sqlite" or "postgresql"

  virtual Status add_node(const NodeRow& n) = 0;
  // False when no such node. Revoking also forgets its holdings and pending assignments.
  virtual Result<bool> revoke_node(const std::string& node_id) = 0;
  virtual Result<std::optional<NodeRow>> node_by_token_sha256(const std::string& hex) = 0;
  virtual Result<std::vector<NodeRow>> list_nodes() = 0;  // registration order

  // One heartbeat: the node's address, fingerprint, capacity, load and time, and its holdings replaced.
  virtual Status heartbeat(const NodeRow& fields, const std::vector<HoldingRow>& holdings) = 0;
  virtual Result<std::vector<HoldingRow>> list_holdings() = 0;

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

  // Runs `body` as one exclusive transaction: every store call `body` makes joins it, and no other
  // coordinator process sharing the database runs an exclusive() body at the same time.
  virtual Status exclusive(const std::function<Status()>& body) = 0;

  uint64_t invalid_rows() const { return invalid_rows_.load(); }

 protected:
  std::atomic<uint64_t> invalid_rows_{0};
};

// "postgresql://..." or "postgres://..." → PostgreSQL; anything else is a SQLite file path (created).
Result<std::unique_ptr<Store>> open_store(const std::string& spec);

}  // namespace essaim::coord
