// An HTTP server under test as a real process on loopback (`essaim serve`, llama-server): started from a
// command line with its output in a log file, ready once GET /health answers 200, stopped with SIGTERM.
//
//   const uint16_t port = free_loopback_port();
//   ESSAIM_ASSIGN_OR_RETURN(ServerProcess s, start_server_process({"essaim", "serve", "-m", f, "--port",
//                                                                  std::to_string(port)}, port, "serve.log"));
//   ...                                                    // http://127.0.0.1:<s.port>
//   stop_server_process(s);
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace essaim::bench {

struct ServerProcess {
  pid_t pid = -1;
  uint16_t port = 0;
  std::string log_path;  // its stdout and stderr
};

// A port the OS had free a moment ago (bound to 127.0.0.1:0, then closed): for servers that take --port
// but print no "listening on" line.
uint16_t free_loopback_port();

// Starts argv (argv[0] a path) with stdout and stderr appended to log_path, then polls GET /health on
// 127.0.0.1:port until it answers 200. An error names the log's last lines when the process exits or is not
// ready within `ready_within`.
// `env`: NAME=VALUE entries added to (or replacing those of) this process's environment.
Result<ServerProcess> start_server_process(const std::vector<std::string>& argv, uint16_t port,
                                           const std::string& log_path, const std::vector<std::string>& env = {},
                                           std::chrono::seconds ready_within = std::chrono::seconds(300));
// SIGTERM, then SIGKILL after 20 s; waits for it. Idempotent.
void stop_server_process(ServerProcess& p);

}  // namespace essaim::bench
