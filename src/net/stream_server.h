// A server loop over any Acceptor: one thread per connection, so a peer that stalls (half a frame sent,
// or never reading its answers) blocks only its own thread, never the accept loop or another client.
//
//   auto listener = TcpListener::listen("0.0.0.0", 9000);
//   StreamServer server(std::move(*listener), [&](ByteStream& s) {
//     FrameConnection c(s);
//     ... handshake, then receive/answer until the peer leaves ...
//   });
//   ...
//   server.stop();   // closes the acceptor and every live connection, joins every thread
//
// The handler owns nothing: the server keeps each stream until its thread has finished, so stop() can
// close streams that handlers are blocked on; a stream is destroyed (its file descriptor released) as soon
// as its handler returns, not when the next connection arrives. Connections beyond max_connections get
// `on_refused` (a non-blocking last word, e.g. a REFUSE) and are closed at once and counted. Per-address
// and pre-authentication limits are the handler's, through net::Admission (net/admission.h). (The worker's
// `serve` is a handler; tests run the same server over a PipeHub.)
#pragma once

#include <atomic>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <thread>

#include "net/byte_stream.h"

namespace essaim::net {

struct ServerOptions {
  // A backstop on threads: admission (the handler's) keeps the real limits, below this.
  size_t max_connections = 512;
  // Called for a connection refused over max_connections, before it is closed; must not block.
  std::function<void(ByteStream&)> on_refused{};
};

class StreamServer {
 public:
  using Handler = std::function<void(ByteStream&)>;

  // Starts accepting at once, on a thread of its own.
  StreamServer(std::unique_ptr<Acceptor> acceptor, Handler handler, ServerOptions options = {});
  ~StreamServer();  // stop()
  StreamServer(const StreamServer&) = delete;
  StreamServer& operator=(const StreamServer&) = delete;

  void stop();  // idempotent

  struct Stats {
    uint64_t accepted = 0;            // connections handed to the handler
    uint64_t refused_over_limit = 0;  // closed at once: max_connections were live
    uint64_t handler_exceptions = 0;  // handlers that threw (the connection was closed; the server lives on)
    size_t active = 0;                // handlers running now
  };
  Stats stats() const;

 private:
  struct Connection {
    std::unique_ptr<ByteStream> stream;
    std::thread thread;
    std::atomic<bool> done{false};
  };
  void accept_loop();
  void reap_finished();  // joins finished connection threads; caller holds mu_

  std::unique_ptr<Acceptor> acceptor_;
  Handler handler_;
  ServerOptions options_;
  mutable std::mutex mu_;
  std::list<std::unique_ptr<Connection>> connections_;  // guarded by mu_
  Stats stats_;                                          // guarded by mu_ (except active, computed)
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;
};

}  // namespace essaim::net
