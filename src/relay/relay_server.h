// The relay (docs/relay.md): workers behind NAT and backbones both dial out to it over WebSocket (TLS on
// 443 in production), and it pairs them and forwards binary messages both ways, unchanged.
//
//   auto tokens = FileTokenChecker::load("tokens.txt");
//   auto relay = RelayServer::start("0.0.0.0", 443, {.tls = WsServerTls{"cert.pem", "key.pem"}}, std::move(*tokens));
//   std::printf("listening on 0.0.0.0:%u\n", (*relay)->port());
//   ...
//   (*relay)->stop();
//
// A worker connection, once its preamble and token are accepted, waits idle under its node id; a backbone
// naming that node id takes one idle connection whose build fingerprint equals its own (never another),
// both get PAIRED, and from then each side's messages are forwarded to the other. Every connection is
// served on a fixed pool of `threads` I/O threads (net/ws_listener.h), so idle connections cost no thread.
// Each direction queues a bounded amount at its destination, then stops reading from the sender; a peer
// that does not take one message within `write_stall` has its pair closed (1011) and the messages it
// never took counted as dropped: no other pair waits (relay_pairing.h). `GET /metrics` on the same port
// reports pairs, bytes, drops and refusals.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "core/status.h"
#include "net/websocket.h"
#include "net/ws_listener.h"
#include "relay/token_check.h"

namespace essaim::relay {

struct RelayOptions {
  std::optional<net::WsServerTls> tls;
  net::WsLimits limits;  // max_message_bytes: the expert protocol's frame limit plus its header
  size_t max_connections_per_node = 32;        // idle + paired + backbone connections of one token's node
  size_t max_connections = 1024;
  // Connections until their token is accepted, per source address and in all (the oldest evicted past
  // either), and authenticated ones of one address (--max-per-address; carrier NAT puts many phones
  // behind one address, hence a wide default).
  size_t max_pending = 256;
  size_t max_pending_per_address = 32;
  size_t max_per_address = 1024;
  std::chrono::milliseconds preamble_timeout{5000};
  std::chrono::milliseconds pair_wait{5000};    // a backbone waits this long for an idle worker connection
  std::chrono::milliseconds write_stall{10000}; // a peer not taking one message within this loses its pair
  int threads = 2;  // I/O threads serving every connection (--threads); token checks run on 2 more
  // Every this long the tokens of the idle worker connections are checked again (through the checker and
  // its cache): one no longer accepted (revoked) is closed with 1008 "bad token" and never paired. 0: never.
  std::chrono::milliseconds token_recheck{0};
  std::function<void(const std::string&)> log;  // null: silent
};

enum class RefusalReason : uint8_t { BAD_PREAMBLE, BAD_TOKEN, TOKEN_UNAVAILABLE, NODE_LIMIT, FINGERPRINT, NO_WORKER, BUSY, COUNT };
enum class DropReason : uint8_t { STALLED_PEER, PEER_GONE, TOO_BIG, COUNT };
std::string_view refusal_reason_name(RefusalReason r);
std::string_view drop_reason_name(DropReason r);

struct RelayStats {
  uint64_t connections_total = 0;
  uint64_t pairs_total = 0;
  int64_t pairs_active = 0;
  int64_t idle_workers = 0;
  uint64_t bytes_to_worker = 0, bytes_to_backbone = 0;
  uint64_t messages_to_worker = 0, messages_to_backbone = 0;
  std::array<uint64_t, size_t(DropReason::COUNT)> dropped_messages{};
  std::array<uint64_t, size_t(DropReason::COUNT)> dropped_bytes{};
  std::array<uint64_t, size_t(RefusalReason::COUNT)> refusals{};
  net::WsListenerStats listener;
};

class RelayServer {
 public:
  static Result<std::unique_ptr<RelayServer>> start(const std::string& host, uint16_t port, RelayOptions options,
                                                    std::unique_ptr<TokenChecker> tokens);
  ~RelayServer();  // stop()
  uint16_t port() const;
  void stop();
  RelayStats stats() const;
  std::string metrics_text() const;  // Prometheus
  struct Impl;

 private:
  explicit RelayServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace essaim::relay
