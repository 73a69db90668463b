// A throw-away PostgreSQL server for tests: initdb in a temp dir, pg_ctl start on a free port with its unix
// socket in that dir, stopped and removed at the end. As root, the server runs as the `postgres` user
// (runuser), which owns the dir. No system service is touched. fresh_url() is a libpq URL for the store.
// bench/coord_load_bench starts its PostgreSQL with it too.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "net/tcp.h"

namespace essaim::coord::testing {

inline constexpr const char* kPgBin = "/usr/lib/postgresql/15/bin";

class PgCluster {
 public:
  PgCluster() {
    if (!std::filesystem::exists(std::string(kPgBin) + "/initdb")) {
      why_ = "PostgreSQL 15 is not installed (scripts/install-deps.sh)";
      return;
    }
    char tmpl[] = "/tmp/essaim-pg-XXXXXX";
    if (!mkdtemp(tmpl)) return;
    dir_ = tmpl;
    port_ = free_port();
    as_ = geteuid() == 0 ? "runuser -u postgres -- " : "";
    if (geteuid() == 0) sh("chown postgres " + dir_);
    sh("chmod 700 " + dir_);
    if (sh(as_ + kPgBin + "/initdb -D " + dir_ + "/data -U essaim --auth=trust -E UTF8 >" + dir_ + "/initdb.log 2>&1") != 0) {
      why_ = "initdb failed (" + dir_ + "/initdb.log)";
      return;
    }
    const std::string opts = "-p " + std::to_string(port_) + " -k " + dir_ + " -c listen_addresses='' -c fsync=on";
    if (sh(as_ + kPgBin + "/pg_ctl -D " + dir_ + "/data -o \"" + opts + "\" -l " + dir_ + "/pg.log -w -t 30 start >/dev/null 2>&1") != 0) {
      why_ = "pg_ctl start failed (" + dir_ + "/pg.log)";
      return;
    }
    started_ = true;
  }
  ~PgCluster() {
    if (started_) sh(as_ + kPgBin + "/pg_ctl -D " + dir_ + "/data -m immediate -w -t 30 stop >/dev/null 2>&1");
    if (!dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }
  bool ok() const { return started_; }
  const std::string& why() const { return why_; }
  std::string data_dir() const { return dir_ + "/data"; }  // postmaster.pid, the server's pid on its first line
  // A fresh database per call, so tests do not see each other's rows.
  std::string fresh_url() {
    const std::string db = "t" + std::to_string(++databases_);
    sh(std::string(kPgBin) + "/createdb -h " + dir_ + " -p " + std::to_string(port_) + " -U essaim " + db);
    return "postgresql://essaim@/" + db + "?host=" + dir_ + "&port=" + std::to_string(port_);
  }

 private:
  static int sh(const std::string& cmd) { return std::system(cmd.c_str()); }
  static uint16_t free_port() {
    auto l = net::TcpListener::listen("127.0.0.1", 0);
    return l ? (*l)->port() : 54329;
  }
  std::string dir_, as_, why_;
  uint16_t port_ = 0;
  bool started_ = false;
  int databases_ = 0;
};

}  // namespace essaim::coord::testing
