// The one Store implementation, over either SqlConnection: the schema, its version, and every read checked.
#include "coord/store.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <tuple>

#include "coord/placement.h"
#include "coord/sql_connection.h"
#include "coord/validate.h"

namespace essaim::coord {
namespace {

// Types both databases accept: BIGINT is an integer in SQLite, DOUBLE PRECISION a REAL.
const char* const kSchema[] = {
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS nodes (node_id TEXT PRIMARY KEY, name TEXT NOT NULL, token_sha256 TEXT NOT NULL UNIQUE,"
    " revoked BIGINT NOT NULL DEFAULT 0, registered_ms BIGINT NOT NULL, address TEXT NOT NULL DEFAULT '',"
    " model_identity TEXT NOT NULL DEFAULT '', protocol_version BIGINT NOT NULL DEFAULT 0,"
    " kernel_abi TEXT NOT NULL DEFAULT '', fingerprint_ok BIGINT NOT NULL DEFAULT 0,"
    " last_heartbeat_ms BIGINT NOT NULL DEFAULT 0, capacity_bytes BIGINT NOT NULL DEFAULT 0,"
    " node_load DOUBLE PRECISION NOT NULL DEFAULT 0, status TEXT NOT NULL DEFAULT 'active',"
    " reason TEXT NOT NULL DEFAULT '', role TEXT NOT NULL DEFAULT 'worker')",
    "CREATE TABLE IF NOT EXISTS holdings (node_id TEXT NOT NULL, layer BIGINT NOT NULL, expert_first BIGINT NOT NULL,"
    " expert_count BIGINT NOT NULL, sha256 TEXT NOT NULL, PRIMARY KEY (node_id, layer, expert_first))",
    "CREATE TABLE IF NOT EXISTS expert_usage (layer BIGINT NOT NULL, expert BIGINT NOT NULL, n BIGINT NOT NULL,"
    " PRIMARY KEY (layer, expert))",
    "CREATE TABLE IF NOT EXISTS pending (node_id TEXT NOT NULL, layer BIGINT NOT NULL, expert_first BIGINT NOT NULL,"
    " until_ms BIGINT NOT NULL, PRIMARY KEY (node_id, layer, expert_first))",
    // A swap's give-up (issue 41). Its own table, so a database of schema 2 gains it without a migration.
    "CREATE TABLE IF NOT EXISTS pending_give_up (node_id TEXT NOT NULL, layer BIGINT NOT NULL,"
    " expert_first BIGINT NOT NULL, until_ms BIGINT NOT NULL, PRIMARY KEY (node_id, layer, expert_first))",
    "CREATE TABLE IF NOT EXISTS work (node_id TEXT PRIMARY KEY, pairs_credited BIGINT NOT NULL DEFAULT 0,"
    " audits BIGINT NOT NULL DEFAULT 0, audits_failed BIGINT NOT NULL DEFAULT 0, withheld BIGINT NOT NULL DEFAULT 0)",
};

std::optional<int64_t> to_i64(const SqlValue& v) {
  if (!v) return std::nullopt;
  int64_t x = 0;
  const char* end = v->data() + v->size();
  auto [p, ec] = std::from_chars(v->data(), end, x);
  if (ec != std::errc() || p != end) return std::nullopt;
  return x;
}
std::optional<double> to_f64(const SqlValue& v) {
  if (!v || v->empty() || v->size() > 64) return std::nullopt;
  char* end = nullptr;
  const double x = std::strtod(v->c_str(), &end);
  if (end != v->c_str() + v->size() || !std::isfinite(x)) return std::nullopt;
  return x;
}
std::string s(int64_t x) { return std::to_string(x); }

using PendingKey = std::tuple<int64_t, int64_t, bool>;  // (layer, expert_first, give_up)
using HoldingKey = std::tuple<int64_t, int64_t, int64_t, std::string>;

// Whether the reservations a node will have differ, for a market decision, from those it had (both live
// at now_ms): another slice, or one that now expires sooner (an expiry later changes nothing a reader
// must reread: it rereads when its copy expires).
bool pending_changed(const std::map<PendingKey, int64_t>& before, const std::map<PendingKey, int64_t>& after) {
  if (before.size() != after.size()) return true;
  for (const auto& [k, until] : after) {
    auto it = before.find(k);
    if (it == before.end() || until < it->second) return true;
  }
  return false;
}

// The store's connections, each used by one thread at a time: a statement outside a transaction borrows one
// for itself; a transaction keeps one for its thread until it ends, and every store call that thread makes
// meanwhile joins it. SQLite gets one (it has one writer at a time anyway); PostgreSQL as many as asked,
// so the round trips of requests on different threads overlap.
class ConnectionPool {
 public:
  explicit ConnectionPool(std::vector<std::unique_ptr<SqlConnection>> all) : all_(std::move(all)) {
    for (const auto& c : all_) idle_.push_back(c.get());
  }
  const SqlConnection& first() const { return *all_.front(); }
  // The connection of this thread's transaction, or nullptr.
  SqlConnection* bound() {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = bound_.find(std::this_thread::get_id());
    return it == bound_.end() ? nullptr : it->second;
  }
  // An idle connection (waits for one), bound to this thread when `for_transaction`.
  SqlConnection* take(bool for_transaction) {
    std::unique_lock<std::mutex> lock(mu_);
    idle_cv_.wait(lock, [&] { return !idle_.empty(); });
    SqlConnection* c = idle_.back();
    idle_.pop_back();
    if (for_transaction) bound_[std::this_thread::get_id()] = c;
    return c;
  }
  void give_back(SqlConnection* c) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      bound_.erase(std::this_thread::get_id());  // a thread borrows for a statement only while unbound
      idle_.push_back(c);
    }
    idle_cv_.notify_one();
  }
  struct Borrowed {
    ConnectionPool& pool;
    SqlConnection* c;
    ~Borrowed() { pool.give_back(c); }
  };

 private:
  std::vector<std::unique_ptr<SqlConnection>> all_;
  std::mutex mu_;
  std::condition_variable idle_cv_;
  std::vector<SqlConnection*> idle_;
  std::map<std::thread::id, SqlConnection*> bound_;
};

class SqlStore final : public Store {
 public:
  explicit SqlStore(std::vector<std::unique_ptr<SqlConnection>> c) : pool_(std::move(c)) {}
  std::string kind() const override { return pool_.first().kind(); }

  Status init() {
    return tx(true, [&]() -> Status {
      for (const char* stmt : kSchema) ESSAIM_RETURN_IF_ERROR(q(stmt).status());
      ESSAIM_RETURN_IF_ERROR(
          q("INSERT INTO meta (key, value) VALUES ('schema_version', $1) ON CONFLICT (key) DO NOTHING",
            {s(kStoreSchemaVersion)}).status());
      ESSAIM_ASSIGN_OR_RETURN(SqlRows rows, q("SELECT value FROM meta WHERE key = 'schema_version'"));
      const std::optional<int64_t> v = rows.size() == 1 && !rows[0].empty() ? to_i64(rows[0][0]) : std::nullopt;
      if (v != kStoreSchemaVersion) {
        return Status::error("the database's schema version is " + (v ? s(*v) : std::string("unreadable")) +
                             "; this build uses version " + s(kStoreSchemaVersion) + " (use another --db)");
      }
      return Status::ok();
    });
  }

  Status add_node(const NodeRow& n) override {
    return tx(false, [&] {
      return q("INSERT INTO nodes (node_id, name, token_sha256, revoked, registered_ms, role) VALUES ($1, $2, $3, 0, $4, $5)",
               {n.node_id, n.name, n.token_sha256, s(n.registered_ms), n.role}).status();
    });
  }

  Result<bool> revoke_node(const std::string& node_id) override {
    bool found = false;
    Status st = tx(false, [&]() -> Status {
      ESSAIM_ASSIGN_OR_RETURN(SqlRows r, q("UPDATE nodes SET revoked = 1 WHERE node_id = $1 RETURNING node_id", {node_id}));
      found = !r.empty();
      ESSAIM_RETURN_IF_ERROR(q("DELETE FROM holdings WHERE node_id = $1", {node_id}).status());
      ESSAIM_RETURN_IF_ERROR(q("DELETE FROM pending_give_up WHERE node_id = $1", {node_id}).status());
      ESSAIM_RETURN_IF_ERROR(q("DELETE FROM pending WHERE node_id = $1", {node_id}).status());
      return found ? bump_market_generation() : Status::ok();
    });
    if (!st) return st;
    return found;
  }

  Result<std::optional<NodeRow>> node_by_token_sha256(const std::string& hex) override {
    ESSAIM_ASSIGN_OR_RETURN(SqlRows rows, q(std::string(kNodeColumns) + " FROM nodes WHERE token_sha256 = $1", {hex}));
    for (const auto& r : rows) {
      if (std::optional<NodeRow> n = node_from(r)) return std::optional<NodeRow>(std::move(*n));
    }
    return std::optional<NodeRow>();
  }

  Result<std::vector<NodeRow>> list_nodes() override {
    ESSAIM_ASSIGN_OR_RETURN(SqlRows rows, q(std::string(kNodeColumns) + " FROM nodes ORDER BY registered_ms, node_id"));
    std::vector<NodeRow> out;
    for (const auto& r : rows) {
      if (std::optional<NodeRow> n = node_from(r)) out.push_back(std::move(*n));
    }
    return out;
  }

  Result<HeartbeatChange> record_heartbeat(const NodeRow& f, const std::vector<HoldingRow>& holdings) override {
    HeartbeatChange ch;
    Status st = tx(false, [&]() -> Status {
      // The row and whether it has live reservations in one statement: one round trip less to a PostgreSQL server.
      ESSAIM_ASSIGN_OR_RETURN(
          SqlRows node, q(std::string(kNodeColumns) + ", (SELECT COUNT(*) FROM pending WHERE node_id = $1 AND until_ms > $2)"
                                                      " + (SELECT COUNT(*) FROM pending_give_up WHERE node_id = $1 AND"
                                                      " until_ms > $2) FROM nodes WHERE node_id = $1",
                          {f.node_id, s(f.last_heartbeat_ms)}));
      if (!node.empty()) {
        const std::optional<int64_t> live = to_i64(node[0].back());
        ch.has_pending = !live || *live > 0;  // unreadable: assume it has some (a reader rereads, nothing worse)
        node[0].pop_back();
        ch.before = node_from(node[0]);
      }
      ESSAIM_ASSIGN_OR_RETURN(SqlRows old, q(std::string(kHoldingColumns) + " WHERE node_id = $1", {f.node_id}));
      ch.had_holdings = !old.empty();
      ch.holdings_changed = !same_holdings(old, holdings);
      ESSAIM_RETURN_IF_ERROR(
          q("UPDATE nodes SET address = $2, model_identity = $3, protocol_version = $4, kernel_abi = $5,"
            " fingerprint_ok = $6, last_heartbeat_ms = $7, capacity_bytes = $8, node_load = $9 WHERE node_id = $1",
            {f.node_id, f.address, f.model_identity, s(f.protocol_version), f.kernel_abi, s(f.fingerprint_ok ? 1 : 0),
             s(f.last_heartbeat_ms), s(f.capacity_bytes), std::to_string(f.load)}).status());
      return ch.holdings_changed ? replace_holdings(f.node_id, holdings) : Status::ok();
    });
    if (!st) return st;
    return ch;
  }

  Result<std::vector<HoldingRow>> list_holdings() override {
    ESSAIM_ASSIGN_OR_RETURN(SqlRows rows, q(std::string(kHoldingColumns) + " ORDER BY node_id, layer, expert_first"));
    return valid_holdings(rows);
  }

  Result<std::vector<HoldingRow>> holdings_of(const std::string& node_id) override {
    ESSAIM_ASSIGN_OR_RETURN(SqlRows rows, q(std::string(kHoldingColumns) + " WHERE node_id = $1 ORDER BY layer, expert_first",
                                            {node_id}));
    return valid_holdings(rows);
  }

  Result<std::vector<NodeRow>> list_market_nodes(int64_t now_ms) override {
    ESSAIM_ASSIGN_OR_RETURN(
        SqlRows rows,
        q(std::string(kNodeColumns) + " FROM nodes WHERE node_id IN (SELECT node_id FROM holdings UNION SELECT node_id FROM pending"
                                      " WHERE until_ms > $1 UNION SELECT node_id FROM pending_give_up WHERE until_ms > $1)"
                                      " ORDER BY registered_ms, node_id",
          {s(now_ms)}));
    std::vector<NodeRow> out;
    for (const auto& r : rows) {
      if (std::optional<NodeRow> n = node_from(r)) out.push_back(std::move(*n));
    }
    return out;
  }

  Status add_usage(int64_t layer, const std::vector<int64_t>& counts) override {
    return tx(false, [&]() -> Status {
      bool added = false;
      for (size_t e = 0; e < counts.size(); ++e) {
        if (counts[e] == 0) continue;
        ESSAIM_RETURN_IF_ERROR(
            q("INSERT INTO expert_usage (layer, expert, n) VALUES ($1, $2, $3) ON CONFLICT (layer, expert)"
              " DO UPDATE SET n = expert_usage.n + excluded.n",
              {s(layer), s(int64_t(e)), s(counts[e])}).status());
        added = true;
      }
      return added ? bump_market_generation() : Status::ok();
    });
  }

  Status decay_usage(int64_t now_ms, int64_t half_life_ms) override {
    if (half_life_ms <= 0) return Status::ok();
    return tx(false, [&]() -> Status {
      ESSAIM_ASSIGN_OR_RETURN(SqlRows rows, q("SELECT value FROM meta WHERE key = 'usage_decayed_ms'"));
      const std::optional<int64_t> last = rows.size() == 1 && !rows[0].empty() ? to_i64(rows[0][0]) : std::nullopt;
      if (last && (now_ms - *last) < half_life_ms / 32) return Status::ok();
      if (last) {
        // Rounded here rather than in SQL: the two databases break ties of ROUND(double) differently.
        const double f = usage_decay_factor(now_ms - *last, half_life_ms);
        ESSAIM_ASSIGN_OR_RETURN(std::vector<UsageRow> usage, list_usage());
        bool decayed = false;
        for (const UsageRow& u : usage) {
          const int64_t n = std::llround(double(u.count) * f);
          if (n == u.count) continue;
          decayed = true;
          ESSAIM_RETURN_IF_ERROR(
              (n > 0 ? q("UPDATE expert_usage SET n = $3 WHERE layer = $1 AND expert = $2", {s(u.layer), s(u.expert), s(n)})
                     : q("DELETE FROM expert_usage WHERE layer = $1 AND expert = $2", {s(u.layer), s(u.expert)}))
                  .status());
        }
        if (decayed) ESSAIM_RETURN_IF_ERROR(bump_market_generation());
      }
      return q("INSERT INTO meta (key, value) VALUES ('usage_decayed_ms', $1) ON CONFLICT (key) DO UPDATE SET"
               " value = excluded.value", {s(now_ms)}).status();
    });
  }

  Result<std::vector<UsageRow>> list_usage() override {
    ESSAIM_ASSIGN_OR_RETURN(SqlRows rows, q("SELECT layer, expert, n FROM expert_usage ORDER BY layer, expert"));
    std::vector<UsageRow> out;
    for (const auto& r : rows) {
      const auto layer = to_i64(r[0]), e = to_i64(r[1]), n = to_i64(r[2]);
      if (!layer || !e || !n || *layer < 0 || *layer > kMaxLayer || *e < 0 || *e > kMaxExpert || *n < 0) {
        bad();
        continue;
      }
      out.push_back({*layer, *e, *n});
    }
    return out;
  }

  Status set_pending(const std::string& node_id, const std::vector<PendingRow>& rows, int64_t now_ms) override {
    return tx(false, [&]() -> Status {
      std::map<PendingKey, int64_t> before, after;
      for (const bool give_up : {false, true}) {
        ESSAIM_ASSIGN_OR_RETURN(SqlRows gone, q(std::string("DELETE FROM ") + (give_up ? "pending_give_up" : "pending") +
                                                " WHERE node_id = $1 OR until_ms <= $2 RETURNING node_id, layer,"
                                                " expert_first, until_ms", {node_id, s(now_ms)}));
        for (const auto& r : gone) {
          const auto layer = to_i64(r[1]), first = to_i64(r[2]), until = to_i64(r[3]);
          if (r[0] != SqlValue(node_id)) continue;
          // An unreadable row counted for nothing (list_pending skips it); that it is gone changes nothing.
          if (layer && first && until && *until > now_ms) before[{*layer, *first, give_up}] = *until;
        }
      }
      for (const PendingRow& p : rows) {
        const std::string table = p.give_up ? "pending_give_up" : "pending";
        ESSAIM_RETURN_IF_ERROR(q("INSERT INTO " + table + " (node_id, layer, expert_first, until_ms) VALUES ($1, $2, $3, $4)"
                                 " ON CONFLICT (node_id, layer, expert_first) DO UPDATE SET until_ms = excluded.until_ms",
                                 {node_id, s(p.layer), s(p.expert_first), s(p.until_ms)}).status());
        if (p.until_ms > now_ms) after[{p.layer, p.expert_first, p.give_up}] = p.until_ms;
        else after.erase({p.layer, p.expert_first, p.give_up});
      }
      return pending_changed(before, after) ? bump_market_generation() : Status::ok();
    });
  }

  Result<std::vector<PendingRow>> list_pending(int64_t now_ms) override {
    std::vector<PendingRow> out;
    for (const bool give_up : {false, true}) {
      ESSAIM_ASSIGN_OR_RETURN(SqlRows rows, q(std::string("SELECT node_id, layer, expert_first, until_ms FROM ") +
                                              (give_up ? "pending_give_up" : "pending") +
                                              " WHERE until_ms > $1 ORDER BY node_id, layer, expert_first", {s(now_ms)}));
      for (const auto& r : rows) {
        const auto layer = to_i64(r[1]), first = to_i64(r[2]), until = to_i64(r[3]);
        if (!r[0] || !node_id_valid(*r[0]) || !layer || !first || !until || !range_valid(*layer, *first, 1)) {
          bad();
          continue;
        }
        out.push_back({*r[0], *layer, *first, *until, give_up});
      }
    }
    return out;
  }

  Status add_work(const std::string& node_id, const WorkIncrement& w, const std::string& reason) override {
    return tx(false, [&]() -> Status {
      ESSAIM_RETURN_IF_ERROR(q("INSERT INTO work (node_id) VALUES ($1) ON CONFLICT (node_id) DO NOTHING", {node_id}).status());
      ESSAIM_ASSIGN_OR_RETURN(SqlRows st, q("SELECT status FROM nodes WHERE node_id = $1", {node_id}));
      const bool dropped = !st.empty() && st[0][0] == std::optional<std::string>("dropped");
      if (dropped || w.audits_failed > 0) {
        // A dropped node earns nothing more: everything credited so far, and these pairs, are withheld.
        ESSAIM_RETURN_IF_ERROR(q("UPDATE work SET withheld = withheld + pairs_credited + $2, pairs_credited = 0,"
                                 " audits = audits + $3, audits_failed = audits_failed + $4 WHERE node_id = $1",
                                 {node_id, s(w.pairs), s(w.audits), s(w.audits_failed)}).status());
        if (!dropped) {
          ESSAIM_RETURN_IF_ERROR(
              q("UPDATE nodes SET status = 'dropped', reason = $2 WHERE node_id = $1", {node_id, reason}).status());
          return bump_market_generation();
        }
        return Status::ok();
      }
      return q("UPDATE work SET pairs_credited = pairs_credited + $2, audits = audits + $3,"
               " audits_failed = audits_failed + $4 WHERE node_id = $1",
               {node_id, s(w.pairs), s(w.audits), s(w.audits_failed)}).status();
    });
  }

  Result<std::vector<WorkRow>> list_work() override {
    ESSAIM_ASSIGN_OR_RETURN(SqlRows rows, q("SELECT node_id, pairs_credited, audits, audits_failed, withheld FROM work"
                                            " ORDER BY node_id"));
    std::vector<WorkRow> out;
    for (const auto& r : rows) {
      const auto a = to_i64(r[1]), b = to_i64(r[2]), c = to_i64(r[3]), d = to_i64(r[4]);
      if (!r[0] || !node_id_valid(*r[0]) || !a || !b || !c || !d || *a < 0 || *b < 0 || *c < 0 || *d < 0) {
        bad();
        continue;
      }
      out.push_back({*r[0], *a, *b, *c, *d});
    }
    return out;
  }

  Result<std::optional<int64_t>> market_generation() override {
    ESSAIM_ASSIGN_OR_RETURN(SqlRows rows, q("SELECT value FROM meta WHERE key = 'market_generation'"));
    if (rows.empty()) return std::optional<int64_t>(0);
    const std::optional<int64_t> g = rows[0].empty() ? std::nullopt : to_i64(rows[0][0]);
    if (!g || *g < 0) {
      bad();
      return std::optional<int64_t>();
    }
    return g;
  }

  Status bump_market_generation() override {
    return tx(false, [&]() -> Status {
      ESSAIM_ASSIGN_OR_RETURN(std::optional<int64_t> g, market_generation());
      if (!g) {
        // Unreadable: a value no reader can hold (they hold none while it is unreadable) would do; a random
        // one also differs from whatever a reader held before it was spoiled.
        std::random_device rd;
        const int64_t fresh = int64_t(((uint64_t(rd()) << 32) | rd()) >> 2);
        return q("UPDATE meta SET value = $1 WHERE key = 'market_generation'", {s(fresh)}).status();
      }
      // The increment is the database's: two writers that cannot see each other's transactions (PostgreSQL
      // outside exclusive()) still make two steps.
      return q("INSERT INTO meta (key, value) VALUES ('market_generation', '1') ON CONFLICT (key) DO UPDATE SET"
               " value = CAST(CAST(meta.value AS BIGINT) + 1 AS TEXT)").status();
    });
  }

  Status exclusive(const std::function<Status()>& body) override { return tx(true, body); }

  StoreWrites writes() const override { return {write_transactions_.load(), rows_written_.load()}; }

 private:
  static constexpr const char* kHoldingColumns = "SELECT node_id, layer, expert_first, expert_count, sha256 FROM holdings";
  // Without its FROM, so a query may add a column after them.
  static constexpr const char* kNodeColumns =
      "SELECT node_id, name, token_sha256, revoked, registered_ms, address, model_identity, protocol_version,"
      " kernel_abi, fingerprint_ok, last_heartbeat_ms, capacity_bytes, node_load, status, reason, role";

  std::optional<HoldingRow> holding_from(const std::vector<SqlValue>& r) {
    const auto layer = to_i64(r[1]), first = to_i64(r[2]), count = to_i64(r[3]);
    if (!r[0] || !node_id_valid(*r[0]) || !layer || !first || !count || !r[4] || !is_hex(*r[4], 64) ||
        !range_valid(*layer, *first, *count)) {
      return bad(), std::nullopt;
    }
    return HoldingRow{*r[0], *layer, *first, *count, *r[4]};
  }
  std::vector<HoldingRow> valid_holdings(const SqlRows& rows) {
    std::vector<HoldingRow> out;
    for (const auto& r : rows) {
      if (std::optional<HoldingRow> h = holding_from(r)) out.push_back(std::move(*h));
    }
    return out;
  }
  // Whether the stored rows are exactly `holdings` (an unreadable row or a repeated range: no, rewrite).
  bool same_holdings(const SqlRows& stored, const std::vector<HoldingRow>& holdings) {
    if (stored.size() != holdings.size()) return false;
    std::vector<HoldingKey> a, b;
    for (const auto& r : stored) {
      std::optional<HoldingRow> h = holding_from(r);
      if (!h) return false;
      a.emplace_back(h->layer, h->expert_first, h->expert_count, h->sha256);
    }
    for (const HoldingRow& h : holdings) b.emplace_back(h.layer, h.expert_first, h.expert_count, h.sha256);
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    for (size_t i = 1; i < b.size(); ++i) {
      if (std::get<0>(b[i]) == std::get<0>(b[i - 1]) && std::get<1>(b[i]) == std::get<1>(b[i - 1])) return false;
    }
    return a == b;
  }
  Status replace_holdings(const std::string& node_id, const std::vector<HoldingRow>& holdings) {
    ESSAIM_RETURN_IF_ERROR(q("DELETE FROM holdings WHERE node_id = $1", {node_id}).status());
    for (const HoldingRow& h : holdings) {
      ESSAIM_RETURN_IF_ERROR(
          q("INSERT INTO holdings (node_id, layer, expert_first, expert_count, sha256) VALUES ($1, $2, $3, $4, $5)"
            " ON CONFLICT (node_id, layer, expert_first) DO UPDATE SET expert_count = excluded.expert_count,"
            " sha256 = excluded.sha256",
            {node_id, s(h.layer), s(h.expert_first), s(h.expert_count), h.sha256}).status());
    }
    return Status::ok();
  }

  std::optional<NodeRow> node_from(const std::vector<SqlValue>& r) {
    if (r.size() != 16) return bad(), std::nullopt;
    for (const SqlValue& v : r) {
      if (!v) return bad(), std::nullopt;
    }
    NodeRow n;
    n.node_id = *r[0];
    n.name = *r[1];
    n.token_sha256 = *r[2];
    const auto revoked = to_i64(r[3]), reg = to_i64(r[4]), proto = to_i64(r[7]), fok = to_i64(r[9]),
               hb = to_i64(r[10]), cap = to_i64(r[11]);
    const auto load = to_f64(r[12]);
    n.address = *r[5];
    n.model_identity = *r[6];
    n.kernel_abi = *r[8];
    n.status = *r[13];
    n.reason = *r[14];
    n.role = *r[15];
    if (!node_id_valid(n.node_id) || !name_valid(n.name) || !is_hex(n.token_sha256, 64) || !revoked || !reg ||
        !proto || !fok || !hb || !cap || !load || (n.status != "active" && n.status != "dropped") ||
        n.address.size() > kMaxAddressBytes || n.model_identity.size() > 64 || n.kernel_abi.size() > 64 ||
        n.reason.size() > kMaxReasonBytes || !role_valid(n.role)) {
      return bad(), std::nullopt;
    }
    n.revoked = *revoked != 0;
    n.registered_ms = *reg;
    n.protocol_version = *proto;
    n.fingerprint_ok = *fok != 0;
    n.last_heartbeat_ms = *hb;
    n.capacity_bytes = *cap;
    n.load = *load;
    return n;
  }
  void bad() {
    if (++invalid_rows_ <= 5) std::fprintf(stderr, "essaim coordinator: skipped an invalid row read from the %s store\n",
                                            kind().c_str());
  }

  // In this thread's transaction when it has one, else on a connection of its own for the statement.
  Result<SqlRows> q(const std::string& sql, const std::vector<SqlValue>& params = {}) {
    if (SqlConnection* c = pool_.bound()) return c->query(sql, params);
    ConnectionPool::Borrowed b{pool_, pool_.take(false)};
    return b.c->query(sql, params);
  }

  // One transaction per public call; calls made inside exclusive() (or any transaction) join it.
  Status tx(bool exclusive, const std::function<Status()>& body) {
    if (pool_.bound()) return body();
    ConnectionPool::Borrowed b{pool_, pool_.take(true)};
    SqlConnection& c = *b.c;
    ESSAIM_RETURN_IF_ERROR(c.begin(exclusive));
    const uint64_t rows_before = c.rows_changed();
    Status st = body();
    if (!st) {
      c.rollback();
      return st;
    }
    Status committed = c.commit();
    if (!committed) {
      c.rollback();
      return committed;
    }
    if (const uint64_t rows = c.rows_changed() - rows_before; rows > 0) {
      ++write_transactions_;
      rows_written_ += rows;
    }
    return committed;
  }

  ConnectionPool pool_;
  std::atomic<uint64_t> write_transactions_{0}, rows_written_{0};
};

}  // namespace

Result<std::unique_ptr<Store>> open_store(const std::string& spec, int connections) {
  std::vector<std::unique_ptr<SqlConnection>> c;
  if (spec.rfind("postgresql://", 0) == 0 || spec.rfind("postgres://", 0) == 0) {
    for (int i = 0; i < std::max(1, connections); ++i) {
      ESSAIM_ASSIGN_OR_RETURN(std::unique_ptr<SqlConnection> one, open_pg_connection(spec));
      c.push_back(std::move(one));
    }
  } else {
    if (spec.empty()) return Status::error("--db is empty: give a SQLite file path or a postgresql:// URL");
    ESSAIM_ASSIGN_OR_RETURN(std::unique_ptr<SqlConnection> one, open_sqlite_connection(spec));
    c.push_back(std::move(one));
  }
  auto store = std::make_unique<SqlStore>(std::move(c));
  ESSAIM_RETURN_IF_ERROR(store->init());
  return std::unique_ptr<Store>(std::move(store));
}

}  // namespace essaim::coord
