// Relay benchmark (docs/relay.md): per-token decode time and bytes per token through `essaim relay` (ws://
// on loopback) vs direct TCP, with N `essaim-worker` processes each way (each holding 1/N of every layer's
// experts); and the relay's forwarding throughput in MB/s with its CPU seconds per MB, against the same
// bytes over one direct loopback TCP connection. Prints one JSON document; timings are medians of per-token
// times over every timed repetition, the two variants alternating (order rotated per rep).
//
//   build/bench/relay_bench                                  # 2-layer q35-122b, 4 workers
//   build/bench/relay_bench --model tiny.gguf --decode 8 --reps 3 --forward-mib 256
//
// Both runs must produce the same tokens with no fallback, or the benchmark fails. On one machine the
// workers, the relay and the backbone share the cores, so the difference measured is the relay's copies,
// WebSocket framing and thread hand-offs, not network latency.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backbone/remote_executor.h"
#include "net/tcp.h"
#include "relay/relay_client.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "decode_steps.h"
#include "synth/synth.h"
#include "worker_processes.h"

namespace essaim {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string model;
  std::string data_dir = "bench-data";
  std::string worker_bin;
  uint32_t layers = 2;
  int workers = 4;
  int worker_threads = 1;
  int prompt = 8;
  int decode = 16;
  int reps = 3;
  int threads = 0;
  int timeout_ms = 30000;
  std::string relay_bin;
  int forward_mib = 256;
};

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "relay_bench: %s\n", what.c_str());
  std::exit(1);
}

std::string ensure_model(const Options& o) {
  if (!o.model.empty()) return o.model;
  Result<std::string> path = bench::ensure_q35_122b_model(o.data_dir, o.layers, "relay_bench");
  if (!path) die(path.status().message());
  return *path;
}

using bench::WorkerProcess;
using Process = WorkerProcess;
using bench::self_cpu_seconds;
using bench::workers_cpu_seconds;

using bench::DecodeRun;
using bench::load_average;
using bench::median;

DecodeRun decode(const Model& m, const std::vector<int32_t>& prompt, int n, ExpertExecutor& experts,
                 const backbone::RemoteExpertExecutor* remote, ThreadPool& pool, const std::vector<Process>& procs) {
  Result<DecodeRun> r = bench::decode_steps(m, prompt, n, experts, remote, pool, procs);
  if (!r) die(r.status().message());
  return std::move(*r);
}


extern "C" char** environ;

// Spawns args and waits for its "listening on ...:PORT" line; returns (pid, port).
std::pair<pid_t, uint16_t> spawn_listening(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) die("pipe2 failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, args[0].c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (rc != 0) die("cannot start " + args[0]);
  std::string line;
  const auto give_up = Clock::now() + std::chrono::seconds(120);
  while (line.find('\n') == std::string::npos && Clock::now() < give_up) {
    pollfd pf{.fd = fds[0], .events = POLLIN, .revents = 0};
    if (::poll(&pf, 1, 200) <= 0) continue;
    char buf[256];
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n <= 0) break;
    line.append(buf, size_t(n));
  }
  ::close(fds[0]);
  const size_t colon = line.rfind(':');
  if (line.rfind("listening on ", 0) != 0 || colon == std::string::npos) die(args[0] + " did not start: " + line);
  return {pid, uint16_t(std::stoul(line.substr(colon + 1)))};
}

// Sends `mib` MiB in 1 MiB messages from `out` to `in` (a reader thread); returns the seconds taken.
double transfer(net::ByteStream& out, net::ByteStream& in, int mib) {
  std::vector<uint8_t> chunk(1 << 20, 0x5a);
  const size_t total = size_t(mib) << 20;
  std::thread reader([&] {
    std::vector<uint8_t> buf(1 << 20);
    size_t got = 0;
    while (got < total) {
      net::NetResult<size_t> n = in.read_some(buf, net::deadline_in(std::chrono::seconds(30)));
      if (!n) die("transfer read: " + n.error().message);
      got += *n;
    }
  });
  const auto t0 = Clock::now();
  for (int i = 0; i < mib; ++i) {
    if (net::NetStatus w = out.write_all(chunk, net::deadline_in(std::chrono::seconds(30))); !w) die("transfer write: " + w.error().message);
  }
  reader.join();
  return since(t0);
}

int run(Options o) {
  if (o.worker_bin.empty()) die("--worker-bin is required when the default path does not exist");
  if (o.relay_bin.empty()) die("--relay-bin is required when the default path does not exist");
  const std::string path = ensure_model(o);
  Result<std::unique_ptr<Model>> loaded = load_model(path);
  if (!loaded) die(loaded.status().message());
  const Model& m = **loaded;
  Result<std::vector<std::vector<std::string>>> sliced = bench::ensure_slices(m, path, o.workers, o.data_dir);
  if (!sliced) die(sliced.status().message());
  const auto& slices = *sliced;
  {
    const auto bytes = m.file().mapping().bytes();
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < bytes.size(); i += 4096) sink = sink + bytes[i];
  }
  // The relay, with a token per worker, one for the backbone and one pair for the forwarding test.
  const std::string token_file = o.data_dir + "/relay-bench-tokens.txt";
  {
    std::filesystem::create_directories(o.data_dir);
    std::ofstream t(token_file);
    for (int i = 0; i < o.workers; ++i) t << "w" << i << " tok-w" << i << "\n";
    t << "backbone tok-backbone\nfwd tok-fwd\n";
  }
  const auto [relay_pid, relay_port] = spawn_listening({o.relay_bin, "relay", "--listen", "127.0.0.1:0", "--tokens", token_file, "-q"});
  const std::string relay_url = "ws://127.0.0.1:" + std::to_string(relay_port);

  std::vector<Process> tcp_procs, relay_procs;
  backbone::ExpertMap tcp_map, relay_map;
  for (size_t i = 0; i < slices.size(); ++i) {
    Result<WorkerProcess> w = bench::start_worker(o.worker_bin, o.worker_threads, slices[i]);
    if (!w) die(w.status().message());
    tcp_procs.push_back(*w);
    tcp_map.workers.push_back({.address = w->address, .label = {}, .holdings = std::nullopt});
    std::vector<std::string> args = {o.worker_bin, "--relay", relay_url, "--token", "tok-w" + std::to_string(i), "--quiet",
                                     "--threads", std::to_string(o.worker_threads)};
    for (const std::string& s : slices[i]) args.insert(args.end(), {"--slice", s});
    const auto [pid, port] = spawn_listening(args);
    relay_procs.push_back({.pid = pid, .port = port, .address = relay_url});
    relay_map.workers.push_back({.address = relay_url + "/node/w" + std::to_string(i), .label = {}, .holdings = std::nullopt});
  }
  std::vector<Process> relay_and_workers = relay_procs;
  relay_and_workers.push_back({.pid = relay_pid, .port = relay_port, .address = relay_url});

  ThreadPool pool(size_t(o.threads > 0 ? o.threads : 0));
  backbone::DispatchOptions dopt;
  dopt.timeout = std::chrono::milliseconds(o.timeout_ms);
  dopt.link.connect_timeout = std::chrono::seconds(60);
  dopt.relay_token = "tok-backbone";
  Result<std::unique_ptr<backbone::RemoteExpertExecutor>> direct = backbone::remote_executor_for_model(m, tcp_map, &pool, dopt);
  if (!direct) die(direct.status().message());
  Result<std::unique_ptr<backbone::RemoteExpertExecutor>> relayed = backbone::remote_executor_for_model(m, relay_map, &pool, dopt);
  if (!relayed) die(relayed.status().message());
  (*relayed)->wait_connected(net::deadline_in(std::chrono::seconds(60)));
  if ((*direct)->connected() != size_t(o.workers)) die("not every TCP worker connected: " + (*direct)->stats().to_json());
  if ((*relayed)->connected() != size_t(o.workers)) die("not every relayed worker connected: " + (*relayed)->stats().to_json());

  std::mt19937 rng(1);
  std::vector<int32_t> prompt(size_t(o.prompt));
  for (int32_t& t : prompt) t = int32_t(rng() % uint32_t(m.info().n_vocab));

  std::vector<double> tcp_s, relay_s, tcp_cpu, relay_cpu;
  std::vector<int32_t> want;
  uint64_t bytes[2] = {0, 0}, calls[2] = {0, 0};
  const double load_before = load_average();
  for (int r = 0; r < o.reps + 1; ++r) {
    for (int v = 0; v < 2; ++v) {
      const bool via_relay = (v + r) % 2 == 1;
      backbone::RemoteExpertExecutor& ex = via_relay ? **relayed : **direct;
      DecodeRun d = decode(m, prompt, o.decode, ex, &ex, pool, via_relay ? relay_and_workers : tcp_procs);
      if (!want.empty() && d.tokens != want) die("the two runs' tokens differ");
      want = d.tokens;
      if (ex.stats().fallbacks() > 0) die("fallbacks during the benchmark: " + ex.stats().to_json());
      if (r == 0) continue;
      (via_relay ? relay_s : tcp_s).insert((via_relay ? relay_s : tcp_s).end(), d.token_s.begin(), d.token_s.end());
      (via_relay ? relay_cpu : tcp_cpu).push_back((d.backbone_cpu_s + d.workers_cpu_s) / o.decode);
      bytes[via_relay] += d.after.bytes_sent() - d.before.bytes_sent() + d.after.bytes_received() - d.before.bytes_received();
      calls[via_relay] += d.after.layer_calls - d.before.layer_calls;
    }
  }
  const double tokens_timed = double(o.reps) * o.decode;

  // Forwarding throughput: one pair through the relay vs one direct loopback TCP connection.
  relay::RelayBuild build{};
  net::NetResult<net::WsUrl> url = net::parse_ws_url(relay_url + "/node/fwd");
  relay::RelayAcceptor fwd_worker({.relay = *url, .token = "tok-fwd", .build = build, .ws = {}, .idle_connections = 1});
  net::NetResult<std::unique_ptr<net::WsStream>> fwd_backbone = relay::relay_connect(
      *url, {.role = relay::RelayRole::BACKBONE, .token = "tok-fwd", .build = build, .node_id = "fwd"}, {}, net::deadline_in(std::chrono::seconds(10)));
  if (!fwd_backbone) die("forwarding pair: " + fwd_backbone.error().message);
  net::NetResult<std::unique_ptr<net::ByteStream>> fwd_in = fwd_worker.accept(net::deadline_in(std::chrono::seconds(10)));
  if (!fwd_in) die("forwarding pair: " + fwd_in.error().message);
  const double relay_cpu0 = bench::process_cpu_seconds(relay_pid);
  const double relay_secs = transfer(**fwd_backbone, **fwd_in, o.forward_mib);
  const double relay_cpu_used = bench::process_cpu_seconds(relay_pid) - relay_cpu0;
  auto listener = net::TcpListener::listen("127.0.0.1", 0);
  if (!listener) die("listen: " + listener.error().message);
  auto tcp_out = net::tcp_connect("127.0.0.1", (*listener)->port(), net::deadline_in(std::chrono::seconds(5)));
  auto tcp_in = (*listener)->accept(net::deadline_in(std::chrono::seconds(5)));
  if (!tcp_out || !tcp_in) die("direct TCP pair");
  const double tcp_secs = transfer(**tcp_out, **tcp_in, o.forward_mib);
  const double mb = double(o.forward_mib) * 1.048576;

  const double tcp_ms = 1e3 * median(tcp_s), relay_ms = 1e3 * median(relay_s);
  json doc;
  doc["benchmark"] = "relay";
  doc["model"] = path;
  doc["cpu"] = "see /proc/cpuinfo (AMD EPYC, AVX-512 VNNI on the project's machines)";
  doc["workers"] = o.workers;
  doc["worker_threads"] = o.worker_threads;
  doc["backbone_threads"] = pool.size();
  doc["decode_tokens_per_rep"] = o.decode;
  doc["reps"] = o.reps;
  doc["load_average"] = {load_before, load_average()};
  doc["tcp_ms_per_token"] = tcp_ms;
  doc["relay_ms_per_token"] = relay_ms;
  doc["relay_over_tcp_time_ratio"] = relay_ms / tcp_ms;
  doc["cpu_ms_per_token"] = {{"tcp_backbone_and_workers", 1e3 * median(tcp_cpu)}, {"relay_backbone_workers_and_relay", 1e3 * median(relay_cpu)}};
  doc["expert_protocol_bytes_per_token"] = {{"tcp", double(bytes[0]) / tokens_timed}, {"relay", double(bytes[1]) / tokens_timed}};
  doc["moe_layer_calls_per_token"] = double(calls[0]) / tokens_timed;
  doc["tokens_identical"] = true;
  doc["forwarding"] = {{"mib", o.forward_mib},
                       {"relay_mb_per_s", mb / relay_secs},
                       {"direct_tcp_mb_per_s", mb / tcp_secs},
                       {"relay_over_tcp_throughput_ratio", tcp_secs / relay_secs},
                       {"relay_cpu_s_per_mb", relay_cpu_used / mb}};
  std::printf("%s\n", doc.dump(2).c_str());
  std::fprintf(stderr, "relay_bench: %.2f ms/token via relay vs %.2f direct TCP (x%.3f); forwarding %.0f MB/s vs %.0f MB/s TCP, %.4f CPU s/MB\n",
               relay_ms, tcp_ms, relay_ms / tcp_ms, mb / relay_secs, mb / tcp_secs, relay_cpu_used / mb);
  (*direct).reset();
  (*relayed).reset();
  fwd_worker.close();
  bench::stop_workers(tcp_procs);
  bench::stop_workers(relay_and_workers);
  return 0;
}

}  // namespace
}  // namespace essaim

int main(int argc, char** argv) {
  essaim::Options o;
  o.worker_bin = essaim::bench::default_worker_binary(argv[0]);
  if (!o.worker_bin.empty()) {
    const std::string relay = o.worker_bin.substr(0, o.worker_bin.rfind('/') + 1) + "essaim";
    if (std::filesystem::exists(relay)) o.relay_bin = relay;
  }
  CLI::App app{"essaim relay benchmark: decode through the relay vs direct TCP, and forwarding throughput"};
  app.add_option("--model", o.model, "GGUF file (default: the 122B-shaped synth model, written once)");
  app.add_option("--data-dir", o.data_dir, "Where the synth model and its slices are written once (default ./bench-data)");
  app.add_option("--layers", o.layers, "Layers of the synth model (default 2)")->check(CLI::Range(1, 48));
  app.add_option("--workers", o.workers, "Worker processes per variant (default 4)")->check(CLI::Range(1, 64));
  app.add_option("--worker-threads", o.worker_threads, "Threads per worker (default 1)")->check(CLI::Range(1, 256));
  app.add_option("--worker-bin", o.worker_bin, "essaim-worker binary (default: <build>/src/cli/essaim-worker)");
  app.add_option("--relay-bin", o.relay_bin, "essaim binary for `essaim relay` (default: <build>/src/cli/essaim)");
  app.add_option("--prompt", o.prompt, "Prompt tokens (default 8)")->check(CLI::Range(1, 4096));
  app.add_option("--decode", o.decode, "Decoded tokens per repetition (default 16)")->check(CLI::Range(1, 4096));
  app.add_option("--reps", o.reps, "Timed repetitions (default 3; one more warms up)")->check(CLI::Range(1, 100));
  app.add_option("--threads", o.threads, "Backbone threads (default: all cores)");
  app.add_option("--timeout-ms", o.timeout_ms, "Worker deadline (default 30000: no fallback on a loaded machine)");
  app.add_option("--forward-mib", o.forward_mib, "MiB sent through the relay for the throughput figure (default 256)")->check(CLI::Range(1, 65536));
  CLI11_PARSE(app, argc, argv);
  return essaim::run(o);
}
