// essaim worker: serve the experts of some slices over TCP (docs/worker.md). Built twice from this one file:
// as `essaim worker` inside the main binary, and as the stand-alone `essaim-worker` (worker_main.cpp), which
// links the worker library alone — that binary is what proves a worker carries no model code.
//
//   essaim worker --slice m.L03.E00-15.gguf --slice m.L04.E00-15.gguf --listen 0.0.0.0:9000 --threads 4
//   essaim-worker --slice m.L03.E00-15.gguf --listen 127.0.0.1:0     # prints "listening on 127.0.0.1:PORT"
//   essaim worker --slices slices/ --experts 0-31 --host 0.0.0.0 --port 9001   # experts 0-31 of every layer
//   essaim worker --coordinator https://10.0.0.1:8080 --token T --budget-mb 512 --data-dir d --listen 0.0.0.0:9000
//   essaim worker --slice m.L03.E00-15.gguf --relay wss://relay.example.org:443 --token T  # behind NAT (docs/relay.md)
//   essaim worker --coordinator https://c.example.org --relay wss://relay.example.org --token T --budget-mb 512 --data-dir d
//
// Exit codes: 0 after SIGINT/SIGTERM, 1 when a slice cannot be served or the port not bound, 2 for a usage
// error (docs/cli.md).
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/build_info.h"
#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/slice_selection.h"
#include "slice/model_identity.h"
#include "net/stream_server.h"
#include "net/tcp.h"
#include "worker/compute_device.h"
#include "worker/joined_worker.h"
#include "worker/relay_serving.h"
#include "worker/worker.h"

namespace essaim::cli {
namespace {

struct Args {
  std::vector<std::string> slices;
  std::string slices_dir;
  std::string experts, layers;  // with --slices
  std::optional<IndexRange> expert_range, layer_range;  // parsed by resolve()
  std::string listen = "127.0.0.1:9000";
  std::string host;
  int32_t port = -1;
  size_t threads = 0;
  size_t lanes = 1;
  uint64_t max_frame = worker::kWorkerDefaultMaxPayloadBytes;
  size_t max_in_flight = 16;
  double idle_timeout_s = 600;
  std::string label;
  bool quiet = false;
  std::string device = "cpu";
  // Joining the coverage market by itself (worker/joined_worker.h) instead of --slice/--slices.
  std::string coordinator, data_dir, advertise;
  double budget_mb = 0;  // MiB, fractions allowed (tests use slices of a few hundred KiB)
  std::string expert_output = "any";
  // Behind NAT: dial out to a relay instead of listening (docs/relay.md).
  std::string relay, ca_file;
  bool insecure_http = false;  // --coordinator over plain http:// to a host that is not loopback
  size_t relay_idle = 2;
  std::string token;  // this node's token: the coordinator's and the relay's
};

void add_options(CLI::App& cmd, Args& a) {
  cmd.add_option("--slice", a.slices, "Expert slice to serve (repeatable; `essaim slice` writes them)")
      ->check(CLI::ExistingFile);
  cmd.add_option("--slices", a.slices_dir, "A `slice --plan` folder: serve its slices inside --experts/--layers")
      ->check(CLI::ExistingDirectory);
  cmd.add_option("--experts", a.experts, "With --slices: the expert range to serve, inclusive: A-B or A");
  cmd.add_option("--layers", a.layers, "With --slices: the layer range to serve (default: every layer)");
  cmd.add_option("--listen", a.listen,
                 "HOST:PORT to accept backbones on (loopback only by default; 0.0.0.0:PORT for every interface); "
                 "port 0 picks a free one")
      ->capture_default_str();
  add_host_port_flags(cmd, a.host, a.port, "accept backbones");
  add_threads_flag(cmd, a.threads, "Compute threads (0 = every core)");
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
  cmd.add_option("--device", a.device, "Where experts are computed: cpu, cuda or cuda:N (a CUDA build; same bits)")
      ->capture_default_str();
  cmd.add_option("--coordinator", a.coordinator,
                 "https://HOST[:PORT] of a coordinator (http:// on loopback): volunteer, download the assigned slices "
                 "and serve them");
  cmd.add_option("--token", a.token, "This node's token (from POST /api/nodes), for --coordinator and --relay");
  cmd.add_option("--budget-mb", a.budget_mb, "With --coordinator: MiB of slices this worker may hold (fractions allowed)")
      ->check(CLI::Range(0.001, double(1 << 30)));
  cmd.add_option("--data-dir", a.data_dir, "With --coordinator: where slices are kept (re-verified at start)");
  cmd.add_option("--advertise", a.advertise,
                 "With --coordinator: HOST:PORT backbones should dial (default: the --listen host and bound port)");
  cmd.add_option("--expert-output", a.expert_output,
                 "Output formats answered: any (f32 or bf16, as each backbone asks), f32 or bf16 (others refused)")
      ->check(CLI::IsMember({"any", "f32", "bf16"}))
      ->capture_default_str();
  cmd.add_option("--relay", a.relay, "ws[s]://HOST:PORT of a relay to serve through (no port opened here; needs --token)");
  cmd.add_option("--ca-file", a.ca_file,
                 "Extra PEM CA certificate to trust for a wss:// relay and an https:// coordinator (besides the system store)")
      ->check(CLI::ExistingFile);
  cmd.add_flag("--insecure-http", a.insecure_http,
               "Allow a plain http:// --coordinator that is not on loopback (the token in clear text)");
  cmd.add_option("--relay-idle", a.relay_idle, "Idle connections kept registered at the relay (backbones take one each)")
      ->check(CLI::Range(size_t(1), size_t(64)))
      ->capture_default_str();
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

// --slices/--experts/--layers into slice paths, --host/--port into --listen; usage errors throw.
Args resolve(Args a) {
  if (!a.coordinator.empty()) {
    if (!a.slices.empty() || !a.slices_dir.empty()) throw UsageError("--coordinator chooses the slices: no --slice/--slices");
    if (a.token.empty() || a.budget_mb <= 0 || a.data_dir.empty()) {
      throw UsageError("--coordinator needs --token, --budget-mb and --data-dir");
    }
    if (a.device != "cpu") throw UsageError("--coordinator workers compute on the CPU for now (--device cpu)");
  } else if (a.budget_mb > 0 || !a.data_dir.empty() || !a.advertise.empty()) {
    throw UsageError("--budget-mb, --data-dir and --advertise go with --coordinator");
  }
  if (!a.slices_dir.empty()) {
    if (a.experts.empty()) throw UsageError("--slices needs --experts A-B (and optionally --layers A-B)");
    a.expert_range = parse_inclusive_range(a.experts, "experts");
    if (!a.layers.empty()) a.layer_range = parse_inclusive_range(a.layers, "layers");
  } else if (!a.experts.empty() || !a.layers.empty()) {
    throw UsageError("--experts and --layers choose slices of a --slices folder");
  }
  if (!a.relay.empty() && a.token.empty()) throw UsageError("--relay needs --token (this node's token)");
  if (!a.relay.empty() && !a.advertise.empty()) throw UsageError("--advertise goes with --listen: behind --relay the address is the relay's");
  if (a.relay.empty() && a.coordinator.empty() && (!a.token.empty() || !a.ca_file.empty()))
    throw UsageError("--token and --ca-file go with --relay or --coordinator");
  if (a.insecure_http && a.coordinator.empty()) throw UsageError("--insecure-http goes with --coordinator");
  if (a.slices.empty() && a.slices_dir.empty() && a.coordinator.empty()) throw UsageError("give --slice FILE (repeatable) or --slices DIR --experts A-B");
  if (!a.host.empty() || a.port >= 0) {
    net::NetResult<std::pair<std::string, uint16_t>> where = net::parse_host_port(a.listen);
    const std::string host = !a.host.empty() ? a.host : where ? where->first : "127.0.0.1";
    const int port = a.port >= 0 ? a.port : where ? int(where->second) : 9000;
    a.listen = (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
  }
  return a;
}

// --coordinator: the worker joins the market by itself (worker/joined_worker.h).
int run_joined(const Args& a, const sigset_t& stop_signals) {
  worker::JoinConfig join{.coordinator = a.coordinator, .access = {.ca_file = a.ca_file, .insecure_http = a.insecure_http},
                          .token = a.token, .budget_bytes = uint64_t(a.budget_mb * double(1 << 20)),
                          .data_dir = a.data_dir, .listen = a.listen, .advertise = a.advertise, .relay = a.relay,
                          .relay_ca_file = a.ca_file, .relay_idle = a.relay_idle, .worker = {}, .quiet = a.quiet};
  join.worker = {.label = a.label, .threads = a.threads, .lanes = a.lanes, .max_payload_bytes = a.max_frame,
                 .max_in_flight = a.max_in_flight,
                 .idle_timeout = std::chrono::milliseconds(int64_t(a.idle_timeout_s * 1000))};
  if (a.expert_output != "any") join.worker.only_output = expert_output_from_name(a.expert_output);
  if (!a.quiet) join.worker.log = [](const std::string& line) { std::fprintf(stderr, "essaim worker: %s\n", line.c_str()); };
  return worker::run_joined_worker(join, stop_signals);
}

// Where the worker takes connections: through the relay (--relay) or on --listen; no acceptor (and the exit
// code) when neither can be opened.
struct Listening {
  std::unique_ptr<net::Acceptor> acceptor;
  std::string where;  // what the "listening on" line says
  int exit_code = 0;
};

Listening open_listening(const Args& a, worker::Worker& w, const std::shared_ptr<worker::RelayRefusal>& refusal) {
  if (!a.relay.empty()) {
    worker::RelayConfig rc{.relay = a.relay, .token = a.token,
                           .build = {.model = w.hello().model, .protocol_version = w.hello().version,
                                     .kernel_abi = w.hello().fingerprint.kernel_abi},
                           .ca_file = a.ca_file, .idle_connections = a.relay_idle, .log = nullptr};
    if (!a.quiet) rc.log = [](const std::string& line) { std::fprintf(stderr, "essaim worker: %s\n", line.c_str()); };
    Result<worker::RelayServing> serving = worker::serve_through_relay(rc, refusal);
    if (!serving) {
      std::fprintf(stderr, "essaim worker: %s\n", serving.status().message().c_str());
      return {.acceptor = nullptr, .where = "", .exit_code = kExitUsage};
    }
    return {.acceptor = std::move(serving->acceptor), .where = serving->where, .exit_code = 0};
  }
  net::NetResult<std::pair<std::string, uint16_t>> where = net::parse_host_port(a.listen);
  if (!where) {
    std::fprintf(stderr, "essaim worker: --listen %s: %s\n", a.listen.c_str(), where.error().message.c_str());
    return {.acceptor = nullptr, .where = "", .exit_code = kExitUsage};
  }
  net::NetResult<std::unique_ptr<net::TcpListener>> listener = net::TcpListener::listen(where->first, where->second);
  if (!listener) {
    std::fprintf(stderr, "essaim worker: cannot listen on %s: %s\n", a.listen.c_str(), listener.error().message.c_str());
    return {.acceptor = nullptr, .where = "", .exit_code = 1};
  }
  const uint16_t port = (*listener)->port();
  return {.acceptor = std::move(*listener), .where = where->first + ":" + std::to_string(port), .exit_code = 0};
}

int run(Args a) {
  // SIGINT/SIGTERM are taken by sigwait below: block them before any thread starts, so every thread
  // inherits the mask and the signal reaches the waiting main thread instead of killing the process.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  if (!a.coordinator.empty()) return run_joined(a, stop_signals);

  if (!a.slices_dir.empty()) {
    Result<std::vector<std::string>> picked = select_slices(a.slices_dir, a.expert_range, a.layer_range);
    if (!picked) {
      std::fprintf(stderr, "essaim worker: --slices %s: %s\n", a.slices_dir.c_str(), picked.status().message().c_str());
      return kExitFailure;
    }
    a.slices.insert(a.slices.end(), picked->begin(), picked->end());
  }
  Result<worker::WorkerState> state = worker::WorkerState::open(a.slices);
  if (!state) {
    std::fprintf(stderr, "essaim worker: %s\n", state.status().message().c_str());
    return 1;
  }
  Result<worker::DeviceSpec> spec = worker::parse_device(a.device);
  Result<worker::ComputeDevice> device = spec ? worker::open_compute_device(*spec, state->store(), a.threads)
                                              : Result<worker::ComputeDevice>(spec.status());
  if (!device) {
    std::fprintf(stderr, "essaim worker: --device %s: %s\n", a.device.c_str(), device.status().message().c_str());
    return 2;
  }
  worker::WorkerOptions options{
      .label = a.label,
      .threads = a.threads,
      .lanes = a.lanes,
      .max_payload_bytes = a.max_frame,
      .max_in_flight = a.max_in_flight,
      .idle_timeout = std::chrono::milliseconds(int64_t(a.idle_timeout_s * 1000)),
  };
  options.executor = device->executor.get();
  options.isa_class = device->isa_class;
  if (a.expert_output != "any") options.only_output = expert_output_from_name(a.expert_output);
  if (device->executor) std::fprintf(stderr, "essaim worker: computing on %s\n", device->description.c_str());
  if (!a.quiet) options.log = [](const std::string& line) { std::fprintf(stderr, "essaim worker: %s\n", line.c_str()); };
  worker::Worker w(*state, options);
  std::fprintf(stderr, "essaim worker: model %s (%s), %zu slice(s), %.1f MiB: %s; kernels ABI %u (%s)\n",
               digest_hex(state->model()).c_str(), state->source_architecture().c_str(), state->slices().size(),
               double(state->slice_bytes()) / (1 << 20), holdings_text(*state).c_str(),
               w.hello().fingerprint.kernel_abi, w.hello().fingerprint.isa_class.c_str());
  auto refusal = std::make_shared<worker::RelayRefusal>();
  Listening listening = open_listening(a, w, refusal);
  if (!listening.acceptor) return listening.exit_code;
  std::unique_ptr<net::Acceptor> acceptor = std::move(listening.acceptor);
  const std::string where_text = listening.where;
  net::StreamServer server(std::move(acceptor), [&w](net::ByteStream& s) { w.serve_connection(s); },
                           {.on_refused = [&w](net::ByteStream& s) { w.refuse_over_capacity(s); }});
  // Tests and scripts wait for this line and read the port from it (the relay's, behind a relay).
  std::printf("listening on %s\n", where_text.c_str());
  std::fflush(stdout);

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  const std::string refused_why = refusal->why();
  if (!refused_why.empty()) {
    std::fprintf(stderr, "essaim worker: %s; stopping\n", refused_why.c_str());
    server.stop();
    return kExitFailure;
  }
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
  cmd->callback([args, &exit_code] { exit_code = run(resolve(*args)); });
}

void configure_worker_app(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<Args>();
  add_options(app, *args);
  app.set_version_flag("--version", [] { return build_info_version_flag_text(); });
  app.callback([args, &exit_code] { exit_code = run(resolve(*args)); });
}

}  // namespace essaim::cli
