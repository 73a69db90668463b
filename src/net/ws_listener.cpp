#include "net/ws_listener.h"

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>

#include <atomic>
#include <deque>
#include <mutex>
#include <thread>

#include "net/http_feed.h"
#include "net/tls.h"
#include "net/ws_error.h"

namespace essaim::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
namespace websocket = beast::websocket;
using tcp = asio::ip::tcp;

namespace {

// The listener's TCP layer. Beast ends every closing (after close frames were exchanged, and after it has
// failed a read because the peer broke the protocol and sent it our 1002) with a "teardown", which for a
// server shuts the send side and then reads until the peer closes TCP (TLS: awaits its close_notify). A
// peer that breaks the protocol and stays silent held that read until Beast's idle-ping timer fired
// (idle_timeout / 2: 15 s at the relay), and only then did our read fail; the relay's partner learnt 15 s
// late. The server closes the connection itself instead, at once (RFC 6455 7.1.1: the server closes the
// TCP connection first). Beast finds these overloads by argument-dependent lookup; they are exact matches,
// so they win over its own for beast::basic_stream and ssl_stream.
class ServerTcpStream : public beast::tcp_stream {
 public:
  using beast::tcp_stream::tcp_stream;
};
using ServerPlainWs = websocket::stream<ServerTcpStream>;
using ServerTlsWs = websocket::stream<beast::ssl_stream<ServerTcpStream>>;

void close_now(ServerTcpStream& s) {
  beast::error_code ignored;
  s.socket().shutdown(tcp::socket::shutdown_both, ignored);
  s.socket().close(ignored);
}
[[maybe_unused]] void teardown(beast::role_type, ServerTcpStream& s, beast::error_code& ec) {
  close_now(s);
  ec = {};
}
template <class Handler>
void async_teardown(beast::role_type, ServerTcpStream& s, Handler&& handler) {
  close_now(s);
  asio::post(s.get_executor(), beast::bind_front_handler(std::forward<Handler>(handler), beast::error_code{}));
}
[[maybe_unused]] void teardown(beast::role_type, beast::ssl_stream<ServerTcpStream>& s, beast::error_code& ec) {
  close_now(beast::get_lowest_layer(s));
  ec = {};
}
template <class Handler>
void async_teardown(beast::role_type, beast::ssl_stream<ServerTcpStream>& s, Handler&& handler) {
  close_now(beast::get_lowest_layer(s));
  asio::post(s.get_executor(), beast::bind_front_handler(std::forward<Handler>(handler), beast::error_code{}));
}

// What stop() needs of every session, whatever its stream type.
class SessionBase : public WsSession {
 public:
  // The I/O threads are joined: drops every callback and queued message (and what they hold), closes.
  virtual void abandon() = 0;
};

}  // namespace

struct WsListener::Impl {
  // Declared before the io_context: sessions (destroyed with its pending handlers) use them.
  WsListenerOptions opts;
  WsSessionHandler on_session;
  std::unique_ptr<Admission> admission;
  std::unique_ptr<ssl::context> ctx;  // with TLS
  std::atomic<uint64_t> accepted_tcp{0}, upgraded{0}, http_requests{0}, handshake_failures{0}, refused_busy{0};
  std::atomic<int64_t> sockets{0};
  std::mutex sessions_mu;
  std::vector<std::weak_ptr<SessionBase>> sessions;  // every session started, for stop()
  std::once_flag stopped;

  asio::io_context ioc;
  tcp::acceptor acceptor{ioc};
  std::vector<std::thread> threads;
  std::unique_ptr<asio::thread_pool> blocking;  // WsSession::run_blocking

  void accept();
  void on_accepted(tcp::socket socket);
  void remember(const std::shared_ptr<SessionBase>& s);
  void log(const std::string& line) const {
    if (opts.log) opts.log(line);
  }
  // The I/O loop. Every callback is the listener's or its user's; this backstop keeps the process alive if
  // one still throws (the connection whose operation threw is dropped with it).
  void run() {
    for (;;) {
      try {
        ioc.run();
        return;
      } catch (const std::exception& e) {
        log(std::string("an I/O handler threw: ") + e.what());
      }
    }
  }
};

namespace {

template <class Ws>
class Session final : public SessionBase, public std::enable_shared_from_this<Session<Ws>> {
  static constexpr bool kTls = std::is_same_v<Ws, ServerTlsWs>;
  using std::enable_shared_from_this<Session<Ws>>::shared_from_this;

 public:
  Session(tcp::socket socket, WsListener::Impl& server, std::string peer)
      : server_(server), limits_(server.opts.limits), ws_(make_ws(std::move(socket))), peer_(std::move(peer)),
        timer_(ws_.get_executor()), write_timer_(ws_.get_executor()), close_timer_(ws_.get_executor()) {
    ++server_.sockets;
  }
  ~Session() override { --server_.sockets; }

  // Takes an admission ticket (which may evict the oldest unauthenticated connection), then, on the strand,
  // TLS, the HTTP request, and the upgrade or a plain answer.
  void begin(const std::string& address) {
    std::weak_ptr<Session> weak = shared_from_this();
    asio::any_io_executor ex = ws_.get_executor();
    // The eviction callback runs under the admission lock on another connection's thread: it only posts.
    ticket_ = server_.admission->admit(address, [weak, ex](const std::string& why) {
      asio::post(ex, [weak, why] {
        if (auto s = weak.lock()) s->evict(why);
      });
    });
    asio::post(ws_.get_executor(), [self = shared_from_this()] { self->handshake(); });
  }

  // ---- WsSession (any thread: each posts to the strand) ----
  void start(OnMessage on_message, OnEnd on_end, std::chrono::milliseconds first_message_timeout) override {
    on_strand([on_message = std::move(on_message), on_end = std::move(on_end), first_message_timeout](Session& s) mutable {
      s.on_message_ = std::move(on_message), s.on_end_ = std::move(on_end);
      if (first_message_timeout.count() > 0) s.arm_first_message_timer(first_message_timeout);
      s.start_read();
    });
  }
  void resume_reading() override {
    on_strand([](Session& s) {
      if (!s.paused_) return;
      s.paused_ = false;
      s.start_read();
    });
  }
  void send(std::vector<uint8_t> message, OnSent sent) override {
    on_strand([m = std::move(message), sent = std::move(sent)](Session& s) mutable { s.queue(std::move(m), std::move(sent)); });
  }
  void close_with(WsCloseCode code, std::string reason) override {
    on_strand([code, reason = std::move(reason)](Session& s) mutable {
      if (s.close_wanted_) return;
      s.close_wanted_ = true, s.close_code_ = code, s.close_reason_ = std::move(reason);
      if (!s.writing_ && s.out_.empty()) s.begin_close();
    });
  }
  uint16_t peer_close_code() const override { return peer_code_.load(); }
  std::optional<std::string> authenticate() override { return ticket_->authenticate(); }
  void run_after(std::chrono::milliseconds delay, std::function<void()> f) override {
    auto timer = std::make_shared<asio::steady_timer>(ws_.get_executor(), delay);
    timer->async_wait([self = shared_from_this(), timer, f = std::move(f)](beast::error_code ec) {
      if (!ec) f();
    });
  }
  void run_blocking(std::function<void()> job) override {
    asio::post(*server_.blocking, [self = shared_from_this(), job = std::move(job)] { job(); });
  }
  const std::string& peer_name() const override { return peer_; }
  const std::string& target() const override { return target_; }

  void abandon() override {
    on_message_ = nullptr, on_end_ = nullptr;
    out_.clear();
    shut_socket();
  }

 private:
  Ws make_ws(tcp::socket socket) {
    if constexpr (kTls) {
      return Ws(std::move(socket), *server_.ctx);
    } else {
      return Ws(std::move(socket));
    }
  }
  template <class F>
  void on_strand(F f) {
    asio::post(ws_.get_executor(), [self = shared_from_this(), f = std::move(f)]() mutable { f(*self); });
  }
  void shut_socket() {
    beast::error_code ignored;
    beast::get_lowest_layer(ws_).socket().shutdown(tcp::socket::shutdown_both, ignored);
    beast::get_lowest_layer(ws_).socket().close(ignored);
  }

  // Evicted by the admission layer while unauthenticated: 1013 once upgraded, else the socket closes.
  void evict(const std::string& why) {
    if (!upgraded_) return shut_socket();
    close_with(WsCloseCode::TRY_AGAIN_LATER, "closed to admit others: " + why);
  }

  // ---- The handshake ----
  void handshake() {
    beast::get_lowest_layer(ws_).expires_after(limits_.handshake_timeout);
    if constexpr (kTls) {
      ws_.next_layer().async_handshake(ssl::stream_base::server, [self = shared_from_this()](beast::error_code ec) {
        if (ec) return self->handshake_failed();
        self->read_request();
      });
    } else {
      read_request();
    }
  }

  // The request head through feed_http_request (net/http_feed.h), as every essaim HTTP listener reads one:
  // what Beast's parser throws is caught, and the buffer (capped at the header limit) bounds the head and
  // a chunked body's trailer.
  void read_request() {
    parser_.emplace();
    parser_->header_limit(uint32_t(server_.opts.max_header_bytes));
    parser_->body_limit(64 << 10);
    hbuf_.max_size(server_.opts.max_header_bytes);
    parse_request();
  }

  void parse_request() {
    const HttpFeed f = feed_http_request(*parser_, hbuf_, false);
    if (f.stop == HttpFeedStop::DONE) return on_request();
    if (f.stop == HttpFeedStop::ERROR) {
      if (f.ec == http::error::header_limit) return answer_http(431, "request header too large");
      if (f.ec == http::error::body_limit) return answer_http(413, "request body too large");
      return answer_http(400, "unreadable HTTP request: " + (f.thrown.empty() ? f.ec.message() : f.thrown));
    }
    if (http_buffer_full(hbuf_)) return answer_http(431, "request header (or trailer) too large");
    const size_t room = hbuf_.max_size() - hbuf_.size();
    ws_.next_layer().async_read_some(hbuf_.prepare(std::min<size_t>(room, 16 << 10)),
                                     [self = shared_from_this()](beast::error_code ec, size_t n) {
                                       self->hbuf_.commit(n);
                                       if (ec) return self->handshake_failed();
                                       self->parse_request();
                                     });
  }

  void on_request() {
    const auto& req = parser_->get();
    target_ = std::string(req.target());
    if (websocket::is_upgrade(req)) {
      ws_.async_accept(req, [self = shared_from_this()](beast::error_code ec) {
        if (ec) return self->handshake_failed();
        self->upgraded();
      });
      return;
    }
    HttpReply reply{.status = 404, .content_type = "text/plain", .body = "not found\n", .headers = {}};
    if (server_.opts.http) {
      HttpRequestView view{.method = std::string(req.method_string()), .target = target_, .body = req.body(),
                           .authorization = {}, .range = {}};
      try {
        reply = server_.opts.http(view);
      } catch (const std::exception&) {
        reply = HttpReply{.status = 500, .content_type = "text/plain", .body = "internal error\n", .headers = {}};
      }
    }
    http_response(reply);
  }

  void answer_http(int status, const std::string& text) {
    http_response(HttpReply{.status = status, .content_type = "text/plain", .body = text + "\n", .headers = {}});
  }

  void http_response(const HttpReply& reply) {
    auto res = std::make_shared<http::response<http::string_body>>(http::status(reply.status), 11);
    res->set(http::field::content_type, reply.content_type);
    res->set(http::field::connection, "close");
    for (const auto& [k, v] : reply.headers) res->set(k, v);
    res->body() = reply.body;
    res->prepare_payload();
    http::async_write(ws_.next_layer(), *res, [self = shared_from_this(), res](beast::error_code, size_t) {
      ++self->server_.http_requests;
      self->shut_socket();
    });
  }

  void handshake_failed() {
    ++server_.handshake_failures;
    shut_socket();
  }

  // Upgraded: Beast's own timeouts from now on (handshake_timeout for the close handshake, keep-alive
  // pings after idle/2, the connection closed after idle without any frame), then the user's handler.
  void upgraded() {
    beast::get_lowest_layer(ws_).expires_never();
    websocket::stream_base::timeout t{};
    t.handshake_timeout = limits_.handshake_timeout;
    t.idle_timeout = limits_.idle_timeout.count() > 0
                         ? std::chrono::duration_cast<std::chrono::steady_clock::duration>(limits_.idle_timeout)
                         : websocket::stream_base::none();
    t.keep_alive_pings = limits_.idle_timeout.count() > 0;
    ws_.set_option(t);
    // The first message is held to its own small limit (raised once it has arrived, in on_read).
    first_message_limited_ = limits_.first_message_max_bytes > 0;
    ws_.read_message_max(first_message_limited_ ? std::min(limits_.first_message_max_bytes, limits_.max_message_bytes)
                                                : limits_.max_message_bytes);
    ws_.binary(true);
    // Whole messages as one frame through a 64 KiB buffer rather than Beast's 4 KiB: fewer system calls per
    // message (the relay's throughput; see bench/relay_bench).
    ws_.auto_fragment(false);
    ws_.write_buffer_bytes(64 << 10);
    upgraded_ = true;
    ++server_.upgraded;
    server_.on_session(shared_from_this());
  }

  // ---- Reading ----
  void arm_first_message_timer(std::chrono::milliseconds after) {
    timer_.expires_after(after);
    timer_.async_wait([self = shared_from_this(), after](beast::error_code ec) {
      if (ec || self->got_first_) return;
      self->end_read(net_error(NetErrorKind::TIMEOUT, self->peer_ + ": no message within " +
                                                          std::to_string(after.count()) + " ms"));
    });
  }

  void start_read() {
    if (reading_ || read_ended_ || paused_) return;
    reading_ = true;
    ws_.async_read(rbuf_, [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    reading_ = false;
    if (read_ended_) return;
    if (ec) {
      const websocket::close_reason& r = ws_.reason();
      peer_code_ = r.code == websocket::close_code::none ? 0 : uint16_t(r.code);
      return end_read(ws_error(ec, peer_, "read"));
    }
    if (!ws_.got_binary()) {
      close_with(WsCloseCode::UNSUPPORTED, "binary messages only");
      return end_read(net_error(NetErrorKind::PROTOCOL, peer_ + " sent a text message"));
    }
    if (first_message_limited_) {
      first_message_limited_ = false;
      ws_.read_message_max(limits_.max_message_bytes);
    }
    got_first_ = true;
    timer_.cancel();
    const auto data = rbuf_.cdata();
    const uint8_t* p = static_cast<const uint8_t*>(data.data());
    std::vector<uint8_t> m(p, p + data.size());
    rbuf_.consume(rbuf_.size());
    if (!on_message_ || on_message_(std::move(m))) return start_read();
    paused_ = true;
  }

  void end_read(const NetError& why) {
    if (read_ended_) return;
    read_ended_ = true;
    timer_.cancel();
    OnEnd f = std::move(on_end_);
    on_end_ = nullptr, on_message_ = nullptr;
    if (f) f(why);
  }

  // ---- Writing ----
  void queue(std::vector<uint8_t> m, OnSent sent) {
    if (write_error_ || close_wanted_) {
      if (sent) sent(write_error_ ? *write_error_ : net_error(NetErrorKind::CLOSED, "connection to " + peer_ + " is closing"));
      return;
    }
    out_.push_back({std::move(m), std::move(sent)});
    write_next();
  }

  void write_next() {
    if (writing_ || write_error_) return;
    if (out_.empty()) {
      if (close_wanted_) begin_close();
      return;
    }
    writing_ = true;
    write_timer_.expires_after(server_.opts.write_stall);
    write_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec || !self->writing_) return;
      self->stalled_ = true;
      self->shut_socket();  // the write fails at once; the message may be half sent: the stream is unusable
    });
    ws_.async_write(asio::buffer(out_.front().bytes), [self = shared_from_this()](beast::error_code ec, size_t) {
      self->on_written(ec);
    });
  }

  void on_written(beast::error_code ec) {
    writing_ = false;
    write_timer_.cancel();
    if (ec || stalled_) {
      return fail_writes(stalled_ ? net_error(NetErrorKind::TIMEOUT, peer_ + " did not read one message within " +
                                                                          std::to_string(server_.opts.write_stall.count()) + " ms")
                                  : ws_error(ec, peer_, "write"));
    }
    Outgoing done = std::move(out_.front());
    out_.pop_front();
    if (done.sent) done.sent({});
    write_next();
  }

  // Every queued message fails with `why`, and so does every later send; the connection closes.
  void fail_writes(const NetError& why) {
    write_error_ = why;
    shut_socket();
    std::deque<Outgoing> failed;
    failed.swap(out_);
    for (Outgoing& o : failed) {
      if (o.sent) o.sent(why);
    }
  }

  void begin_close() {
    if (close_started_) return;
    close_started_ = true;
    close_timer_.expires_after(std::chrono::seconds(1));
    close_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (!ec) self->shut_socket();
    });
    if (!upgraded_ || !ws_.is_open() || write_error_) {  // not upgraded, or a close frame went either way already
      close_timer_.cancel();
      return shut_socket();
    }
    const std::string why = close_reason_.substr(0, 120);  // a close frame's payload is at most 125 bytes
    ws_.async_close(websocket::close_reason(websocket::close_code(uint16_t(close_code_)), why),
                    [self = shared_from_this()](beast::error_code) {
                      self->close_timer_.cancel();
                      self->shut_socket();
                    });
  }

  struct Outgoing {
    std::vector<uint8_t> bytes;
    OnSent sent;
  };

  WsListener::Impl& server_;
  const WsLimits limits_;
  Ws ws_;
  const std::string peer_;
  std::string target_;
  std::unique_ptr<Admission::Ticket> ticket_;  // released with the session
  std::atomic<uint16_t> peer_code_{0};
  // Strand only, from here on.
  asio::steady_timer timer_;        // the first message's deadline
  asio::steady_timer write_timer_;  // the write in flight's stall deadline
  asio::steady_timer close_timer_;  // the close handshake's backstop
  beast::flat_buffer hbuf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  beast::flat_buffer rbuf_;
  OnMessage on_message_;
  OnEnd on_end_;
  std::deque<Outgoing> out_;
  std::optional<NetError> write_error_;
  WsCloseCode close_code_ = WsCloseCode::NORMAL;
  std::string close_reason_;
  bool upgraded_ = false, first_message_limited_ = false, got_first_ = false;
  bool reading_ = false, paused_ = false, read_ended_ = false;
  bool writing_ = false, stalled_ = false;
  bool close_wanted_ = false, close_started_ = false;
};

}  // namespace

void WsListener::Impl::accept() {
  acceptor.async_accept(asio::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
    if (!ec) on_accepted(std::move(socket));
    accept();
  });
}

void WsListener::Impl::on_accepted(tcp::socket socket) {
  ++accepted_tcp;
  beast::error_code ignored;
  const tcp::endpoint remote = socket.remote_endpoint(ignored);
  // Sockets in all: the authenticated cap plus room for those still unauthenticated (evictable).
  if (sockets.load() >= int64_t(opts.admission.max_authenticated + opts.admission.max_unauthenticated)) {
    ++refused_busy;
    socket.close(ignored);
    return;
  }
  socket.set_option(tcp::no_delay(true), ignored);
  auto start = [&](auto session) {
    remember(session);
    session->begin(remote.address().to_string());
  };
  if (ctx) {
    start(std::make_shared<Session<ServerTlsWs>>(std::move(socket), *this, ws_endpoint_text(remote)));
  } else {
    start(std::make_shared<Session<ServerPlainWs>>(std::move(socket), *this, ws_endpoint_text(remote)));
  }
}

void WsListener::Impl::remember(const std::shared_ptr<SessionBase>& s) {
  std::lock_guard lk(sessions_mu);
  if (sessions.size() >= 256 && sessions.size() % 256 == 0)
    std::erase_if(sessions, [](const std::weak_ptr<SessionBase>& w) { return w.expired(); });
  sessions.push_back(s);
}

NetResult<std::unique_ptr<WsListener>> WsListener::listen(std::string_view host, uint16_t port, WsListenerOptions options,
                                                         WsSessionHandler on_session) {
  auto impl = std::make_unique<Impl>();
  impl->opts = std::move(options);
  impl->on_session = std::move(on_session);
  impl->admission = std::make_unique<Admission>(impl->opts.admission, impl->opts.log);
  beast::error_code ec;
  if (impl->opts.tls) {
    NetResult<std::unique_ptr<ssl::context>> ctx = tls_server_context(*impl->opts.tls);
    if (!ctx) return ctx.error();
    impl->ctx = std::move(*ctx);
  }
  auto addr = asio::ip::make_address(std::string(host), ec);
  if (ec) return net_error(NetErrorKind::IO, "'" + std::string(host) + "' is not an IP address: " + ec.message());
  const tcp::endpoint ep(addr, port);
  impl->acceptor.open(ep.protocol(), ec);
  if (!ec) impl->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(ep, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return net_error(NetErrorKind::IO, "cannot listen on " + ws_endpoint_text(ep) + ": " + ec.message());
  impl->blocking = std::make_unique<asio::thread_pool>(size_t(std::max(1, impl->opts.blocking_threads)));
  impl->accept();
  for (int i = 0; i < std::max(1, impl->opts.io_threads); ++i) impl->threads.emplace_back([i = impl.get()] { i->run(); });
  return std::unique_ptr<WsListener>(new WsListener(std::move(impl)));
}

WsListener::WsListener(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
WsListener::~WsListener() { stop(); }

uint16_t WsListener::port() const {
  beast::error_code ec;
  return impl_->acceptor.local_endpoint(ec).port();
}

void WsListener::stop() {
  std::call_once(impl_->stopped, [this] {
    impl_->ioc.stop();
    for (std::thread& t : impl_->threads) t.join();
    impl_->blocking->join();  // the jobs queued still run: they only post to the (stopped) I/O context
    beast::error_code ignored;
    impl_->acceptor.close(ignored);
    std::lock_guard lk(impl_->sessions_mu);
    for (const std::weak_ptr<SessionBase>& w : impl_->sessions)
      if (std::shared_ptr<SessionBase> s = w.lock()) s->abandon();
    impl_->sessions.clear();
  });
}

WsListenerStats WsListener::stats() const {
  return {.accepted_tcp = impl_->accepted_tcp.load(), .upgraded = impl_->upgraded.load(),
          .http_requests = impl_->http_requests.load(), .handshake_failures = impl_->handshake_failures.load(),
          .refused_busy = impl_->refused_busy.load(), .admission = impl_->admission->counters()};
}

}  // namespace essaim::net
