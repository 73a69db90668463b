#include "child_process.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

extern char** environ;

namespace essaim::test_support {
namespace {

// The parent's environment with `dir` first on PATH.
std::vector<std::string> environment_with_path_first(const std::string& dir) {
  std::vector<std::string> env;
  bool has_path = false;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string v = *e;
    if (v.rfind("PATH=", 0) == 0) {
      v = "PATH=" + dir + ":" + v.substr(5);
      has_path = true;
    }
    env.push_back(std::move(v));
  }
  if (!has_path) env.push_back("PATH=" + dir + ":/usr/bin:/bin");
  return env;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> p;
  for (std::string& s : strings) p.push_back(s.data());
  p.push_back(nullptr);
  return p;
}

}  // namespace

std::vector<std::string> ChildProcess::shell(const std::string& command) { return {"/bin/sh", "-c", "exec " + command}; }

void ChildProcess::spawn(std::vector<std::string> args, ChildOptions options) {
  ASSERT_FALSE(args.empty());
  stderr_path_ = options.stderr_path;
  std::vector<std::string> env;
  if (!options.path_first.empty()) env = environment_with_path_first(options.path_first);
  std::vector<char*> argv = pointers(args);
  std::vector<char*> envp = pointers(env);
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  if (!stderr_path_.empty())
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, stderr_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (!options.cwd.empty()) posix_spawn_file_actions_addchdir_np(&actions, options.cwd.c_str());
  // posix_spawnp looks args[0] up on the PATH of the caller; the child gets `env` when one was made.
  const int rc = posix_spawnp(&pid_, args[0].c_str(), &actions, nullptr, argv.data(),
                              env.empty() ? environ : envp.data());
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    pid_ = -1;
    FAIL() << "cannot start " << args[0] << ": " << std::strerror(rc);
  }
  out_fd_ = fds[0];
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0 && stop(SIGTERM, std::chrono::seconds(10)) < 0) kill_hard();
  if (out_fd_ >= 0) ::close(out_fd_);
}

std::string ChildProcess::read_line(std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  std::string line;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
    pollfd p{.fd = out_fd_, .events = POLLIN, .revents = 0};
    if (out_fd_ < 0 || left.count() <= 0 || ::poll(&p, 1, int(left.count())) <= 0) return "";
    char c;
    if (::read(out_fd_, &c, 1) != 1) return "";
    if (c == '\n') return line;
    line += c;
  }
}

uint16_t ChildProcess::await_listening(std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    const std::string line = read_line(
        std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now()));
    const size_t colon = line.rfind(':');
    if (line.rfind("listening on ", 0) == 0 && colon != std::string::npos)
      return uint16_t(std::atoi(line.c_str() + colon + 1));
    if (line.empty() && ::waitpid(pid_, nullptr, WNOHANG) != 0) return 0;  // it ended, or EOF
  }
  return 0;
}

int ChildProcess::stop(int sig, std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return -1;
  if (sig != 0) ::kill(pid_, sig);
  const auto end = std::chrono::steady_clock::now() + timeout;
  do {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  } while (std::chrono::steady_clock::now() < end);
  return -1;
}

void ChildProcess::kill_hard() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

std::string ChildProcess::stderr_text() const {
  if (stderr_path_.empty()) return "";
  std::ifstream f(stderr_path_);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

void ListeningProcess::start(std::vector<std::string> args, std::chrono::seconds wait, ChildOptions options) {
  const std::string name = args.empty() ? "" : args[0];
  spawn(std::move(args), std::move(options));
  if (pid() <= 0) return;
  port_ = await_listening(wait);
  ASSERT_NE(port_, 0) << name << " never said \"listening on HOST:PORT\"" << (stderr_text().empty() ? "" : "; stderr:\n")
                      << stderr_text();
}

}  // namespace essaim::test_support
