// The backbone's side of one worker: a long-lived connection kept up by a background thread (connect,
// handshake, read answers, reconnect with exponential backoff), and the calls the dispatcher makes on it
// from the forward pass — which never wait for a connection, only for answers, and only until a deadline.
//
//   WorkerLink link({.name = "10.0.0.2:9000", .connect = tcp_connector("10.0.0.2", 9000)}, my_hello, opts);
//   link.wait_first_attempt(net::deadline_in(2s));     // optional: let the first connect finish
//   std::shared_ptr<LinkSession> s = link.session();   // null while down: compute locally
//   uint64_t id = link.begin_request();                // registered before sending: no answer is missed
//   if (auto f = link.send(*s, request_with_id, deadline)) ... *f is why it failed
//   LinkAnswer a = link.wait(id, deadline);            // the response, or why there is none
//   link.fail(*s, FallbackReason::TIMEOUT, "...");      // closes the session; reconnects after backoff
//
// One thread per link reads the connection and hands each EXPERT_RESPONSE / ERROR to the request it
// answers, so answers of several requests in flight are collected whatever their order. A session that
// ends (peer closed, protocol error, fail() by the dispatcher) fails every request still waiting on it at
// once. The backoff doubles after every failed attempt or failed session (up to backoff_max) and returns
// to backoff_initial only when a request is answered correctly, so a worker that handshakes and then
// misbehaves is retried less and less often.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "backbone/dispatch_stats.h"
#include "net/byte_stream.h"
#include "net/frame_connection.h"
#include "net/websocket.h"
#include "relay/preamble.h"
#include "proto/handshake.h"
#include "proto/messages.h"

namespace essaim::backbone {

// Opens a byte stream to a worker before the deadline (TCP, or an in-memory pipe in tests).
using Connector = std::function<net::NetResult<std::unique_ptr<net::ByteStream>>(net::Deadline)>;
Connector tcp_connector(std::string host, uint16_t port);
// A worker behind a relay (docs/relay.md): dial the relay, present `preamble`, wait for PAIRED.
Connector relay_connector(net::WsUrl url, relay::Preamble preamble, std::string ca_file);

struct LinkOptions {
  std::chrono::milliseconds connect_timeout{2000};  // connect + handshake, per attempt
  std::chrono::milliseconds backoff_initial{100};
  std::chrono::milliseconds backoff_max{10000};
  uint64_t max_payload_bytes = proto::kDefaultMaxPayloadBytes;  // the largest frame we accept
  proto::HandshakePolicy policy;
  std::function<void(const std::string&)> log;      // session events; null = silent
};

struct LinkEndpoint {
  std::string name;     // "host:port" or "pipe#1": stats and logs
  Connector connect;
  // What it should serve before any session has told (the map's declaration, if any): lets a pair whose
  // worker never came up count as a fallback rather than as the backbone's own share.
  std::vector<proto::Holding> expected;
  // Computes what the dispatcher may route to this worker from its HELLO (announced holdings ∩ the map's
  // declaration ∩ the replica). Null: everything announced.
  std::function<std::vector<proto::Holding>(const proto::Hello&)> routable;
};

// A handshaken connection. Immutable once published; the connection itself is thread-safe for sending.
struct LinkSession {
  uint64_t generation = 0;
  std::unique_ptr<net::FrameConnection> conn;
  proto::Hello peer;
  std::vector<proto::Holding> routable;
};

struct LinkAnswer {
  std::optional<proto::ExpertResponse> response;  // set on success
  FallbackReason reason = FallbackReason::DISCONNECTED;  // otherwise: why
  std::string message;
  std::chrono::steady_clock::time_point received_at{};  // when the reader thread had it (round-trip averages)
};

class WorkerLink {
 public:
  // Starts the background thread at once; the first connect attempt begins immediately.
  WorkerLink(LinkEndpoint endpoint, proto::Hello mine, LinkOptions options);
  ~WorkerLink();  // closes the session, wakes and joins the thread; waiting requests fail
  WorkerLink(const WorkerLink&) = delete;
  WorkerLink& operator=(const WorkerLink&) = delete;

  // Waits until the first connect attempt has succeeded or failed. True when a session is up.
  bool wait_first_attempt(net::Deadline deadline);

  std::shared_ptr<LinkSession> session() const;  // null while down, and once fail() has ended it
  // What the last session could serve; kept while down, so a pair whose owner is down is told apart from
  // a pair nobody owns (FallbackReason::UNAVAILABLE vs the backbone's own share).
  std::vector<proto::Holding> last_routable() const;

  // A fresh request id (never 0), registered for an answer.
  uint64_t begin_request(const LinkSession& s);
  // Sends a request whose id came from begin_request. On failure the request is unregistered and the
  // reason returned; a failed write ends the session.
  std::optional<LinkAnswer> send(LinkSession& s, const proto::ExpertRequest& r, net::Deadline deadline);
  // The answer to a sent request, or why there is none by the deadline; unregisters it either way.
  LinkAnswer wait(uint64_t request_id, net::Deadline deadline);
  // Like wait, but a request still unanswered at the deadline stays registered (nullopt): the dispatcher
  // watches a request and its hedged duplicate on another link in turn (docs/dispatch.md, "Hedging").
  std::optional<LinkAnswer> poll(uint64_t request_id, net::Deadline deadline);
  // The dispatcher gives up on this session (timeout, garbage, audit): close it and reconnect after the
  // backoff. No-op when s is no longer the current session.
  void fail(const LinkSession& s, FallbackReason reason, const std::string& why);
  // A request was answered correctly: the next failure backs off from backoff_initial again.
  void note_success();

  const std::string& name() const { return endpoint_.name; }
  WorkerReport report() const;  // counters the dispatcher does not keep: connected, sessions, last error

 private:
  struct Pending {
    uint64_t generation = 0;
    bool done = false;
    LinkAnswer answer;
  };

  void run();  // the background thread
  std::shared_ptr<LinkSession> connect_once(std::string& why);
  void read_session(const std::shared_ptr<LinkSession>& s);
  void end_session(const std::shared_ptr<LinkSession>& s, FallbackReason reason, const std::string& why);
  void deliver(uint64_t generation, uint64_t id, LinkAnswer answer);
  bool sleep_backoff();  // false when stopping
  void log(const std::string& line) const;

  const LinkEndpoint endpoint_;
  const proto::Hello mine_;
  const LinkOptions options_;

  mutable std::mutex mu_;
  std::condition_variable cv_;                       // answers, session changes, stop
  std::shared_ptr<LinkSession> session_;             // guarded by mu_
  std::vector<proto::Holding> last_routable_;        // guarded by mu_
  std::unordered_map<uint64_t, Pending> pending_;    // guarded by mu_
  uint64_t next_id_ = 1;                             // guarded by mu_
  uint64_t generation_ = 0;                          // guarded by mu_
  uint64_t sessions_ = 0;                            // guarded by mu_
  bool first_attempt_done_ = false;                  // guarded by mu_
  bool stopping_ = false;                            // guarded by mu_
  std::chrono::milliseconds backoff_;                // guarded by mu_
  std::string last_error_;                           // guarded by mu_
  std::string last_label_;                           // the last peer's HELLO label, guarded by mu_
  net::FrameConnection* connecting_ = nullptr;       // a handshake in progress (closed on stop), guarded by mu_
  std::optional<std::pair<FallbackReason, std::string>> fail_reason_;  // set by fail(), guarded by mu_
  std::thread thread_;                               // last: started once everything above exists
};

}  // namespace essaim::backbone
