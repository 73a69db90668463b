// essaim relay: pair workers behind NAT with backbones over WebSocket (docs/relay.md).
//
//   essaim relay --listen 0.0.0.0:443 --tls-cert cert.pem --tls-key key.pem --tokens tokens.txt
//   essaim relay --listen 127.0.0.1:0 --tokens tokens.txt        # plain ws://, prints "listening on 127.0.0.1:PORT"
//   essaim relay --listen 0.0.0.0:443 --tls-cert c --tls-key k --coordinator https://coord.example.org
//
// Exit codes: 0 after SIGINT/SIGTERM, 1 when the port cannot be bound or a file not read, 2 for a usage error.
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "net/tcp.h"
#include "relay/relay_server.h"

namespace essaim::cli {
namespace {

struct RelayArgs {
  std::string listen = "127.0.0.1:8443";
  std::string tls_cert, tls_key;
  std::string tokens, coordinator, ca_file;
  bool insecure_http = false;
  double token_cache_s = 5;
  uint64_t max_message = proto::kDefaultMaxPayloadBytes + proto::kFrameHeaderBytes;
  size_t per_node = 32;
  int32_t max_connections = int32_t(relay::RelayOptions{}.max_connections);
  size_t max_per_address = relay::RelayOptions{}.max_per_address;
  double idle_timeout_s = 30, write_stall_s = 10;
  int threads = relay::RelayOptions{}.threads;
  bool quiet = false;
};

int run_relay(const RelayArgs& a) {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  if (a.tokens.empty() == a.coordinator.empty()) {
    std::fprintf(stderr, "essaim relay: give exactly one of --tokens FILE and --coordinator URL\n");
    return kExitUsage;
  }
  if (a.tls_cert.empty() != a.tls_key.empty()) {
    std::fprintf(stderr, "essaim relay: --tls-cert and --tls-key go together\n");
    return kExitUsage;
  }
  net::NetResult<std::pair<std::string, uint16_t>> where = net::parse_host_port(a.listen);
  if (!where) {
    std::fprintf(stderr, "essaim relay: --listen %s: %s\n", a.listen.c_str(), where.error().message.c_str());
    return kExitUsage;
  }
  std::unique_ptr<relay::TokenChecker> tokens;
  if (!a.tokens.empty()) {
    Result<std::unique_ptr<relay::FileTokenChecker>> t = relay::FileTokenChecker::load(a.tokens);
    if (!t) {
      std::fprintf(stderr, "essaim relay: --tokens: %s\n", t.status().message().c_str());
      return 1;
    }
    tokens = std::move(*t);
  } else {
    Result<std::unique_ptr<relay::CoordinatorTokenChecker>> c = relay::CoordinatorTokenChecker::create(
        a.coordinator, {.ca_file = a.ca_file, .insecure_http = a.insecure_http,
                        .cache_ttl = std::chrono::milliseconds(int64_t(a.token_cache_s * 1000))});
    if (!c) {
      std::fprintf(stderr, "essaim relay: %s\n", c.status().message().c_str());
      return kExitUsage;
    }
    tokens = std::move(*c);
  }
  relay::RelayOptions o;
  if (!a.tls_cert.empty()) o.tls = net::WsServerTls{a.tls_cert, a.tls_key};
  o.limits.max_message_bytes = a.max_message;
  o.limits.idle_timeout = std::chrono::milliseconds(int64_t(a.idle_timeout_s * 1000));
  o.write_stall = std::chrono::milliseconds(int64_t(a.write_stall_s * 1000));
  o.max_connections_per_node = a.per_node;
  o.max_connections = size_t(a.max_connections);
  o.max_per_address = a.max_per_address;
  o.threads = a.threads;
  // Registered workers whose token the coordinator revoked stop being paired within about the cache bound.
  if (!a.coordinator.empty()) o.token_recheck = std::chrono::milliseconds(std::max<int64_t>(int64_t(a.token_cache_s * 1000), 200));
  if (!a.quiet) o.log = [](const std::string& line) { std::fprintf(stderr, "essaim relay: %s\n", line.c_str()); };
  Result<std::unique_ptr<relay::RelayServer>> server = relay::RelayServer::start(where->first, where->second, o, std::move(tokens));
  if (!server) {
    std::fprintf(stderr, "essaim relay: %s\n", server.status().message().c_str());
    return 1;
  }
  std::fprintf(stderr, "essaim relay: %s, tokens from %s\n", o.tls ? "wss:// (TLS)" : "plain ws:// (no certificate given)",
               a.tokens.empty() ? a.coordinator.c_str() : a.tokens.c_str());
  std::printf("listening on %s:%u\n", where->first.c_str(), unsigned((*server)->port()));
  std::fflush(stdout);
  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  std::fprintf(stderr, "essaim relay: %s, stopping\n", signal_number == SIGINT ? "SIGINT" : "SIGTERM");
  (*server)->stop();
  return 0;
}

}  // namespace

void register_relay(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<RelayArgs>();
  CLI::App* cmd = app.add_subcommand("relay", "Pair workers behind NAT with backbones over WebSocket (docs/relay.md)");
  cmd->add_option("--listen", a->listen, "HOST:PORT to accept on (0.0.0.0:443 in production; port 0 picks one)")->capture_default_str();
  cmd->add_option("--tls-cert", a->tls_cert, "PEM certificate chain: serve wss:// (without it, plain ws:// for tests)")->check(CLI::ExistingFile);
  cmd->add_option("--tls-key", a->tls_key, "PEM private key of --tls-cert")->check(CLI::ExistingFile);
  cmd->add_option("--tokens", a->tokens, "Token file: lines 'NODE_ID TOKEN'")->check(CLI::ExistingFile);
  cmd->add_option("--coordinator", a->coordinator,
                  "https://HOST[:PORT] of the market coordinator (checks tokens with GET /api/whoami; http:// on loopback)");
  cmd->add_option("--ca-file", a->ca_file, "Extra PEM CA certificate to trust for an https:// coordinator (besides the system store)")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--insecure-http", a->insecure_http, "Allow a plain http:// coordinator that is not on loopback (tokens in clear text)");
  cmd->add_option("--token-cache", a->token_cache_s,
                  "Seconds a coordinator's answer on a token is kept: a revoked token is refused at most this long after, "
                  "and a coordinator down longer than this fails closed")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  cmd->add_option("--max-message", a->max_message, "Largest message forwarded, in bytes (the expert protocol's frame limit + 9)")
      ->check(CLI::Range(uint64_t(1) << 16, uint64_t(1) << 34))
      ->capture_default_str();
  add_admission_flags(*cmd, a->max_connections, a->max_per_address);
  cmd->add_option("--per-node", a->per_node, "Connections one node's token may hold open")->check(CLI::Range(size_t(1), size_t(1) << 16))->capture_default_str();
  cmd->add_option("--idle-timeout", a->idle_timeout_s, "Seconds without any frame (pings included) before a connection is closed")
      ->check(CLI::Range(1.0, 1e6))
      ->capture_default_str();
  cmd->add_option("--write-stall", a->write_stall_s, "Seconds a peer may take to read one message before its pair is dropped")
      ->check(CLI::Range(0.1, 1e6))
      ->capture_default_str();
  cmd->add_option("--threads", a->threads, "I/O threads serving every connection (idle connections cost none)")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  cmd->add_flag("-q,--quiet", a->quiet, "Do not log connections");
  cmd->callback([a, &exit_code] { exit_code = run_relay(*a); });
}

}  // namespace essaim::cli
