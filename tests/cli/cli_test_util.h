// Running the essaim binaries as a user does, for the CLI tests: a command with its exit code, stdout and
// stderr kept apart; a background process (a worker) whose "listening on HOST:PORT" line is awaited with a
// deadline (tests/support/child_process.h); a command under a pseudo-terminal (forkpty), to see what a terminal sees.
//
//   CliRun r = run_cli("essaim version --json");          // "essaim" = <build>/src/cli/essaim
//   BackgroundProcess w("essaim worker --slices s/ --experts 0-2 --port 0");
//   w.port();                                             // 0 when it never said where it listens
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>

#include "child_process.h"

namespace essaim::cli_test {

std::string bin_dir();  // <build>/src/cli
// The command with a leading "essaim" / "essaim-worker" word made absolute; the rest is left to /bin/sh.
std::string absolute(const std::string& command);

struct CliRun {
  int code = -1;    // exit status; -1 when killed by a signal
  std::string out;  // stdout
  std::string err;  // stderr
};

// /bin/sh -c COMMAND in `cwd` (empty = the test's), with the build's bin dir first on PATH, so a command
// written for a user ("essaim run ...") runs as written.
CliRun run_cli(const std::string& command, const std::string& cwd = "", int timeout_s = 120);
// The same under a pseudo-terminal: everything the terminal shows (stdout and stderr together).
CliRun run_in_pty(const std::string& command, const std::string& cwd = "", int timeout_s = 120);

// A command line started as a user types it (through /bin/sh, the build's bin dir first on PATH, in `cwd`),
// awaited until it says "listening on HOST:PORT" (30 s); stderr kept for the failure message.
class BackgroundProcess : public test_support::ListeningProcess {
 public:
  explicit BackgroundProcess(const std::string& command, const std::string& cwd = "");
};

// GET /health of a server on 127.0.0.1:port through curl: its status (0 when none came) and body; and the wait
// until it says `status`, polled every 100 ms.
std::pair<int, std::string> health(uint16_t port);
bool wait_for_health(uint16_t port, int status, std::chrono::seconds timeout);

std::string make_temp_dir(const std::string& name);  // fresh, under <build>/tests/cli/tmp/run-XXXXXX/ (mkdtemp), removed at exit
std::string read_text(const std::string& path);
size_t count_of(const std::string& haystack, const std::string& needle);

}  // namespace essaim::cli_test
