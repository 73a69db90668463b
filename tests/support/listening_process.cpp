#include "listening_process.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <thread>

extern char** environ;

namespace essaim::test_support {

void ListeningProcess::start(std::vector<std::string> args, std::chrono::seconds wait) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  const int rc = posix_spawnp(&pid_, args[0].c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    pid_ = -1;
    FAIL() << "cannot start " << args[0] << ": " << std::strerror(rc);
  }
  std::string line;
  const auto give_up = std::chrono::steady_clock::now() + wait;
  while (line.find('\n') == std::string::npos && std::chrono::steady_clock::now() < give_up) {
    pollfd p{.fd = fds[0], .events = POLLIN, .revents = 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    char buf[256];
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n <= 0) break;
    line.append(buf, size_t(n));
  }
  ::close(fds[0]);  // nothing else is printed on stdout
  const size_t colon = line.rfind(':');
  ASSERT_TRUE(line.rfind("listening on ", 0) == 0 && colon != std::string::npos) << args[0] << " said: " << line;
  port_ = uint16_t(std::stoul(line.substr(colon + 1)));
}

ListeningProcess::~ListeningProcess() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  for (int i = 0; i < 100; ++i) {
    if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill_hard();
}

void ListeningProcess::kill_hard() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

}  // namespace essaim::test_support
