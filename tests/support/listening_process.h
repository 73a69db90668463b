// A child process that prints "listening on HOST:PORT" on stdout once it accepts connections (`essaim
// worker`, `essaim-worker`, `essaim serve`, `essaim coordinator`, `essaim relay`): the constructor starts it
// and waits for that line; the destructor stops it. Shared by the multi-process tests of every layer.
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

class ListeningProcess {
 public:
  // args[0] is looked up on PATH unless it holds a '/'; `wait` bounds the wait for the line.
  explicit ListeningProcess(std::vector<std::string> args, std::chrono::seconds wait = std::chrono::seconds(60)) {
    start(std::move(args), wait);
  }
  ~ListeningProcess();  // SIGTERM if still running, then waits for it (SIGKILL after 5 s)
  ListeningProcess(const ListeningProcess&) = delete;
  ListeningProcess& operator=(const ListeningProcess&) = delete;

  uint16_t port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  pid_t pid() const { return pid_; }
  void kill_hard();  // SIGKILL and reap
  bool ok() const { return port_ != 0; }

 protected:
  ListeningProcess() = default;
  void start(std::vector<std::string> args, std::chrono::seconds wait = std::chrono::seconds(60));  // gtest ASSERTs need void

 private:
  pid_t pid_ = -1;
  uint16_t port_ = 0;
};

}  // namespace essaim::test_support
