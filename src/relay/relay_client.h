// The two ends that dial the relay (docs/relay.md).
//
// Worker: a net::Acceptor whose connections are backbones reaching it through the relay, so the worker's
// StreamServer and serve_connection run unchanged:
//   RelayAcceptor::Options o{.relay = *parse_ws_url("wss://relay:443"), .token = t, .build = b};
//   net::StreamServer server(std::make_unique<RelayAcceptor>(o), handler);
// It keeps `idle_connections` dial-out connections registered at the relay; each one that gets PAIRED is
// handed to accept() and replaced by a fresh one (so several backbones can use one worker). Dialing
// failures back off exponentially (backoff_initial .. backoff_max) and are retried until close(), except a
// refused token (close 1008 "bad token"), which no retry can mend: the acceptor stops, accept() returns
// REFUSED with the relay's reason, and `on_refused` is told once.
//
// Backbone: relay_connect(url_with_/node/ID, token, build, ...) opens one stream to that worker, or says
// why not (the relay's close code and reason: bad token, fingerprint mismatch, no worker connected).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "net/websocket.h"
#include "relay/preamble.h"

namespace essaim::relay {

// "wss://host:port/node/NODE_ID" -> the node id (an error when the path is not /node/ID).
Result<std::string> node_id_of_url(const net::WsUrl& url);

// Dials, sends the preamble and waits for PAIRED (or the relay's refusal) until the deadline.
net::NetResult<std::unique_ptr<net::WsStream>> relay_connect(const net::WsUrl& url, const Preamble& preamble,
                                                             const net::WsClientOptions& options, net::Deadline deadline);

class RelayAcceptor : public net::Acceptor {
 public:
  struct Options {
    net::WsUrl relay;
    std::string token;
    RelayBuild build;
    net::WsClientOptions ws;
    size_t idle_connections = 2;
    std::chrono::milliseconds connect_timeout{5000};
    std::chrono::milliseconds backoff_initial{200};
    std::chrono::milliseconds backoff_max{10000};
    std::function<void(const std::string&)> log;  // null: silent
    std::function<void(const std::string&)> on_refused;  // the relay refused our token (its reason); null: none
  };
  explicit RelayAcceptor(Options options);
  ~RelayAcceptor() override;  // close()
  net::NetResult<std::unique_ptr<net::ByteStream>> accept(net::Deadline deadline) override;
  void close() override;
  size_t pairs() const;  // connections handed out so far
  // False from a failed dial (relay down, unreachable, refusing) until the next registration succeeds: the
  // worker is unreachable meanwhile (a self-joining worker says so to the coordinator).
  bool reachable() const;

 private:
  void dial_loop();
  static bool token_refused(const net::WsStream& s);
  void stop_refused(const net::WsStream& s);
  Options opts_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false;
  std::string refused_;  // the relay's reason once it refused our token
  std::deque<std::unique_ptr<net::ByteStream>> ready_;  // paired, not yet accepted
  std::vector<net::WsStream*> waiting_;                  // idle at the relay now (to close on close())
  size_t pairs_ = 0;
  bool reachable_ = true;  // no dial has failed since the last registration
  std::vector<std::thread> threads_;
};

}  // namespace essaim::relay
