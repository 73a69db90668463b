// A worker served through a relay (docs/relay.md) instead of a listening port: the one way both `essaim
// worker --relay` (fixed slices) and the self-joining worker (worker/joined_worker.h) open it.
//
//   auto refusal = std::make_shared<RelayRefusal>();
//   ESSAIM_ASSIGN_OR_RETURN(RelayServing s, serve_through_relay({.relay = "wss://r:443", .token = t, .build = b}, refusal));
//   net::StreamServer server(std::move(s.acceptor), handler);     // s.where: "wss://r:443", for "listening on"
//   sigwait(...);  if (std::string why = refusal->why(); !why.empty()) ...   // the relay refused the token
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "core/status.h"
#include "relay/relay_client.h"

namespace essaim::worker {

// Why the relay refused this node's token (empty: it has not). Set once, from the acceptor's thread.
class RelayRefusal {
 public:
  void set(std::string why);
  std::string why() const;

 private:
  mutable std::mutex mu_;
  std::string why_;
};

struct RelayConfig {
  std::string relay;  // ws[s]://HOST:PORT
  std::string token;  // this node's
  relay::RelayBuild build;  // what backbones must present to be paired with it
  std::string ca_file;      // trusted for wss:// besides the system store
  size_t idle_connections = 2;
  std::function<void(const std::string&)> log;  // null: silent
};

struct RelayServing {
  std::unique_ptr<relay::RelayAcceptor> acceptor;
  std::string where;  // "ws[s]://HOST:PORT": the relay's, printed as "listening on ..."
};

// The acceptor of a worker behind `config.relay`. No retry mends a refused token: the relay's reason goes to
// `refusal` and SIGTERM to this process, whose sigwait then returns (the worker exits 1 with the reason).
Result<RelayServing> serve_through_relay(const RelayConfig& config, std::shared_ptr<RelayRefusal> refusal);

}  // namespace essaim::worker
