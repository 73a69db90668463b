// SqlConnection over SQLite3: every committed transaction is on disk before commit() returns
// (journal_mode=WAL, synchronous=FULL), so a coordinator killed with SIGKILL loses no committed row.
#include <sqlite3.h>

#include "coord/sql_connection.h"

namespace essaim::coord {
namespace {

class SqliteConnection final : public SqlConnection {
 public:
  explicit SqliteConnection(sqlite3* db) : db_(db) {}
  ~SqliteConnection() override { sqlite3_close_v2(db_); }
  std::string kind() const override { return "sqlite"; }

  Result<SqlRows> query(const std::string& sql, const std::vector<SqlValue>& params) override {
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db_, sql.c_str(), int(sql.size()), &st, nullptr) != SQLITE_OK) return error("prepare");
    struct Finalize {
      sqlite3_stmt* s;
      ~Finalize() { sqlite3_finalize(s); }
    } finalize{st};
    for (size_t i = 0; i < params.size(); ++i) {
      const std::string name = "$" + std::to_string(i + 1);
      const int idx = sqlite3_bind_parameter_index(st, name.c_str());
      if (idx == 0) continue;  // a parameter the statement does not use
      const int rc = params[i] ? sqlite3_bind_text(st, idx, params[i]->data(), int(params[i]->size()), SQLITE_TRANSIENT)
                               : sqlite3_bind_null(st, idx);
      if (rc != SQLITE_OK) return error("bind");
    }
    SqlRows rows;
    for (;;) {
      const int rc = sqlite3_step(st);
      if (rc == SQLITE_DONE) break;
      if (rc != SQLITE_ROW) return error("step");
      std::vector<SqlValue> row;
      const int n = sqlite3_column_count(st);
      for (int c = 0; c < n; ++c) {
        if (sqlite3_column_type(st, c) == SQLITE_NULL) {
          row.emplace_back(std::nullopt);
          continue;
        }
        const auto* text = reinterpret_cast<const char*>(sqlite3_column_text(st, c));
        row.emplace_back(std::string(text ? text : "", size_t(sqlite3_column_bytes(st, c))));
      }
      rows.push_back(std::move(row));
    }
    return rows;
  }
  // Every store transaction writes, so each takes the write lock up front: a deferred transaction that
  // reads and then writes can fail to upgrade (SQLITE_BUSY, no retry) while another process writes. The
  // one lock SQLite has is exclusive already.
  Status begin(bool /*exclusive*/) override { return query("BEGIN IMMEDIATE", {}).status(); }
  Status commit() override { return query("COMMIT", {}).status(); }
  void rollback() override { sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr); }
  uint64_t rows_changed() const override { return uint64_t(sqlite3_total_changes64(db_)); }

 private:
  Status error(const char* what) { return Status::error(std::string("sqlite ") + what + ": " + sqlite3_errmsg(db_)); }
  sqlite3* db_;
};

}  // namespace

Result<std::unique_ptr<SqlConnection>> open_sqlite_connection(const std::string& path) {
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                                 nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close_v2(db);
    return Status::error("cannot open the SQLite database '" + path + "': " + msg);
  }
  auto c = std::make_unique<SqliteConnection>(db);
  sqlite3_busy_timeout(db, 10'000);  // another coordinator process holding the write lock: wait, then fail
  for (const char* pragma : {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL", "PRAGMA foreign_keys=ON"}) {
    Result<SqlRows> r = c->query(pragma, {});
    if (!r) return r.status().with_context("database '" + path + "'");
  }
  return std::unique_ptr<SqlConnection>(std::move(c));
}

}  // namespace essaim::coord
