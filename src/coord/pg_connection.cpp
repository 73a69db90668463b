// SqlConnection over libpq. Exclusive transactions take a transaction-scoped advisory lock (one fixed key),
// so coordinator processes sharing the database decide assignments one at a time; it is released by
// COMMIT or ROLLBACK, and by the server if the process dies.
#include <libpq-fe.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <string>
#include <unordered_map>

#include "coord/sql_connection.h"

namespace essaim::coord {
namespace {

constexpr const char* kAdvisoryLockKey = "7310255981";  // "essaim coordinator market" (any fixed number)

class PgConnection final : public SqlConnection {
 public:
  explicit PgConnection(PGconn* c) : c_(c) {}
  ~PgConnection() override { PQfinish(c_); }
  std::string kind() const override { return "postgresql"; }

  Result<SqlRows> query(const std::string& sql, const std::vector<SqlValue>& params) override {
    std::vector<const char*> values;
    values.reserve(params.size());
    for (const SqlValue& p : params) values.push_back(p ? p->c_str() : nullptr);
    const std::string* name = prepared(sql, int(values.size()));
    if (!name) return rows_of(PQexecParams(c_, sql.c_str(), int(values.size()), nullptr, values.data(), nullptr, nullptr, 0));
    return rows_of(PQexecPrepared(c_, name->c_str(), int(values.size()), values.data(), nullptr, nullptr, 0));
  }
  // Statements with no parameters, separated by ';': the last one's rows (the first failure stops them).
  Result<SqlRows> exec_script(const std::string& sql) { return rows_of(PQexec(c_, sql.c_str())); }
  // The rows of a result, which it frees.
  Result<SqlRows> rows_of(PGresult* r) {
    struct Clear {
      PGresult* r;
      ~Clear() { PQclear(r); }
    } clear{r};
    const ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
      return Status::error(std::string("postgresql: ") + (r ? PQresultErrorMessage(r) : PQerrorMessage(c_)));
    }
    count_changes(r);
    SqlRows rows;
    const int n = PQntuples(r), m = PQnfields(r);
    rows.reserve(size_t(n));
    for (int i = 0; i < n; ++i) {
      std::vector<SqlValue> row;
      for (int j = 0; j < m; ++j) {
        if (PQgetisnull(r, i, j)) row.emplace_back(std::nullopt);
        else row.emplace_back(std::string(PQgetvalue(r, i, j), size_t(PQgetlength(r, i, j))));
      }
      rows.push_back(std::move(row));
    }
    return rows;
  }
  Status begin(bool exclusive) override {
    if (!exclusive) return query("BEGIN", {}).status();
    // One round trip for both (PQexec takes several statements without parameters): on a busy machine a
    // round trip to the server costs more than the statement.
    Result<SqlRows> r = exec_script(std::string("BEGIN; SELECT pg_advisory_xact_lock(") + kAdvisoryLockKey + ")");
    if (!r) {
      rollback();
      return r.status();
    }
    return Status::ok();
  }
  Status commit() override { return query("COMMIT", {}).status(); }
  void rollback() override { PQclear(PQexec(c_, "ROLLBACK")); }
  uint64_t rows_changed() const override { return rows_changed_; }

 private:
  // The server-side statement for `sql`, prepared on its first use on this connection, or nullptr (not a
  // row statement, or refused: then it runs unprepared and reports its own error). The store's statements
  // are a small fixed set, so the map stays small; parsing and planning were a third of the server's CPU
  // per request (docs/scale.md).
  const std::string* prepared(const std::string& sql, int n_params) {
    if (auto it = prepared_.find(sql); it != prepared_.end()) return &it->second;
    static constexpr const char* kRowStatements[] = {"SELECT", "INSERT", "UPDATE", "DELETE"};
    if (std::none_of(std::begin(kRowStatements), std::end(kRowStatements),
                     [&](const char* k) { return sql.rfind(k, 0) == 0; })) {
      return nullptr;
    }
    const std::string name = "essaim_" + std::to_string(prepared_.size());
    PGresult* r = PQprepare(c_, name.c_str(), sql.c_str(), n_params, nullptr);
    const bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    PQclear(r);
    if (!ok) return nullptr;
    return &prepared_.emplace(sql, name).first->second;
  }
  // A command's tag ("INSERT 0 3", "UPDATE 1", "DELETE 2") carries the rows it changed.
  void count_changes(PGresult* r) {
    const std::string tag = PQcmdStatus(r);
    if (tag.rfind("INSERT", 0) != 0 && tag.rfind("UPDATE", 0) != 0 && tag.rfind("DELETE", 0) != 0) return;
    rows_changed_ += std::strtoull(PQcmdTuples(r), nullptr, 10);
  }
  PGconn* c_;
  uint64_t rows_changed_ = 0;
  std::unordered_map<std::string, std::string> prepared_;  // SQL text -> prepared statement name
};

}  // namespace

Result<std::unique_ptr<SqlConnection>> open_pg_connection(const std::string& url) {
  PGconn* c = PQconnectdb(url.c_str());
  if (!c || PQstatus(c) != CONNECTION_OK) {
    std::string msg = c ? PQerrorMessage(c) : "out of memory";
    PQfinish(c);
    while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
    return Status::error("cannot connect to PostgreSQL: " + msg);
  }
  PQclear(PQexec(c, "SET client_min_messages TO WARNING"));  // no NOTICE lines for CREATE ... IF NOT EXISTS
  return std::unique_ptr<SqlConnection>(std::make_unique<PgConnection>(c));
}

}  // namespace essaim::coord
