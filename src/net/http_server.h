// A small HTTP/1.1 server on Boost.Beast (async, a few I/O threads): reads one request at a time per
// connection under the admission limits (net/http_limits.h), checks its credentials from the head (before
// the body is read), hands it to a handler, and writes either a whole response or a stream (server-sent
// events) that ends by closing the connection. Refusals the listener decides itself — body too large (413),
// headers or trailers too large (431), unreadable request (400), a handler that threw (500), connection
// cap (503) — carry the OpenAI API's error object, which every essaim HTTP service uses. Shared by
// `essaim serve` and the coordinator (http://, or https:// with a certificate: net/tls.h); it links no model code.
//
//   auto server = HttpServer::listen("127.0.0.1", 0, limits,
//       [](const HttpRequestView& req, std::shared_ptr<HttpResponder> out) {
//         out->reply({.status = 200, .body = "{\"status\":\"ok\"}"});
//       });
//   std::printf("listening on %s:%u\n", host.c_str(), server.value()->port());
//
// The handler runs on an I/O thread and must not block; it may keep the responder and answer later from
// any thread (the scheduler's thread does, token by token). An exception from the parser or from a
// handler ends only its connection (400 or 500), never the process.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "net/admission.h"
#include "net/http_limits.h"
#include "net/tls.h"

namespace essaim::net {

struct HttpRequestView {
  std::string method;         // "GET", "POST", ...
  std::string target;         // path and query, as sent
  std::string body;
  std::string authorization;  // the Authorization header, or empty
  std::string range;          // the Range header, or empty (slice downloads)
};

struct HttpReply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra ones (Retry-After, ...)
};

// One request's way back to its client. Thread-safe; may outlive the connection (then it does nothing).
class HttpResponder {
 public:
  virtual ~HttpResponder() = default;
  virtual void reply(HttpReply reply) = 0;        // a whole response; call once
  virtual void stream_begin(HttpReply head) = 0;  // status and headers (head.body is sent first, if any)
  virtual void stream_write(std::string bytes) = 0;
  // As stream_write, then `written` runs (on an I/O thread) once these bytes have gone to the socket: a
  // producer of a large body (a slice download) sends its next chunk from there, so at most one chunk per
  // connection waits in memory. Never runs if the connection closes first. A head with a Content-Length
  // header must then be followed by exactly that many bytes (the connection still closes after).
  virtual void stream_write_then(std::string bytes, std::function<void()> written) = 0;
  virtual void stream_end() = 0;                  // the connection closes once everything is written
  // Called once, on an I/O thread, if the client goes away before the response is complete.
  virtual void on_disconnect(std::function<void()> callback) = 0;
};

using HttpHandler = std::function<void(const HttpRequestView&, std::shared_ptr<HttpResponder>)>;

// What the listener knows of a request once its head is read, before its body: enough to check credentials.
struct HttpRequestHead {
  std::string method;
  std::string target;
  std::string authorization;  // the Authorization header, or empty
};

// The verdict on a request's credentials, given from its head.
struct HttpCredentials {
  enum class Kind : uint8_t {
    PUBLIC,   // needs none (a health probe, a public page): served; the connection stays unauthenticated
    VALID,    // a valid key or token: served; the connection is authenticated (never evicted from now on)
    REFUSED,  // `refusal` (401/403) is the answer, sent before the body is read; then the connection closes
  };
  Kind kind = Kind::PUBLIC;
  HttpReply refusal;
};
// Called on an I/O thread; `done` may run on any thread, once (a check that reads a database posts it away).
using HttpAuthorizer = std::function<void(const HttpRequestHead&, std::function<void(HttpCredentials)> done)>;
// The default: every request VALID when `api_key` is empty; else VALID with "Bearer <api_key>", and REFUSED
// with a 401 invalid_api_key error object without.
HttpAuthorizer api_key_authorizer(std::string api_key);
// The OpenAI error object every essaim HTTP service answers with: {"error": {"message", "type", "param", "code"}}.
HttpReply http_error_reply(int status, std::string message, std::string code);

struct HttpServerStats {
  int32_t connections = 0;            // open now
  uint64_t connections_total = 0;     // accepted, ever
  uint64_t refused_connections = 0;   // over the cap
  uint64_t refused_requests = 0;      // 400/413/431/500 decided by the listener
  uint64_t disconnects = 0;           // clients gone before their response was complete
  uint64_t refused_credentials = 0;   // answered by the authorizer's refusal before the body was read
  uint64_t exceptions = 0;            // thrown by the parser, the authorizer or a handler, caught per connection
  AdmissionCounters admission;   // the shared admission layer's counters (evictions, refusals, live)
};

class HttpServer {
 public:
  // Binds host:port (port 0: the OS chooses) and starts accepting on `io_threads` threads. `authorize`
  // checks each request's credentials from its head (empty: api_key_authorizer(limits.api_key)). With `tls`
  // every connection is https (the handshake under limits.read_deadline); a connection evicted by the
  // admission layer is then closed without the plaintext 503.
  static Result<std::unique_ptr<HttpServer>> listen(const std::string& host, uint16_t port, HttpLimits limits,
                                                    HttpHandler handler, int io_threads = 2,
                                                    HttpAuthorizer authorize = {}, std::optional<ServerTls> tls = {});
  ~HttpServer();  // stop()
  uint16_t port() const;
  // Stops accepting and stops the I/O threads; pending responses are dropped.
  void stop();
  HttpServerStats stats() const;

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace essaim::net
