// The server side of WebSocket (RFC 6455, Boost.Beast; TLS through OpenSSL) on Asio's asynchronous model:
// a fixed pool of I/O threads serves every connection, each on its own strand, so the thread count does not
// grow with connections (the relay holds hundreds of idle ones). On one port it upgrades WebSocket requests
// and answers plain HTTP ones (GET /metrics). Each upgraded connection is a WsSession: messages arrive by
// callback and sends are queued, so no caller ever blocks an I/O thread.
//
//   auto l = WsListener::listen("0.0.0.0", 443, {.tls = server_tls, .http = metrics_handler, .io_threads = 2},
//       [](std::shared_ptr<WsSession> s) {
//         s->start([s](std::vector<uint8_t> m) { s->send(std::move(m), [](NetStatus) {}); return true; },  // echo
//                  [](const NetError& why) { /* the read side ended: peer closed, protocol error, timeout */ });
//       });
//   ...
//   (*l)->stop();   // joins the I/O threads; every session's callbacks are dropped
//
// Admission: every connection holds a net::Admission ticket from the TCP accept on (per-address and total
// caps on connections not yet authenticated, the oldest evicted past either: closed with 1013 once
// upgraded); WsSession::authenticate() moves it to the authenticated caps. Sockets in all are capped at
// max_authenticated + max_unauthenticated (closed at once past it, counted as refused_busy).
//
// Threads: io_threads plus blocking_threads, whatever the number of connections.
//
// Threading: callbacks (on_message, on_end, a send's completion) run on the session's strand, one at a
// time per session; the session's methods may be called from any thread (they post to the strand) and
// never call back before returning. A peer that does not read delays only its own sends: each queued
// message waits at most `write_stall` for the socket, then the session fails every send still queued with
// TIMEOUT and closes its socket.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "net/admission.h"
#include "net/byte_stream.h"
#include "net/http_server.h"
#include "net/websocket.h"

namespace essaim::net {

// One upgraded server connection.
class WsSession {
 public:
  // A whole binary message; returns false to stop reading until resume_reading() (the consumer's queue is
  // full: TCP then pushes back on the sender).
  using OnMessage = std::function<bool(std::vector<uint8_t> message)>;
  // The read side ended, once: the peer closed (CLOSED; peer_close_code() says with what), broke the
  // protocol (PROTOCOL; Beast has sent its close code), sent a message over the limit (TOO_LARGE; 1009 sent),
  // went silent past the idle timeout or the first-message deadline (TIMEOUT), or the connection was closed
  // here. Both callbacks are dropped after it, with what they hold.
  using OnEnd = std::function<void(const NetError& why)>;
  using OnSent = std::function<void(const NetStatus& sent)>;

  virtual ~WsSession() = default;
  // Starts reading; call once. The first message must come within `first_message_timeout` (0: no deadline).
  virtual void start(OnMessage on_message, OnEnd on_end, std::chrono::milliseconds first_message_timeout) = 0;
  virtual void resume_reading() = 0;
  // Queues one binary message; `sent` runs once it is written or failed (TIMEOUT: not taken within
  // write_stall; CLOSED: the connection went first). Messages leave in the order they were queued.
  virtual void send(std::vector<uint8_t> message, OnSent sent) = 0;
  // After the messages already queued, a close frame with this code and reason, then the TCP close (at
  // most a second later). Idempotent: the first call's code wins.
  virtual void close_with(WsCloseCode code, std::string reason) = 0;
  // The close code the peer sent (0 while open or when it vanished without one).
  virtual uint16_t peer_close_code() const = 0;
  // nullopt: authenticated (never evicted from now on); else why not (authenticated caps full, evicted).
  virtual std::optional<std::string> authenticate() = 0;
  // Runs `f` on the session's strand after `delay` (unless the listener stops first).
  virtual void run_after(std::chrono::milliseconds delay, std::function<void()> f) = 0;
  // Runs `job` on the listener's small pool for blocking work (a token check that asks a coordinator), never
  // on an I/O thread; it may call the session's methods.
  virtual void run_blocking(std::function<void()> job) = 0;
  virtual const std::string& peer_name() const = 0;  // "1.2.3.4:5678"
  virtual const std::string& target() const = 0;     // the upgrade request's target ("/node/n-1")
};

using WsSessionHandler = std::function<void(std::shared_ptr<WsSession>)>;

struct WsListenerOptions {
  WsLimits limits;                 // first_message_max_bytes holds the first message (the relay's preamble)
  std::optional<WsServerTls> tls;  // none: plain ws://
  // Answers requests that are not upgrades (GET /metrics), on an I/O thread: must not block. Null: 404.
  std::function<HttpReply(const HttpRequestView&)> http;
  size_t max_header_bytes = 8 << 10;  // a bigger request head (or chunked trailer) is answered 431 and closed
  AdmissionLimits admission{.max_unauthenticated = 256, .max_unauthenticated_per_address = 32,
                            .max_authenticated = 1024, .max_authenticated_per_address = 1024};
  int io_threads = 2;
  int blocking_threads = 2;  // for WsSession::run_blocking
  // Outgoing per session: a message not written within this fails its send, and every later one, with TIMEOUT.
  std::chrono::milliseconds write_stall{10000};
  std::function<void(const std::string&)> log;  // admission refusals, at most one line a second; null: silent
};

struct WsListenerStats {
  uint64_t accepted_tcp = 0;
  uint64_t upgraded = 0;
  uint64_t http_requests = 0;
  uint64_t handshake_failures = 0;  // TLS garbage, bad upgrade requests, timeouts
  uint64_t refused_busy = 0;        // over the socket cap, or the listener was stopping
  AdmissionCounters admission;      // evictions of unauthenticated connections, authenticated caps
};

class WsListener {
 public:
  // Binds host:port (port 0: the OS chooses) and serves on `io_threads` threads; `on_session` runs (on an
  // I/O thread) for each upgraded connection.
  static NetResult<std::unique_ptr<WsListener>> listen(std::string_view host, uint16_t port, WsListenerOptions options,
                                                       WsSessionHandler on_session);
  ~WsListener();  // stop()
  uint16_t port() const;
  // Stops accepting, joins the I/O threads, then drops every session's pending operations and callbacks and
  // closes its socket. Idempotent. Sessions still held elsewhere must be released before the listener goes.
  void stop();
  WsListenerStats stats() const;
  struct Impl;

 private:
  explicit WsListener(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace essaim::net
