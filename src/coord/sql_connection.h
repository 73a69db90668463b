// The little SQL both store backends share: parameterised statements ($1, $2, ... — PostgreSQL's syntax,
// which SQLite reads as named parameters) returning rows of text values, and transactions. The SQL text
// itself is common to both (store.cpp); only the connection and the exclusive lock differ.
//
//   ESSAIM_ASSIGN_OR_RETURN(auto c, open_sqlite_connection("coord.sqlite"));
//   ESSAIM_ASSIGN_OR_RETURN(SqlRows rows, c->query("SELECT name FROM nodes WHERE node_id = $1", {id}));
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace essaim::coord {

using SqlValue = std::optional<std::string>;  // nullopt = NULL
using SqlRows = std::vector<std::vector<SqlValue>>;

class SqlConnection {
 public:
  virtual ~SqlConnection() = default;
  virtual std::string kind() const = 0;
  virtual Result<SqlRows> query(const std::string& sql, const std::vector<SqlValue>& params = {}) = 0;
  // exclusive: no other connection to the database runs an exclusive transaction meanwhile.
  virtual Status begin(bool exclusive) = 0;
  virtual Status commit() = 0;
  virtual void rollback() = 0;
  // Rows inserted, updated or deleted through this connection so far (rolled-back ones included).
  virtual uint64_t rows_changed() const = 0;
};

// WAL, synchronous=FULL, a busy timeout so several processes may share the file.
Result<std::unique_ptr<SqlConnection>> open_sqlite_connection(const std::string& path);
// A libpq connection string or URL (postgresql://user@host:port/db, host may be a socket directory).
Result<std::unique_ptr<SqlConnection>> open_pg_connection(const std::string& url);

}  // namespace essaim::coord
