// essaim worker: serve the experts of some slices over TCP (docs/worker.md). Built twice from this one file:
// as `essaim worker` inside the main binary, and as the stand-alone `essaim-worker` (worker_main.cpp), which
// links the worker library alone — that binary is what proves a worker carries no model code.
//
//   essaim worker --slice m.L03.E00-15.gguf --slice m.L04.E00-15.gguf --listen 0.0.0.0:9000 --threads 4
//   essaim-worker --slice m.L03.E00-15.gguf --listen 127.0.0.1:0     # prints "listening on 127.0.0.1:PORT"
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "gguf/model_identity.h"
#include "net/stream_server.h"
#include "net/tcp.h"
#include "worker/worker.h"

namespace essaim::cli {
namespace {

struct Args {
  std::vector<std::string> slices;
  std::string listen = "127.0.0.1:9000";
  size_t threads = 0;
  size_t lanes = 1;
  uint64_t max_frame = worker::kWorkerDefaultMaxPayloadBytes;
  size_t max_in_flight = 16;
  double idle_timeout_s = 600;
  std::string label;
  bool quiet = false;
};

void add_options(CLI::App& cmd, Args& a) {
  cmd.add_option("--slice", a.slices, "Expert slice to serve (repeatable; `essaim slice` writes them)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd.add_option("--listen", a.listen, "HOST:PORT to accept backbones on; port 0 picks a free one")
      ->capture_default_str();
  cmd.add_option("--threads", a.threads, "Compute threads (0 = every core)")->capture_default_str();
  cmd.add_option("--lanes", a.lanes, "Requests computed at once; the threads are split among them")
      ->check(CLI::Range(size_t(1), size_t(1024)))
      ->capture_default_str();
  cmd.add_option("--max-frame", a.max_frame, "Largest frame payload accepted, in bytes (>= 65536)")
      ->check(CLI::Range(proto::kMinMaxPayloadBytes, uint64_t(1) << 40))
      ->capture_default_str();
  cmd.add_option("--max-in-flight", a.max_in_flight, "Requests in flight per connection before OVERLOADED")
      ->check(CLI::Range(size_t(1), size_t(1) << 20))
      ->capture_default_str();
  cmd.add_option("--idle-timeout", a.idle_timeout_s, "Seconds without a frame before a connection is closed (0 = never)")
      ->check(CLI::Range(0.0, 1e7))
      ->capture_default_str();
  cmd.add_option("--label", a.label, "Name announced to backbones, for their logs");
  cmd.add_flag("-q,--quiet", a.quiet, "Do not log connections");
}

std::string holdings_text(const worker::WorkerState& s) {
  std::string t;
  for (const proto::Holding& h : s.holdings()) {
    if (!t.empty()) t += ", ";
    t += "layer " + std::to_string(h.layer) + " experts " + std::to_string(h.first_expert) + "-" +
         std::to_string(h.first_expert + h.expert_count - 1);
  }
  return t;
}

int run(const Args& a) {
  // SIGINT/SIGTERM are taken by sigwait below: block them before any thread starts, so every thread
  // inherits the mask and the signal reaches the waiting main thread instead of killing the process.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  Result<worker::WorkerState> state = worker::WorkerState::open(a.slices);
  if (!state) {
    std::fprintf(stderr, "essaim worker: %s\n", state.status().message().c_str());
    return 1;
  }
  net::NetResult<std::pair<std::string, uint16_t>> where = net::parse_host_port(a.listen);
  if (!where) {
    std::fprintf(stderr, "essaim worker: --listen %s: %s\n", a.listen.c_str(), where.error().message.c_str());
    return 2;
  }
  net::NetResult<std::unique_ptr<net::TcpListener>> listener = net::TcpListener::listen(where->first, where->second);
  if (!listener) {
    std::fprintf(stderr, "essaim worker: cannot listen on %s: %s\n", a.listen.c_str(), listener.error().message.c_str());
    return 1;
  }
  const uint16_t port = (*listener)->port();

  worker::WorkerOptions options{
      .label = a.label,
      .threads = a.threads,
      .lanes = a.lanes,
      .max_payload_bytes = a.max_frame,
      .max_in_flight = a.max_in_flight,
      .idle_timeout = std::chrono::milliseconds(int64_t(a.idle_timeout_s * 1000)),
  };
  if (!a.quiet) options.log = [](const std::string& line) { std::fprintf(stderr, "essaim worker: %s\n", line.c_str()); };
  worker::Worker w(*state, options);
  std::fprintf(stderr, "essaim worker: model %s (%s), %zu slice(s), %.1f MiB: %s; kernels ABI %u (%s)\n",
               digest_hex(state->model()).c_str(), state->source_architecture().c_str(), state->slices().size(),
               double(state->slice_bytes()) / (1 << 20), holdings_text(*state).c_str(),
               w.hello().fingerprint.kernel_abi, w.hello().fingerprint.isa_class.c_str());
  net::StreamServer server(std::move(*listener), [&w](net::ByteStream& s) { w.serve_connection(s); },
                           {.on_refused = [&w](net::ByteStream& s) { w.refuse_over_capacity(s); }});
  // Tests and scripts wait for this line and read the port from it.
  std::printf("listening on %s:%u\n", where->first.c_str(), unsigned(port));
  std::fflush(stdout);

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  std::fprintf(stderr, "essaim worker: %s, stopping\n", signal_number == SIGINT ? "SIGINT" : "SIGTERM");
  server.stop();
  std::fprintf(stderr, "essaim worker: stats %s\n", w.stats().to_json().c_str());
  return 0;
}

}  // namespace

void register_worker(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("worker", "Serve the experts of some slices to backbones over TCP");
  add_options(*cmd, *args);
  cmd->callback([args, &exit_code] { exit_code = run(*args); });
}

void configure_worker_app(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<Args>();
  add_options(app, *args);
  app.callback([args, &exit_code] { exit_code = run(*args); });
}

}  // namespace essaim::cli
