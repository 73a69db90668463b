// `essaim coordinator`: the coverage market's coordinator (docs/market.md). Serves one model's slice
// catalogue, the market API, slice downloads and the dashboard over HTTP; state in SQLite or PostgreSQL.
//
//   essaim coordinator --model m.gguf --slices slices/ --db coord.sqlite --listen 127.0.0.1:8700 --admin-token T
//   essaim coordinator ... --db postgresql://essaim@db.example/essaim --replicas 3 --heartbeat-s 5
//
// When the slices directory has no manifest.json the plan is cut there first (--slice-experts per slice).
// Prints "listening on HOST:PORT" once it accepts; SIGINT/SIGTERM stop it. Usage errors exit 2, others 1.
#include <signal.h>

#include <cstdio>
#include <memory>
#include <string>

#include "cli/build_info.h"
#include "cli/commands.h"
#include "cli/common_flags.h"
#include "coord/catalogue.h"
#include "coord/coordinator.h"
#include "net/http_limits.h"
#include "net/tcp.h"

namespace essaim::cli {
namespace {

struct Args {
  std::string model, slices, db, listen = "127.0.0.1:8700", admin_token;
  std::string tls_cert, tls_key;  // https:// when given
  int64_t replicas = 2, heartbeat_s = 10, usage_half_life_s = coord::CoordinatorConfig{}.usage_half_life_s;
  uint32_t slice_experts = 32;
  int32_t max_connections = net::HttpLimits{}.max_connections;
  size_t max_per_address = net::HttpLimits{}.max_per_address;
};

int run(const Args& a) {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);  // before any thread starts: every thread inherits it

  if (a.tls_cert.empty() != a.tls_key.empty()) {
    std::fprintf(stderr, "essaim coordinator: --tls-cert and --tls-key go together\n");
    return 2;
  }
  if (a.admin_token.size() < 16) {
    std::fprintf(stderr, "essaim coordinator: --admin-token must be at least 16 characters\n");
    return 2;
  }
  net::NetResult<std::pair<std::string, uint16_t>> where = net::parse_host_port(a.listen);
  if (!where) {
    std::fprintf(stderr, "essaim coordinator: --listen %s: %s\n", a.listen.c_str(), where.error().message.c_str());
    return 2;
  }
  const BuildInfo build = build_info();
  Result<coord::Catalogue> cat = coord::load_catalogue({.model = a.model, .slices_dir = a.slices,
                                                        .slice_experts = a.slice_experts,
                                                        .protocol_version = build.protocol_version,
                                                        .kernel_abi = std::to_string(build.fingerprint.kernel_abi)});
  if (!cat) {
    std::fprintf(stderr, "essaim coordinator: %s\n", cat.status().message().c_str());
    return 1;
  }
  // A PostgreSQL connection per coordinator thread, so their round trips to the server overlap.
  Result<std::unique_ptr<coord::Store>> store = coord::open_store(a.db, coord::CoordinatorConfig{}.threads);
  if (!store) {
    std::fprintf(stderr, "essaim coordinator: %s\n", store.status().message().c_str());
    return 1;
  }
  const std::string kind = (*store)->kind();
  const size_t n_slices = cat->slices.size();
  coord::Coordinator c(std::move(*cat), std::move(*store),
                       {.admin_token = a.admin_token, .slices_dir = a.slices, .replicas = a.replicas,
                        .heartbeat_s = a.heartbeat_s, .usage_half_life_s = a.usage_half_life_s});
  net::HttpLimits limits = c.http_limits();
  limits.max_connections = a.max_connections;
  limits.max_per_address = a.max_per_address;
  std::optional<net::ServerTls> tls;
  if (!a.tls_cert.empty()) tls = net::ServerTls{a.tls_cert, a.tls_key};
  Result<std::unique_ptr<net::HttpServer>> server = c.listen(where->first, where->second, std::move(limits), tls);
  if (!server) {
    std::fprintf(stderr, "essaim coordinator: %s\n", server.status().message().c_str());
    return 1;
  }
  std::fprintf(stderr, "essaim coordinator: model %s (%s), %zu slices, %s store, %lld replicas wanted, heartbeat %llds, %s\n",
               c.catalogue().model_identity.c_str(), c.catalogue().architecture.c_str(), n_slices, kind.c_str(),
               (long long)a.replicas, (long long)a.heartbeat_s, tls ? "https:// (TLS)" : "plain http://");
  // Tests and scripts wait for this line and read the port from it.
  std::printf("listening on %s:%u\n", where->first.c_str(), unsigned((*server)->port()));
  std::fflush(stdout);
  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  std::fprintf(stderr, "essaim coordinator: %s, stopping\n", signal_number == SIGINT ? "SIGINT" : "SIGTERM");
  (*server)->stop();
  c.stop();  // before the listener is destroyed: requests in hand hold its connections
  return 0;
}

}  // namespace

void register_coordinator(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("coordinator", "Run the coverage market: slice catalogue, market API, downloads, dashboard");
  cmd->add_option("--model", a->model, "The full model GGUF the slices are cut from")->required()->check(CLI::ExistingFile);
  cmd->add_option("--slices", a->slices, "Directory of the slices and manifest.json (cut there when it has no manifest)")->required();
  cmd->add_option("--db", a->db, "SQLite file path, or a postgresql:// URL")->required();
  cmd->add_option("--listen", a->listen, "HOST:PORT to serve HTTP on (port 0: the OS chooses)")->capture_default_str();
  cmd->add_option("--tls-cert", a->tls_cert, "PEM certificate chain: serve https:// (without it, plain http:// for loopback)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--tls-key", a->tls_key, "PEM private key of --tls-cert")->check(CLI::ExistingFile);
  // Also from the environment, so the token need not appear in `ps` output.
  cmd->add_option("--admin-token", a->admin_token, "The admin token (registers and revokes nodes), 16+ characters")
      ->required()->envname("ESSAIM_ADMIN_TOKEN");
  cmd->add_option("--replicas", a->replicas, "Holders wanted per slice")->capture_default_str()->check(CLI::Range(1, 1000));
  cmd->add_option("--heartbeat-s", a->heartbeat_s, "Seconds between node heartbeats (a node silent 3x this is no longer a holder)")
      ->capture_default_str()->check(CLI::Range(1, 3600));
  cmd->add_option("--usage-half-life-s", a->usage_half_life_s,
                  "Router usage counts halve every this many seconds, so demand follows today's router (0: never)")
      ->capture_default_str()->check(CLI::Range(int64_t(0), int64_t(10) * 365 * 86400));
  cmd->add_option("--slice-experts", a->slice_experts, "Experts per slice when the plan is cut here")
      ->capture_default_str()->check(CLI::Range(1, 65536));
  add_admission_flags(*cmd, a->max_connections, a->max_per_address);
  cmd->callback([a, &exit_code] { exit_code = run(*a); });
}

}  // namespace essaim::cli
