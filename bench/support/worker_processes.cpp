#include "worker_processes.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "slice/gguf_slice.h"
#include "slice/model_identity.h"

extern char** environ;

namespace essaim::bench {

Result<std::vector<std::vector<std::string>>> ensure_slices(const Model& m, const std::string& model_path, int n,
                                                            const std::string& data_dir) {
  ESSAIM_ASSIGN_OR_RETURN(MoeLayout moe, moe_layout(m.file()));
  const std::string dir = data_dir + "/" + std::filesystem::path(model_path).filename().string() + ".slices-" +
                          std::to_string(n) + "-" + digest_hex(moe.source_model).substr(0, 12);
  std::filesystem::create_directories(dir);
  std::vector<std::vector<std::string>> out(static_cast<size_t>(n));
  for (const MoeLayer& l : moe.layers)
    for (int w = 0; w < n; ++w) {
      const uint32_t first = moe.expert_count * uint32_t(w) / uint32_t(n);
      const uint32_t end = moe.expert_count * uint32_t(w + 1) / uint32_t(n);
      const std::string path = dir + "/L" + std::to_string(l.layer) + ".E" + std::to_string(first) + ".gguf";
      out[size_t(w)].push_back(path);
      // Reused only when newer than the model (the identity covers the layout, not the weights).
      if (std::filesystem::exists(path) &&
          std::filesystem::last_write_time(path) >= std::filesystem::last_write_time(model_path))
        continue;
      ESSAIM_ASSIGN_OR_RETURN(OutFile f, expert_slice_file(m.file(), moe, {.layer_first = l.layer, .layer_count = 1,
                                                                          .expert_first = first,
                                                                          .expert_count = end - first}));
      ESSAIM_ASSIGN_OR_RETURN(WrittenFile written, write_out_file(f, path + ".part", /*hash=*/false));
      (void)written;
      std::filesystem::rename(path + ".part", path);
    }
  return out;
}

Result<WorkerProcess> start_worker(const std::string& worker_bin, int threads, const std::vector<std::string>& slices) {
  std::vector<std::string> args = {worker_bin, "--listen", "127.0.0.1:0", "--quiet", "--threads",
                                   std::to_string(threads)};
  for (const std::string& s : slices) args.insert(args.end(), {"--slice", s});
  return start_listening(std::move(args));
}

Result<WorkerProcess> start_listening(std::vector<std::string> args) {
  const std::string bin = args.at(0);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return Status::error("pipe2 failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  WorkerProcess p;
  const int rc = posix_spawn(&p.pid, bin.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    return Status::error("cannot start " + bin);
  }
  std::string line;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (line.find('\n') == std::string::npos && std::chrono::steady_clock::now() < give_up) {
    pollfd pf{.fd = fds[0], .events = POLLIN, .revents = 0};
    if (::poll(&pf, 1, 200) <= 0) continue;
    char buf[256];
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n <= 0) break;
    line.append(buf, size_t(n));
  }
  ::close(fds[0]);
  const size_t colon = line.rfind(':');
  if (line.rfind("listening on ", 0) != 0 || colon == std::string::npos) {
    ::kill(p.pid, SIGKILL);
    ::waitpid(p.pid, nullptr, 0);
    return Status::error(bin + " did not start; it said: " + line);
  }
  p.port = uint16_t(std::stoul(line.substr(colon + 1)));
  p.address = "127.0.0.1:" + std::to_string(p.port);
  return p;
}

void stop_workers(const std::vector<WorkerProcess>& procs) {
  for (const WorkerProcess& p : procs) ::kill(p.pid, SIGTERM);
  for (const WorkerProcess& p : procs) ::waitpid(p.pid, nullptr, 0);
}

double self_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

double process_cpu_seconds(pid_t pid) {  // fields 14-15 of /proc/PID/stat, in clock ticks
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(text.substr(close + 2));
  std::string f;
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> f; ++i) {
    if (i == 14) utime = std::stod(f);
    if (i == 15) stime = std::stod(f);
  }
  return (utime + stime) / double(sysconf(_SC_CLK_TCK));
}

double workers_cpu_seconds(const std::vector<WorkerProcess>& procs) {
  double t = 0;
  for (const WorkerProcess& p : procs) t += process_cpu_seconds(p.pid);
  return t;
}

std::string default_cli_binary(const char* argv0, const std::string& name) {
  const std::filesystem::path self = std::filesystem::absolute(argv0).parent_path();
  const std::filesystem::path sibling = self.parent_path() / "src" / "cli" / name;
  return std::filesystem::exists(sibling) ? sibling.string() : std::string();
}

std::string default_worker_binary(const char* argv0) { return default_cli_binary(argv0, "essaim-worker"); }

Result<DelayedWorkers> behind_delay(const std::vector<WorkerProcess>& procs, int rtt_ms) {
  DelayedWorkers d;
  for (const WorkerProcess& p : procs) {
    std::string address = p.address;
    if (rtt_ms > 0) {
      auto proxy = DelayProxy::start("127.0.0.1", p.port, std::chrono::microseconds(rtt_ms * 500));
      if (!proxy) return Status::error("delay proxy: " + proxy.error().message);
      address = (*proxy)->address();
      d.proxies.push_back(std::move(*proxy));
    }
    d.map.workers.push_back({.address = address, .label = {}, .holdings = std::nullopt});
  }
  return d;
}

}  // namespace essaim::bench
