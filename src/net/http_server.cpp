#include "net/http_server.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/asio/ssl.hpp>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include <nlohmann/json.hpp>

#include "net/http_feed.h"
#include "net/tls.h"

namespace essaim::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
// TLS over the session's own TCP stream: its timeouts and raw socket operations stay where they are.
using TlsLayer = asio::ssl::stream<beast::tcp_stream&>;

namespace {

std::string status_line(int status) {
  const beast::string_view reason = http::obsolete_reason(http::status(status));
  return "HTTP/1.1 " + std::to_string(status) + " " + std::string(reason.data(), reason.size()) + "\r\n";
}

// Head (and, unless streaming, the whole body with its length) of a response, as bytes.
std::string serialize(const HttpReply& r, bool streaming, bool keep_alive) {
  std::string out = status_line(r.status);
  out += "Content-Type: " + r.content_type + "\r\n";
  for (const auto& [k, v] : r.headers) out += k + ": " + v + "\r\n";
  if (streaming) {
    // The body ends when the connection closes (RFC 9112 6.3): no chunked framing is needed for an SSE stream.
    out += "Cache-Control: no-cache\r\nConnection: close\r\n\r\n";
    out += r.body;
    return out;
  }
  out += "Content-Length: " + std::to_string(r.body.size()) + "\r\n";
  out += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  out += r.body;
  return out;
}

// Request line and header bytes as Beast counts them, to tell a chunked body's trailer from the head.
size_t field_bytes(const http::fields& fields) {
  size_t n = 0;
  for (const auto& f : fields) n += f.name_string().size() + f.value().size() + 4;  // ": " and CRLF
  return n;
}

}  // namespace

HttpReply http_error_reply(int status, std::string message, std::string code) {
  nlohmann::json err = {{"message", std::move(message)}, {"type", status >= 500 ? "server_error" : "invalid_request_error"},
                        {"code", std::move(code)}, {"param", nullptr}};
  return {.status = status, .content_type = "application/json",
          .body = nlohmann::json{{"error", err}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
          .headers = {}};
}

HttpAuthorizer api_key_authorizer(std::string api_key) {
  return [key = std::move(api_key)](const HttpRequestHead& head, std::function<void(HttpCredentials)> done) {
    if (api_key_ok(key, head.authorization)) return done({.kind = HttpCredentials::Kind::VALID, .refusal = {}});
    done({.kind = HttpCredentials::Kind::REFUSED,
          .refusal = http_error_reply(401, "invalid or missing API key (send 'Authorization: Bearer <key>')",
                                      "invalid_api_key")});
  };
}

namespace {
HttpReply error_reply(int status, std::string message, std::string code) {
  return http_error_reply(status, std::move(message), std::move(code));
}
class Session;
}  // namespace

struct HttpServer::Impl {
  // Declared before the io_context: sessions (destroyed with its pending handlers) hold tickets of it.
  std::unique_ptr<Admission> admission;
  asio::io_context ioc;
  tcp::acceptor acceptor{ioc};
  HttpLimits limits;
  HttpHandler handler;
  HttpAuthorizer authorize;
  std::unique_ptr<asio::ssl::context> tls;  // https: every connection's TLS layer is made from it
  std::vector<std::thread> threads;
  std::atomic<int32_t> connections{0};
  std::atomic<uint64_t> connections_total{0}, refused_connections{0}, refused_requests{0}, disconnects{0};
  std::atomic<uint64_t> refused_credentials{0}, exceptions{0};
  std::function<void(const std::string&)> log;
  std::once_flag stopped;
  // Every session started, so stop() can break what a session's pending writes hold of it (a streaming
  // responder's continuation holds its session): otherwise such a session, and its admission ticket, would
  // outlive the server.
  std::mutex sessions_mu;
  std::vector<std::weak_ptr<Session>> sessions;
  void remember(const std::shared_ptr<Session>& s);

  void accept();
  // The I/O loop. Every handler catches what it calls; this is the backstop that keeps the process alive
  // if something still throws (the connection whose operation threw is dropped with it).
  void run() {
    for (;;) {
      try {
        ioc.run();
        return;
      } catch (const std::exception& e) {
        ++exceptions;
        log(std::string("an I/O handler threw: ") + e.what());
      }
    }
  }
};

namespace {

class Session;

class Responder final : public HttpResponder {
 public:
  Responder(std::shared_ptr<Session> session, uint64_t generation) : session_(std::move(session)), generation_(generation) {}
  void reply(HttpReply reply) override;
  void stream_begin(HttpReply head) override;
  void stream_write(std::string bytes) override;
  void stream_write_then(std::string bytes, std::function<void()> written) override;
  void stream_end() override;
  void on_disconnect(std::function<void()> callback) override;

 private:
  std::shared_ptr<Session> session_;  // keeps the connection's state until the response is done
  uint64_t generation_;               // which request of the connection this answers
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, HttpServer::Impl& server)
      : stream_(std::move(socket)), server_(server), buffer_(server.limits.max_header_bytes) {
    if (server_.tls) tls_ = std::make_unique<TlsLayer>(stream_, *server_.tls);
    ++server_.connections;
    ++server_.connections_total;
  }
  ~Session() { --server_.connections; }

  // The server has stopped (its I/O threads joined): drop every pending write and callback, so nothing this
  // session queued keeps it alive.
  void abandon() {
    out_.clear();
    on_disconnect_ = nullptr;
    beast::error_code ignored;
    stream_.socket().close(ignored);
  }

  // Takes an admission ticket (which may evict an older unauthenticated connection), then reads.
  void start() {
    beast::error_code ec;
    const tcp::endpoint peer = stream_.socket().remote_endpoint(ec);
    std::weak_ptr<Session> weak = shared_from_this();
    server_.remember(shared_from_this());
    asio::any_io_executor ex = stream_.get_executor();
    // The eviction callback runs under the admission lock on another connection's thread: it only posts.
    ticket_ = server_.admission->admit(ec ? std::string("?") : peer.address().to_string(),
                                       [weak, ex](const std::string& why) {
                                         asio::post(ex, [weak, why] {
                                           if (auto s = weak.lock()) s->evict(why);
                                         });
                                       });
    if (!tls_) return read_request();
    // The handshake is read under the first request's deadline: a peer that never finishes it is dropped.
    stream_.expires_after(server_.limits.read_deadline);
    tls_->async_handshake(asio::ssl::stream_base::server, [self = shared_from_this()](beast::error_code ec) {
      if (self->closed_) return;
      if (ec) return self->close();
      self->read_request();
    });
  }

  // Everything below runs on the session's strand.
  // `generation` names the request: a late call for a request already answered (keep-alive moved on) is dropped.
  void send(uint64_t generation, std::string bytes, bool complete, bool close_after,
            std::function<void()> written = nullptr) {
    if (closed_ || generation != generation_ || complete_) return;
    sent_generation_ = generation;
    if (!bytes.empty() || written) out_.push_back({std::move(bytes), std::move(written)});
    if (complete) {
      complete_ = true;
      close_after_ = close_after_ || close_after;
    }
    write_next();
  }
  void set_disconnect(uint64_t generation, std::function<void()> f) {
    if (generation != generation_) return;  // that request is answered: nothing left to cancel
    if (closed_ && !complete_) {  // already gone: tell at once
      if (f) f();
      return;
    }
    on_disconnect_ = std::move(f);
  }
  // Evicted by the admission layer (too many unauthenticated connections): a short 503 written without
  // waiting (it fits any socket buffer), then closed. An authenticated connection is never evicted.
  void evict(const std::string& why) {
    if (closed_ || authenticated_) return;
    if (!tls_) {  // (over TLS the answer would need a handshake first: the connection is just closed)
      const std::string bytes =
          serialize(error_reply(503, "connection closed to admit others: " + why, "too_many_connections"), false, false);
      beast::error_code ignored;
      stream_.socket().non_blocking(true, ignored);
      stream_.socket().write_some(asio::buffer(bytes), ignored);
    }
    close();
  }
  bool keep_alive() const { return keep_alive_; }
  asio::any_io_executor executor() { return stream_.get_executor(); }

 private:
  // ---- Reading a request: through feed_http_request (net/http_feed.h), which catches what Beast's parser
  // throws; the read buffer is capped at the header limit, which bounds the head, each chunk line and a
  // chunked body's trailer alike.
  void read_request() {
    parser_.emplace();
    parser_->header_limit(uint32_t(server_.limits.max_header_bytes));
    parser_->body_limit(server_.limits.max_body_bytes);
    complete_ = false;
    close_after_ = false;
    head_checked_ = false;
    head_field_bytes_ = 0;
    ++generation_;
    stream_.expires_after(requests_ == 0 ? server_.limits.read_deadline : server_.limits.idle_deadline);
    parse_buffered();  // a pipelined request may be in the buffer already
  }

  void read_more() {
    if (http_buffer_full(buffer_)) {  // what the parser needs whole (a head, a chunk line, a trailer) fills it
      ++server_.refused_requests;
      return refuse(error_reply(431, "the request headers (or a chunked body's trailer) are larger than " +
                                         std::to_string(server_.limits.max_header_bytes) + " bytes",
                                "headers_too_large"));
    }
    const size_t room = buffer_.max_size() - buffer_.size();
    with_layer([&](auto& layer) {
      layer.async_read_some(buffer_.prepare(std::min<size_t>(room, 64 << 10)),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              self->buffer_.commit(n);
                              if (self->closed_) return;
                              if (ec) return self->close();  // timeout, reset, end of stream: no answer
                              self->parse_buffered();
                            });
    });
  }

  void parse_buffered() {
    const HttpFeed f = feed_http_request(*parser_, buffer_, !head_checked_);
    switch (f.stop) {
      case HttpFeedStop::NEED_MORE: return read_more();
      case HttpFeedStop::HEAD: return check_head();
      case HttpFeedStop::DONE: return head_checked_ ? on_request() : check_head();
      case HttpFeedStop::ERROR: break;
    }
    ++server_.refused_requests;
    if (!f.thrown.empty()) {
      ++server_.exceptions;
      return refuse(error_reply(400, "unreadable HTTP request: " + f.thrown, "bad_http"));
    }
    refuse_unparsable(f.ec);
  }

  void refuse_unparsable(beast::error_code ec) {
    if (ec == http::error::body_limit) return refuse_too_large();
    if (ec == http::error::header_limit) {
      return refuse(error_reply(431, "the request headers are larger than " +
                                         std::to_string(server_.limits.max_header_bytes) + " bytes", "headers_too_large"));
    }
    refuse(error_reply(400, "unreadable HTTP request: " + ec.message(), "bad_http"));
  }

  void refuse_too_large() {
    refuse(error_reply(413, "the request body is larger than " + std::to_string(server_.limits.max_body_bytes) + " bytes",
                       "request_too_large"));
  }

  // The head is read: credentials are checked now, so a request with a wrong key is answered before its
  // body is read, and a connection becomes authenticated only by a request that carried valid ones.
  void check_head() {
    head_checked_ = true;
    head_field_bytes_ = field_bytes(parser_->get());
    const auto& h = parser_->get();
    HttpRequestHead head{.method = std::string(h.method_string()), .target = std::string(h.target()),
                         .authorization = std::string(h[http::field::authorization])};
    // `done` holds the session: no read is pending meanwhile, so nothing else does.
    auto done = [self = shared_from_this(), generation = generation_](HttpCredentials c) {
      asio::post(self->executor(), [self, generation, c = std::move(c)]() mutable {
        self->on_credentials(generation, std::move(c));
      });
    };
    try {
      server_.authorize(head, std::move(done));
    } catch (const std::exception& e) {
      note_exception("the credentials check", e);
      refuse(error_reply(500, "internal error while checking credentials", "internal_error"));
    }
  }

  void on_credentials(uint64_t generation, HttpCredentials c) {
    if (closed_ || generation != generation_ || complete_) return;
    if (c.kind == HttpCredentials::Kind::REFUSED) {
      ++server_.refused_credentials;
      return refuse(c.refusal);
    }
    if (c.kind == HttpCredentials::Kind::VALID && !authenticated_) {
      if (std::optional<std::string> no = ticket_->authenticate()) {
        ++server_.refused_requests;
        return refuse(error_reply(503, *no, "too_many_connections"));
      }
      authenticated_ = true;
    }
    // A client that sent "Expect: 100-continue" (curl does for bodies over 1 KiB) waits for our go-ahead
    // before sending the body.
    if (!parser_->is_done() && beast::iequals(parser_->get()[http::field::expect], "100-continue")) {
      auto go_ahead = std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
      with_layer([&](auto& layer) {
        asio::async_write(layer, asio::buffer(*go_ahead), [self = shared_from_this(), go_ahead](beast::error_code ec, size_t) {
          if (self->closed_) return;
          if (ec) return self->close();
          self->parse_buffered();
        });
      });
      return;
    }
    parse_buffered();
  }

  void on_request() {
    // A chunked body's trailer counts against the body limit (its size was bounded by the buffer already).
    const size_t trailer = field_bytes(parser_->get()) - head_field_bytes_;
    if (parser_->get().body().size() + trailer > server_.limits.max_body_bytes) {
      ++server_.refused_requests;
      return refuse_too_large();
    }
    ++requests_;
    http::request<http::string_body> req = parser_->release();
    keep_alive_ = req.keep_alive();
    HttpRequestView view{.method = std::string(req.method_string()), .target = std::string(req.target()),
                         .body = std::move(req.body()), .authorization = std::string(req[http::field::authorization]),
                         .range = std::string(req[http::field::range])};
    // Reading the next request waits until this response is written; meanwhile watch for the client leaving.
    stream_.expires_never();
    watch(generation_);
    try {
      server_.handler(view, std::make_shared<Responder>(shared_from_this(), generation_));
    } catch (const std::exception& e) {
      note_exception("the request handler", e);
      // Nothing sent yet for this request: a 500 can still be its answer. Otherwise only a close can.
      if (sent_generation_ != generation_) return refuse(error_reply(500, "internal error", "internal_error"));
      close();
    }
  }

  void note_exception(const char* where, const std::exception& e) {
    ++server_.exceptions;
    if (server_.log) server_.log(std::string(where) + " threw: " + e.what() + " (the connection is closed)");
  }

  void refuse(const HttpReply& r) {
    keep_alive_ = false;
    refused_ = true;
    send(generation_, serialize(r, false, false), true, true);
  }

  // After a refusal the client may still be sending the body we did not read; closing with unread bytes
  // would reset the connection and could destroy our answer before the client reads it. So: half-close,
  // then read and discard for a bounded time and amount.
  void drain() {
    stream_.expires_after(std::chrono::seconds(2));
    stream_.async_read_some(asio::buffer(scratch_), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->drained_ += n;
      if (ec || self->drained_ > 4 * self->server_.limits.max_body_bytes) return self->close();
      self->drain();
    });
  }

  // Readable while waiting for our own answer means the peer closed (or pipelined, which we leave in the
  // socket for the next read). The peek must not block: the reactor can report a readiness that an earlier
  // read already consumed, and a blocking peek would then hold this session's strand (and the answer
  // posted to it) until the client gives up. Nothing to read yet: watch again.
  void watch(uint64_t generation) {
    stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this(), generation](beast::error_code ec) {
      if (generation != self->generation_ || self->complete_ || self->closed_ || ec == asio::error::operation_aborted)
        return;
      if (ec) return self->client_gone();
      char byte;
      const ssize_t n = ::recv(self->stream_.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n > 0) return;  // pipelined bytes: read with the next request
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return self->watch(generation);
      self->client_gone();  // 0: orderly close; < 0: reset or another error
    });
  }

  void client_gone() {
    if (closed_) return;
    if (!complete_) ++server_.disconnects;
    close();
  }

  void write_next() {
    if (writing_ || closed_) return;
    if (out_.empty()) {
      if (complete_) finish_response();
      return;
    }
    writing_ = true;
    stream_.expires_after(server_.limits.write_deadline);
    with_layer([&](auto& layer) {
      asio::async_write(layer, asio::buffer(out_.front().bytes), [self = shared_from_this()](beast::error_code ec, size_t) {
        self->writing_ = false;
        if (self->closed_) {  // closed while this write was in flight (its completion was already queued)
          self->out_.clear();
          return;
        }
        if (ec) return self->client_gone();
        std::function<void()> written = std::move(self->out_.front().written);
        self->out_.pop_front();
        if (written) {
          try {
            written();
          } catch (const std::exception& e) {
            self->note_exception("a stream's write callback", e);
            return self->close();
          }
        }
        self->write_next();
      });
    });
  }

  void finish_response() {
    ++generation_;  // the watch of this request is stale from now on
    on_disconnect_ = nullptr;  // answered: a keep-alive connection closing later is no cancellation of it
    beast::error_code ignored;
    stream_.socket().cancel(ignored);
    if (close_after_ || !keep_alive_) {
      stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
      if (refused_) return drain();
      return close();
    }
    read_request();
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    // A write in flight still reads out_.front() (the reactor may be copying it to the socket on another
    // thread): that one stays until its completion runs.
    if (writing_) {
      while (out_.size() > 1) out_.pop_back();
      out_.front().written = nullptr;
    } else {
      out_.clear();
    }
    beast::error_code ignored;
    stream_.socket().close(ignored);
    if (!complete_ && on_disconnect_) {
      auto f = std::move(on_disconnect_);
      f();
    }
    on_disconnect_ = nullptr;
  }

  // Runs f on what requests are read from and answers written to: the TLS layer (https) or the TCP stream.
  // Everything else (deadlines, the peek of watch(), shutdown, close, a refusal's drain) acts on the TCP stream.
  template <class F>
  void with_layer(F&& f) {
    if (tls_) return f(*tls_);
    f(stream_);
  }

  beast::tcp_stream stream_;
  std::unique_ptr<TlsLayer> tls_;  // https only; declared after stream_, which it refers to
  HttpServer::Impl& server_;
  std::unique_ptr<Admission::Ticket> ticket_;  // released with the session
  bool authenticated_ = false;
  beast::flat_buffer buffer_;  // its max_size is the header limit
  bool head_checked_ = false;
  size_t head_field_bytes_ = 0;
  uint64_t sent_generation_ = 0;  // the last request something was sent for
  std::optional<http::request_parser<http::string_body>> parser_;
  struct Pending {
    std::string bytes;
    std::function<void()> written;  // stream_write_then's callback, or empty
  };
  std::deque<Pending> out_;
  std::function<void()> on_disconnect_;
  uint64_t generation_ = 0;
  uint64_t requests_ = 0;
  bool keep_alive_ = false;
  bool writing_ = false;
  bool complete_ = false;
  bool close_after_ = false;
  bool closed_ = false;
  bool refused_ = false;
  size_t drained_ = 0;
  std::array<char, 16384> scratch_{};
};

void Responder::reply(HttpReply r) {
  asio::post(session_->executor(), [s = session_, g = generation_, r = std::move(r)] {
    s->send(g, serialize(r, false, s->keep_alive()), true, false);
  });
}
void Responder::stream_begin(HttpReply head) {
  asio::post(session_->executor(),
             [s = session_, g = generation_, h = std::move(head)] { s->send(g, serialize(h, true, false), false, true); });
}
void Responder::stream_write(std::string bytes) {
  asio::post(session_->executor(),
             [s = session_, g = generation_, b = std::move(bytes)]() mutable { s->send(g, std::move(b), false, true); });
}
void Responder::stream_write_then(std::string bytes, std::function<void()> written) {
  asio::post(session_->executor(), [s = session_, g = generation_, b = std::move(bytes), w = std::move(written)]() mutable {
    s->send(g, std::move(b), false, true, std::move(w));
  });
}
void Responder::stream_end() {
  asio::post(session_->executor(), [s = session_, g = generation_] { s->send(g, {}, true, true); });
}
void Responder::on_disconnect(std::function<void()> callback) {
  asio::post(session_->executor(),
             [s = session_, g = generation_, f = std::move(callback)]() mutable { s->set_disconnect(g, std::move(f)); });
}

}  // namespace

void HttpServer::Impl::accept() {
  acceptor.async_accept(asio::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
    if (!ec) {
      // Sockets in all: the authenticated cap plus room for those still unauthenticated (evictable).
      if (connections.load() >= limits.max_connections + int32_t(limits.max_unauthenticated)) {
        // Over the cap: a short 503 written without waiting (it fits any socket buffer), then closed.
        ++refused_connections;
        const std::string bytes = serialize(error_reply(503, "too many connections (at most " +
                                                                 std::to_string(limits.max_connections +
                                                                                int32_t(limits.max_unauthenticated)) + ")",
                                                        "too_many_connections"),
                                            false, false);
        beast::error_code ignored;
        socket.non_blocking(true, ignored);
        socket.write_some(asio::buffer(bytes), ignored);
        socket.close(ignored);
      } else {
        // A stream is many small writes (one SSE event per token): with Nagle's algorithm a write waits for
        // the ACK of the previous one, so tokens would reach the client in bursts (inter-token latency).
        beast::error_code ignored;
        socket.set_option(tcp::no_delay(true), ignored);
        std::make_shared<Session>(std::move(socket), *this)->start();
      }
    }
    accept();
  });
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<HttpServer>> HttpServer::listen(const std::string& host, uint16_t port, HttpLimits limits,
                                                       HttpHandler handler, int io_threads, HttpAuthorizer authorize,
                                                       std::optional<ServerTls> tls) {
  auto impl = std::make_unique<Impl>();
  if (tls) {
    NetResult<std::unique_ptr<asio::ssl::context>> ctx = tls_server_context(*tls);
    if (!ctx) return Status::error(ctx.error().message);
    impl->tls = std::move(*ctx);
  }
  if (limits.max_header_bytes > kMaxHeaderBytesCeiling || limits.max_header_bytes < 1024) {
    return Status::error("the header limit must be 1 KiB to " + std::to_string(kMaxHeaderBytesCeiling) + " bytes, not " +
                         std::to_string(limits.max_header_bytes));
  }
  const size_t cap = size_t(std::max<int32_t>(limits.max_connections, 1));
  const size_t per_address = std::max<size_t>(std::min(limits.max_per_address, cap), 1);
  limits.max_unauthenticated_per_address = std::max<size_t>(std::min(limits.max_unauthenticated_per_address, per_address), 1);
  impl->log = [](const std::string& line) { std::fprintf(stderr, "essaim http: %s\n", line.c_str()); };
  impl->admission = std::make_unique<Admission>(
      AdmissionLimits{.max_unauthenticated = limits.max_unauthenticated,
                      .max_unauthenticated_per_address = limits.max_unauthenticated_per_address,
                      .max_authenticated = cap,
                      .max_authenticated_per_address = per_address},
      impl->log);
  impl->authorize = authorize ? std::move(authorize) : api_key_authorizer(limits.api_key);
  impl->limits = std::move(limits);
  impl->handler = std::move(handler);
  beast::error_code ec;
  const asio::ip::address address = asio::ip::make_address(host, ec);
  if (ec) return Status::error("--host '" + host + "' is not an IP address (" + ec.message() + ")");
  const tcp::endpoint endpoint(address, port);
  impl->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(endpoint, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Status::error("cannot listen on " + host + ":" + std::to_string(port) + ": " + ec.message());
  impl->accept();
  for (int i = 0; i < std::max(1, io_threads); ++i) impl->threads.emplace_back([i = impl.get()] { i->run(); });
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

uint16_t HttpServer::port() const {
  beast::error_code ec;
  return impl_->acceptor.local_endpoint(ec).port();
}

void HttpServer::Impl::remember(const std::shared_ptr<Session>& s) {
  std::lock_guard<std::mutex> lock(sessions_mu);
  if (sessions.size() >= 256 && sessions.size() % 256 == 0)
    std::erase_if(sessions, [](const std::weak_ptr<Session>& w) { return w.expired(); });
  sessions.push_back(s);
}

void HttpServer::stop() {
  std::call_once(impl_->stopped, [this] {
    asio::post(impl_->ioc, [this] {
      beast::error_code ignored;
      impl_->acceptor.close(ignored);
    });
    impl_->ioc.stop();
    for (std::thread& t : impl_->threads) t.join();
    std::lock_guard<std::mutex> lock(impl_->sessions_mu);
    for (const std::weak_ptr<Session>& w : impl_->sessions)
      if (std::shared_ptr<Session> s = w.lock()) s->abandon();
    impl_->sessions.clear();
  });
}

HttpServer::~HttpServer() { stop(); }

HttpServerStats HttpServer::stats() const {
  return {.connections = impl_->connections.load(), .connections_total = impl_->connections_total.load(),
          .refused_connections = impl_->refused_connections.load(), .refused_requests = impl_->refused_requests.load(),
          .disconnects = impl_->disconnects.load(), .refused_credentials = impl_->refused_credentials.load(),
          .exceptions = impl_->exceptions.load(), .admission = impl_->admission->counters()};
}

}  // namespace essaim::net
