#include "cli_test_util.h"
#include "temp_dir.h"

#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace essaim::cli_test {
namespace {

using Clock = std::chrono::steady_clock;

void exec_shell(const std::string& command, const std::string& cwd) {
  if (!cwd.empty() && ::chdir(cwd.c_str()) != 0) _exit(126);
  const std::string path = bin_dir() + ":" + (std::getenv("PATH") ? std::getenv("PATH") : "/usr/bin:/bin");
  ::setenv("PATH", path.c_str(), 1);
  ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
  _exit(127);
}

// Waits for pid until the deadline (then SIGKILL); the exit status, -1 when it did not exit by itself.
int wait_for(pid_t pid, Clock::time_point deadline) {
  int status = 0;
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (r < 0) return -1;
    if (Clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// Reads fd until EOF or the deadline.
std::string drain(int fd, Clock::time_point deadline) {
  std::string out;
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) break;
    pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
    if (::poll(&p, 1, int(std::min<long long>(left, 1000))) <= 0) continue;
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;  // EOF (or EIO: the pty's other side closed)
    out.append(buf, size_t(n));
  }
  return out;
}

// Everything a test process writes lives under tmp/run-XXXXXX (mkdtemp): ctest runs the tests of this binary
// as parallel processes, which must not share (or empty) each other's folders. Removed when the process exits.
struct ProcessDir {
  std::filesystem::path path =
      essaim::testing::make_temp_dir_in(std::filesystem::path(ESSAIM_BINARY_DIR) / "tests" / "cli" / "tmp", "run");
  ~ProcessDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

const std::filesystem::path& process_dir() {
  static ProcessDir dir;
  return dir.path;
}

// A scratch folder shared by every call of this process (never emptied while it runs).
std::string scratch_dir(const std::string& name) {
  const std::filesystem::path dir = process_dir() / name;
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace

std::string bin_dir() { return std::string(ESSAIM_BINARY_DIR) + "/src/cli"; }

std::string absolute(const std::string& command) {
  for (const char* name : {"essaim-worker ", "essaim "})
    if (command.rfind(name, 0) == 0) return bin_dir() + "/" + command;
  return command;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

size_t count_of(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos; at = haystack.find(needle, at + needle.size())) ++n;
  return n;
}

std::string make_temp_dir(const std::string& name) {
  const std::filesystem::path dir = process_dir() / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

CliRun run_cli(const std::string& command, const std::string& cwd, int timeout_s) {
  static int serial = 0;
  const std::string base = scratch_dir("run") + "/" + std::to_string(serial++);
  const std::string out_path = base + ".out", err_path = base + ".err";
  CliRun r;
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int o = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (o < 0 || e < 0) _exit(125);
    ::dup2(o, 1);
    ::dup2(e, 2);
    exec_shell(command, cwd);
  }
  if (pid < 0) return r;
  r.code = wait_for(pid, Clock::now() + std::chrono::seconds(timeout_s));
  r.out = read_text(out_path);
  r.err = read_text(err_path);
  return r;
}

CliRun run_in_pty(const std::string& command, const std::string& cwd, int timeout_s) {
  CliRun r;
  int master = -1;
  const pid_t pid = ::forkpty(&master, nullptr, nullptr, nullptr);
  if (pid == 0) exec_shell(command, cwd);
  if (pid < 0) return r;
  const auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
  r.out = drain(master, deadline);
  ::close(master);
  r.code = wait_for(pid, deadline);
  return r;
}

BackgroundProcess::BackgroundProcess(const std::string& command, const std::string& cwd) {
  static int serial = 0;
  start(shell(command), std::chrono::seconds(30),
        {.stderr_path = scratch_dir("bg") + "/" + std::to_string(serial++) + ".err", .cwd = cwd, .path_first = bin_dir()});
}

std::pair<int, std::string> health(uint16_t port) {
  const CliRun r = run_cli("curl -s -m 10 -w '\\n%{http_code}' http://127.0.0.1:" + std::to_string(port) + "/health");
  const size_t nl = r.out.find_last_of('\n');
  if (nl == std::string::npos) return {0, r.out};
  return {std::atoi(r.out.c_str() + nl + 1), r.out.substr(0, nl)};
}

bool wait_for_health(uint16_t port, int status, std::chrono::seconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (health(port).first == status) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

}  // namespace essaim::cli_test
