// The one helper tests use to run an essaim binary as a child process: stdout on a pipe read line by line,
// stderr inherited or kept in a file (shown when a test fails), stopped by a signal with its exit status, and
// killed (SIGTERM, then SIGKILL after 10 s) when it goes out of scope.
//
//   ChildProcess c({"/path/to/essaim-worker", "--slices", dir}, {.stderr_path = dir + "/w.err"});
//   c.read_line(30s);  c.stop(SIGTERM, 10s);  c.stderr_text();
//
// ListeningProcess: a child that prints "listening on HOST:PORT" on stdout once it accepts connections (`essaim
// worker`, `essaim-worker`, `essaim serve`, `essaim coordinator`, `essaim relay`); the constructor waits for
// that line (bounded) and fails the test, with the child's stderr, when it does not come.
//
//   ListeningProcess p({"/path/to/essaim", "coordinator", ..., "--listen", "127.0.0.1:0"}, 120s);
//   ASSERT_TRUE(p.ok());   request(p.port(), ...);   p.kill_hard();
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace essaim::test_support {

struct ChildOptions {
  std::string stderr_path;  // empty: the test's own stderr
  std::string cwd;          // empty: the test's
  std::string path_first;   // a directory put first on the child's PATH (empty: PATH as it is)
};

class ChildProcess {
 public:
  // args[0] is looked up on PATH unless it holds a '/'. A failure to start is a test failure (pid() <= 0).
  explicit ChildProcess(std::vector<std::string> args, ChildOptions options = {}) { spawn(std::move(args), std::move(options)); }
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // {"/bin/sh", "-c", "exec COMMAND"}: a command line as a user writes it; exec, so signals reach the binary.
  static std::vector<std::string> shell(const std::string& command);

  std::string read_line(std::chrono::milliseconds timeout);  // the next line of stdout; "" at EOF or timeout
  // Reads stdout until a "listening on HOST:PORT" line: the port, 0 when none came within `timeout`.
  uint16_t await_listening(std::chrono::milliseconds timeout);
  // Sends `sig` (0: none) and waits: the exit status (128 + N when killed by signal N), -1 after `timeout`.
  int stop(int sig, std::chrono::milliseconds timeout);
  void kill_hard();  // SIGKILL and reap
  pid_t pid() const { return pid_; }
  std::string stderr_text() const;  // what it wrote to stderr so far ("" when inherited)

 protected:
  ChildProcess() = default;
  void spawn(std::vector<std::string> args, ChildOptions options);  // gtest ASSERTs need void

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;  // kept open until the end: a later write to stdout must not meet a closed pipe
  std::string stderr_path_;
};

class ListeningProcess : public ChildProcess {
 public:
  explicit ListeningProcess(std::vector<std::string> args, std::chrono::seconds wait = std::chrono::seconds(60),
                            ChildOptions options = {}) {
    start(std::move(args), wait, std::move(options));
  }

  uint16_t port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  bool ok() const { return port_ != 0; }

 protected:
  ListeningProcess() = default;
  void start(std::vector<std::string> args, std::chrono::seconds wait = std::chrono::seconds(60),
             ChildOptions options = {});

 private:
  uint16_t port_ = 0;
};

}  // namespace essaim::test_support
