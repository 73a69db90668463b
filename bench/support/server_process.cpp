#include "server_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <thread>

#include "net/http_client.h"

extern char** environ;

namespace essaim::bench {
namespace {

std::string log_tail(const std::string& path, size_t max_bytes = 2000) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  const std::string text = s.str();
  return text.size() > max_bytes ? text.substr(text.size() - max_bytes) : text;
}

bool exited(pid_t pid) {
  int status = 0;
  return ::waitpid(pid, &status, WNOHANG) == pid;
}

}  // namespace

uint16_t free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  uint16_t port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

namespace {

// This process's environment with `extra` added, an entry of the same name replaced.
std::vector<std::string> environment_with(const std::vector<std::string>& extra) {
  std::vector<std::string> out;
  const auto name_of = [](const std::string& e) { return e.substr(0, e.find('=')); };
  for (char** e = environ; *e; ++e) {
    const std::string entry = *e;
    if (std::none_of(extra.begin(), extra.end(), [&](const std::string& x) { return name_of(x) == name_of(entry); }))
      out.push_back(entry);
  }
  out.insert(out.end(), extra.begin(), extra.end());
  return out;
}

std::vector<char*> c_strings(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (std::string& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

}  // namespace

Result<ServerProcess> start_server_process(const std::vector<std::string>& argv, uint16_t port,
                                           const std::string& log_path, const std::vector<std::string>& env,
                                           std::chrono::seconds ready_within) {
  if (argv.empty()) return Status::error("no command line");
  std::vector<std::string> args = argv, envs = environment_with(env);
  std::vector<char*> cargs = c_strings(args), cenv = c_strings(envs);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  ServerProcess p{.pid = -1, .port = port, .log_path = log_path};
  const int rc = posix_spawn(&p.pid, args[0].c_str(), &actions, nullptr, cargs.data(), cenv.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return Status::error("cannot start " + args[0]);
  const net::HttpUrl url{.host = "127.0.0.1", .port = port, .base_path = {}};
  const auto give_up = std::chrono::steady_clock::now() + ready_within;
  while (std::chrono::steady_clock::now() < give_up) {
    if (exited(p.pid)) return Status::error(args[0] + " exited before it was ready; its log ends:\n" + log_tail(log_path));
    net::HttpCall health;
    health.target = "/health";
    health.deadline = std::chrono::milliseconds(2000);
    const Result<net::HttpAnswer> a = net::http_call(url, health);
    if (a && a->status == 200) return p;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  stop_server_process(p);
  return Status::error(args[0] + " was not ready within " + std::to_string(ready_within.count()) +
                       " s; its log ends:\n" + log_tail(log_path));
}

void stop_server_process(ServerProcess& p) {
  if (p.pid <= 0) return;
  ::kill(p.pid, SIGTERM);
  for (int i = 0; i < 200; ++i) {
    if (exited(p.pid)) {
      p.pid = -1;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ::kill(p.pid, SIGKILL);
  ::waitpid(p.pid, nullptr, 0);
  p.pid = -1;
}

}  // namespace essaim::bench
