#include "net/websocket.h"

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>
#include <charconv>
#include <condition_variable>
#include <deque>
#include <future>
#include <list>
#include <map>
#include <mutex>
#include <thread>

#include "net/http_feed.h"

namespace essaim::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
namespace websocket = beast::websocket;
using tcp = asio::ip::tcp;

// ---- URLs -------------------------------------------------------------------------------------------------

bool looks_like_ws_url(std::string_view t) { return t.starts_with("ws://") || t.starts_with("wss://"); }

std::string WsUrl::text() const {
  std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return std::string(tls ? "wss://" : "ws://") + h + ":" + std::to_string(port) + path;
}

NetResult<WsUrl> parse_ws_url(std::string_view text) {
  WsUrl u;
  std::string_view rest;
  if (text.starts_with("wss://")) {
    u.tls = true, rest = text.substr(6), u.port = 443;
  } else if (text.starts_with("ws://")) {
    rest = text.substr(5), u.port = 80;
  } else {
    return net_error(NetErrorKind::IO, "'" + std::string(text) + "' is not a ws:// or wss:// URL");
  }
  size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  if (slash != std::string_view::npos) u.path = std::string(rest.substr(slash));
  for (char c : u.path) {
    if (c <= ' ' || c == 0x7f) return net_error(NetErrorKind::IO, "the path of '" + std::string(text) + "' has a space or control character");
  }
  std::string_view host = authority, port_text;
  if (authority.starts_with("[")) {
    size_t close = authority.find(']');
    if (close == std::string_view::npos) return net_error(NetErrorKind::IO, "unclosed '[' in '" + std::string(text) + "'");
    host = authority.substr(1, close - 1);
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') return net_error(NetErrorKind::IO, "junk after ']' in '" + std::string(text) + "'");
      port_text = after.substr(1);
    }
  } else if (size_t colon = authority.rfind(':'); colon != std::string_view::npos) {
    host = authority.substr(0, colon);
    port_text = authority.substr(colon + 1);
  }
  if (host.empty()) return net_error(NetErrorKind::IO, "no host in '" + std::string(text) + "'");
  if (!port_text.empty() || authority.ends_with(":")) {
    unsigned p = 0;
    auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), p);
    if (ec != std::errc() || end != port_text.data() + port_text.size() || p == 0 || p > 65535) {
      return net_error(NetErrorKind::IO, "bad port '" + std::string(port_text) + "' in '" + std::string(text) + "'");
    }
    u.port = uint16_t(p);
  }
  u.host = std::string(host);
  return u;
}

namespace {

// One io_context and the thread that runs it.
struct Runner {
  asio::io_context ioc{1};
  asio::executor_work_guard<asio::io_context::executor_type> guard{ioc.get_executor()};
  std::thread thread;
  Runner() : thread([this] { ioc.run(); }) {}
  void stop() {
    guard.reset();
    ioc.stop();
    if (thread.joinable()) thread.join();
  }
  ~Runner() { stop(); }
};

NetError from_ec(const beast::error_code& ec, const std::string& who, const char* what) {
  if (ec == beast::error::timeout) return net_error(NetErrorKind::TIMEOUT, who + ": " + what + " timed out");
  if (ec == websocket::error::closed || ec == asio::error::eof || ec == asio::error::connection_reset ||
      ec == asio::error::broken_pipe || ec == asio::error::operation_aborted) {
    return net_error(NetErrorKind::CLOSED, who + ": " + what + ": " + ec.message());
  }
  if (ec.category() == beast::error_code(websocket::error::closed).category()) {
    return net_error(NetErrorKind::PROTOCOL, who + ": " + what + ": " + ec.message());
  }
  return net_error(NetErrorKind::IO, who + ": " + what + ": " + ec.message());
}

std::string endpoint_text(const tcp::endpoint& ep) {
  std::string a = ep.address().to_string();
  return (ep.address().is_v6() ? "[" + a + "]" : a) + ":" + std::to_string(ep.port());
}

using PlainWs = websocket::stream<beast::tcp_stream>;
using TlsWs = websocket::stream<beast::ssl_stream<beast::tcp_stream>>;

// The listener's TCP layer. Beast ends every closing (after close frames were exchanged, and after it has
// failed a read because the peer broke the protocol and sent it our 1002) with a "teardown", which for a
// server shuts the send side and then reads until the peer closes TCP (TLS: awaits its close_notify). A
// peer that breaks the protocol and stays silent holds that read until Beast's idle-ping timer fires
// (idle_timeout / 2: 15 s at the relay), and only then does our read fail; the relay's partner learnt 15 s
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

// The stream over either layer. Every asynchronous operation runs on the runner's one thread; the blocking
// calls wait for them under mu_. pending_ counts operations not yet completed, so the destructor can wait
// until nothing refers to the stream before stopping the thread.
template <class Ws>
class WsImpl final : public WsStream {
  static constexpr bool kTls = std::is_same_v<Ws, TlsWs> || std::is_same_v<Ws, ServerTlsWs>;

 public:
  // Client: the caller connects. Server: `socket` is accepted; serve_handshake() runs the upgrade.
  WsImpl(std::unique_ptr<Runner> runner, std::shared_ptr<ssl::context> ctx, WsLimits limits)
      : runner_(std::move(runner)), ctx_(std::move(ctx)), limits_(limits), ws_(make_ws()), timer_(runner_->ioc) {}

  ~WsImpl() override {
    close();
    std::unique_lock lk(mu_);
    // The forced socket close one second after close() ends every operation; the bound is a backstop.
    cv_.wait_for(lk, std::chrono::seconds(10), [&] { return pending_ == 0; });
    lk.unlock();
    runner_->stop();
  }

  asio::io_context& ioc() { return runner_->ioc; }
  Ws& ws() { return ws_; }
  void set_names(std::string peer, std::string address, std::string target) {
    peer_ = std::move(peer), address_ = std::move(address), target_ = std::move(target);
  }

  // After the upgrade (either side): options, then the read loop.
  void start_session() {
    beast::get_lowest_layer(ws_).expires_never();
    websocket::stream_base::timeout t{};
    t.handshake_timeout = limits_.handshake_timeout;
    t.idle_timeout = limits_.idle_timeout.count() > 0 ? std::chrono::duration_cast<std::chrono::steady_clock::duration>(limits_.idle_timeout)
                                                      : websocket::stream_base::none();
    t.keep_alive_pings = limits_.idle_timeout.count() > 0;
    ws_.set_option(t);
    // A server's first message is held to its own small limit (raised once it has arrived, in on_read).
    first_message_limited_ = opts_ != nullptr && limits_.first_message_max_bytes > 0;
    ws_.read_message_max(first_message_limited_ ? std::min(limits_.first_message_max_bytes, limits_.max_message_bytes)
                                                : limits_.max_message_bytes);
    ws_.binary(true);
    // Whole messages as one frame, masked (client side) through a 64 KiB buffer rather than Beast's 4 KiB:
    // fewer system calls per message (the relay's throughput; see bench/relay_bench).
    ws_.auto_fragment(false);
    ws_.write_buffer_bytes(64 << 10);
    {
      std::lock_guard lk(mu_);
      upgraded_ = true;
    }
    asio::post(ioc(), [this] { start_read(); });
  }

  // Runs `op(done)` on the I/O thread and waits for done(ec). The caller has set the lowest layer's expiry,
  // so this always returns.
  template <class Op>
  beast::error_code run_blocking(Op op) {
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
    beast::error_code result;
    asio::post(ioc(), [&] {
      op([&](beast::error_code ec) {
        std::lock_guard lk(m);
        result = ec, done = true;
        cv.notify_all();
      });
    });
    std::unique_lock lk(m);
    cv.wait(lk, [&] { return done; });
    return result;
  }

  // ---- ByteStream ----
  NetResult<size_t> read_some(std::span<uint8_t> buf, Deadline deadline) override {
    if (buf.empty()) return size_t(0);
    std::unique_lock lk(mu_);
    NetStatus ready = wait_readable(lk, deadline);
    if (!ready) return ready.error();
    std::vector<uint8_t>& front = inbox_.front();
    size_t n = std::min(buf.size(), front.size() - front_pos_);
    std::memcpy(buf.data(), front.data() + front_pos_, n);
    front_pos_ += n;
    if (front_pos_ == front.size()) pop_front_locked(front.size());
    return n;
  }

  NetResult<std::vector<uint8_t>> read_message(Deadline deadline) override {
    std::unique_lock lk(mu_);
    NetStatus ready = wait_readable(lk, deadline);
    if (!ready) return ready.error();
    const size_t size = inbox_.front().size();
    std::vector<uint8_t> m = std::move(inbox_.front());
    if (front_pos_ != 0) m.erase(m.begin(), m.begin() + ptrdiff_t(front_pos_));
    pop_front_locked(size);
    return m;
  }

  NetStatus write_all(std::span<const uint8_t> bytes, Deadline deadline) override { return write_message(bytes, deadline); }

  NetStatus write_message(std::span<const uint8_t> bytes, Deadline deadline) override {
    std::unique_lock lk(mu_);
    if (closed_ || write_broken_) return net_error(NetErrorKind::CLOSED, "connection to " + peer_ + " is closed");
    if (bytes.size() > limits_.max_message_bytes) {
      return net_error(NetErrorKind::TOO_LARGE, std::to_string(bytes.size()) + "-byte message over the limit");
    }
    write_done_ = false;
    ++pending_;
    lk.unlock();
    asio::post(ioc(), [this, bytes] {
      ws_.async_write(asio::buffer(bytes.data(), bytes.size()), [this](beast::error_code ec, size_t) {
        std::lock_guard g(mu_);
        write_done_ = true, write_ec_ = ec, --pending_;
        if (ec) write_broken_ = true;
        cv_.notify_all();
      });
    });
    lk.lock();
    if (!cv_.wait_until(lk, deadline, [&] { return write_done_ || closed_; })) {
      write_broken_ = true;
      lk.unlock();
      force_close();  // the message may be half sent: the stream is unusable, and the span must be released
      lk.lock();
      cv_.wait(lk, [&] { return write_done_; });
      return net_error(NetErrorKind::TIMEOUT, peer_ + " did not read before the deadline");
    }
    // close() from another thread: wait for the operation to end (the forced close bounds it) before the
    // caller's buffer may go away.
    cv_.wait(lk, [&] { return write_done_; });
    if (write_ec_) return from_ec(write_ec_, peer_, "write");
    if (closed_ && write_ec_) return net_error(NetErrorKind::CLOSED, "connection to " + peer_ + " was closed");
    return {};
  }

  void close() override { close_with(WsCloseCode::NORMAL, ""); }

  void close_with(WsCloseCode code, std::string_view reason) override {
    {
      std::lock_guard lk(mu_);
      if (close_started_) return;
      close_started_ = true, closed_ = true;
      pending_ += 2;  // the close and its backstop timer
      cv_.notify_all();
    }
    std::string why(reason.substr(0, 120));  // a close frame's payload is at most 125 bytes
    asio::post(ioc(), [this, code, why] {
      timer_.expires_after(std::chrono::seconds(1));
      timer_.async_wait([this](beast::error_code) {
        shut_socket();
        done_one();
      });
      bool up;
      {
        std::lock_guard lk(mu_);
        up = upgraded_;
      }
      if (!up || !ws_.is_open()) {  // not upgraded, or a close frame went either way already
        shut_socket();
        timer_.cancel();
        done_one();
        return;
      }
      ws_.async_close(websocket::close_reason(websocket::close_code(uint16_t(code)), why), [this](beast::error_code) {
        shut_socket();
        timer_.cancel();
        done_one();
      });
    });
  }

  uint16_t peer_close_code() const override {
    std::lock_guard lk(mu_);
    return peer_code_;
  }
  std::string peer_close_reason() const override {
    std::lock_guard lk(mu_);
    return peer_reason_;
  }
  std::string target() const override { return target_; }
  std::optional<std::string> authenticate() override { return ticket_ ? ticket_->authenticate() : std::nullopt; }
  // The listener's admission ticket, taken at accept; `evict` closes this stream.
  void admit(std::shared_ptr<Admission> admission, const std::string& address) {
    admission_ = std::move(admission);
    ticket_ = admission_->admit(address, [this](const std::string& why) {
      close_with(WsCloseCode::TRY_AGAIN_LATER, "closed to admit others: " + why);
    });
  }
  std::string peer_name() const override { return peer_; }
  std::string peer_address() const override { return address_.empty() ? peer_ : address_; }

  // ---- server side: TLS, the HTTP request, then the upgrade or a plain answer. on_done(true) once
  // upgraded (the read loop runs), on_done(false) when the connection is finished (answered or failed).
  void serve_handshake(const WsListenerOptions& opts, std::function<void(bool)> on_done) {
    opts_ = &opts;
    on_done_ = std::move(on_done);
    {
      std::lock_guard lk(mu_);
      ++pending_;
    }
    asio::post(ioc(), [this] {
      beast::get_lowest_layer(ws_).expires_after(limits_.handshake_timeout);
      if constexpr (kTls) {
        ws_.next_layer().async_handshake(ssl::stream_base::server, [this](beast::error_code ec) {
          if (ec) return finish_handshake(false);
          read_request();
        });
      } else {
        read_request();
      }
    });
  }

 private:
  Ws make_ws() {
    if constexpr (kTls) {
      return Ws(runner_->ioc, *ctx_);
    } else {
      return Ws(runner_->ioc);
    }
  }

  void shut_socket() {
    beast::error_code ignored;
    beast::get_lowest_layer(ws_).socket().shutdown(tcp::socket::shutdown_both, ignored);
    beast::get_lowest_layer(ws_).socket().close(ignored);
  }
  void done_one() {
    std::lock_guard lk(mu_);
    --pending_;
    cv_.notify_all();
  }
  void force_close() {
    asio::post(ioc(), [this] { shut_socket(); });
  }

  NetStatus wait_readable(std::unique_lock<std::mutex>& lk, Deadline deadline) {
    auto ready = [&] { return !inbox_.empty() || read_ended_ || closed_; };
    if (!cv_.wait_until(lk, deadline, ready)) {
      return net_error(NetErrorKind::TIMEOUT, "no data from " + peer_ + " before the deadline");
    }
    if (closed_) return net_error(NetErrorKind::CLOSED, "connection to " + peer_ + " was closed locally");
    if (!inbox_.empty()) return {};
    if (read_ec_ == websocket::error::closed || read_ec_ == asio::error::eof) {
      return net_error(NetErrorKind::CLOSED, peer_ + " closed the connection" +
                                                 (peer_code_ ? " (code " + std::to_string(peer_code_) + (peer_reason_.empty() ? "" : ": " + peer_reason_) + ")" : ""));
    }
    if (read_ec_ == websocket::error::message_too_big) {
      return net_error(NetErrorKind::PROTOCOL, peer_ + " sent a message over the " + std::to_string(limits_.max_message_bytes) + "-byte limit");
    }
    return from_ec(read_ec_, peer_, "read");
  }

  void pop_front_locked(size_t front_size) {
    inbox_bytes_ -= front_size;  // (the front may have been moved from already)
    inbox_.pop_front();
    front_pos_ = 0;
    if (!reading_ && !read_ended_ && inbox_bytes_ < limits_.read_ahead_bytes) {
      ++pending_;
      asio::post(ioc(), [this] {
        done_one();
        start_read();
      });
    }
  }

  // On the I/O thread.
  void start_read() {
    std::lock_guard lk(mu_);
    if (reading_ || read_ended_ || inbox_bytes_ >= limits_.read_ahead_bytes) return;
    reading_ = true;
    ++pending_;
    ws_.async_read(rbuf_, [this](beast::error_code ec, size_t) { on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    bool text = !ec && !ws_.got_binary();
    // The 1003 is claimed before any reader wakes: a reader told of the failed read may close the stream
    // itself (with its own code), and the first close wins.
    if (text) close_with(WsCloseCode::UNSUPPORTED, "binary messages only");
    {
      std::lock_guard lk(mu_);
      reading_ = false;
      --pending_;
      if (ec || text) {
        read_ended_ = true;
        read_ec_ = text ? beast::error_code(websocket::error::bad_data_frame) : ec;
        peer_code_ = ws_.reason().code == websocket::close_code::none ? 0 : uint16_t(ws_.reason().code);
        peer_reason_ = std::string(ws_.reason().reason.c_str());
        cv_.notify_all();
      } else {
        if (first_message_limited_) {
          first_message_limited_ = false;
          ws_.read_message_max(limits_.max_message_bytes);
        }
        auto data = rbuf_.cdata();
        const uint8_t* p = static_cast<const uint8_t*>(data.data());
        inbox_.emplace_back(p, p + data.size());
        inbox_bytes_ += data.size();
        rbuf_.consume(rbuf_.size());
        cv_.notify_all();
      }
    }
    if (!ec && !text) start_read();
  }

  // The request head through feed_http_request (net/http_feed.h), as every essaim HTTP listener reads one:
  // what Beast's parser throws is caught, and the buffer (capped at the header limit) bounds the head and
  // a chunked body's trailer.
  void read_request() {
    parser_.emplace();
    parser_->header_limit(uint32_t(opts_->max_header_bytes));
    parser_->body_limit(64 << 10);
    hbuf_.max_size(opts_->max_header_bytes);
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
    ws_.next_layer().async_read_some(hbuf_.prepare(std::min<size_t>(room, 16 << 10)), [this](beast::error_code ec, size_t n) {
      hbuf_.commit(n);
      if (ec) return finish_handshake(false);
      parse_request();
    });
  }

  void on_request() {
    const auto& req = parser_->get();
    target_ = std::string(req.target());
    if (websocket::is_upgrade(req)) {
      ws_.async_accept(req, [this](beast::error_code ec2) {
        if (ec2) return finish_handshake(false);
        start_session();
        finish_handshake(true);
      });
      return;
    }
    HttpReply reply{.status = 404, .content_type = "text/plain", .body = "not found\n"};
    if (opts_->http) {
      HttpRequestView view{.method = std::string(req.method_string()), .target = target_, .body = req.body(), .authorization = {}};
      try {
        reply = opts_->http(view);
      } catch (const std::exception&) {
        reply = HttpReply{.status = 500, .content_type = "text/plain", .body = "internal error\n"};
      }
    }
    http_response(reply);
  }

  void answer_http(int status, const std::string& text) {
    http_response(HttpReply{.status = status, .content_type = "text/plain", .body = text + "\n"});
  }

  void http_response(const HttpReply& reply) {
    auto res = std::make_shared<http::response<http::string_body>>(http::status(reply.status), 11);
    res->set(http::field::content_type, reply.content_type);
    res->set(http::field::connection, "close");
    for (const auto& [k, v] : reply.headers) res->set(k, v);
    res->body() = reply.body;
    res->prepare_payload();
    http_answered_ = true;
    http::async_write(ws_.next_layer(), *res, [this, res](beast::error_code, size_t) { finish_handshake(false); });
  }

  void finish_handshake(bool upgraded) {
    if (!upgraded) shut_socket();
    done_one();
    on_done_(upgraded);
  }

 public:
  bool http_answered_ = false;

 private:
  std::unique_ptr<Runner> runner_;
  std::shared_ptr<ssl::context> ctx_;
  WsLimits limits_;
  Ws ws_;
  asio::steady_timer timer_;
  beast::flat_buffer rbuf_;
  // Server handshake state (I/O thread only).
  const WsListenerOptions* opts_ = nullptr;
  std::function<void(bool)> on_done_;
  beast::flat_buffer hbuf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::string peer_, address_, target_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  int pending_ = 0;
  bool upgraded_ = false, closed_ = false, close_started_ = false;
  bool reading_ = false, read_ended_ = false;
  beast::error_code read_ec_;
  uint16_t peer_code_ = 0;
  std::string peer_reason_;
  std::deque<std::vector<uint8_t>> inbox_;
  size_t inbox_bytes_ = 0, front_pos_ = 0;
  bool write_done_ = true, write_broken_ = false;
  beast::error_code write_ec_;
  bool first_message_limited_ = false;  // I/O thread only
  // Last, so destroyed first: an eviction (on another connection's thread) may call close_with() until then.
  std::shared_ptr<Admission> admission_;
  std::unique_ptr<Admission::Ticket> ticket_;
};

template <class Impl>
NetResult<std::unique_ptr<WsStream>> connect_as(std::unique_ptr<Impl> s, const WsUrl& url, const tcp::resolver::results_type& eps,
                                                 Deadline deadline) {
  auto& lowest = beast::get_lowest_layer(s->ws());
  lowest.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::max(Deadline::duration(0), deadline - Clock::now())));
  tcp::endpoint connected;
  beast::error_code ec = s->run_blocking([&](auto done) {
    lowest.async_connect(eps, [&, done](beast::error_code e, const tcp::endpoint& ep) {
      connected = ep;
      done(e);
    });
  });
  if (ec) return from_ec(ec, url.text(), "connect");
  beast::error_code ignored;
  lowest.socket().set_option(tcp::no_delay(true), ignored);
  if constexpr (std::is_same_v<typename std::remove_reference_t<decltype(s->ws())>, TlsWs>) {
    auto& tls = s->ws().next_layer();
    if (!SSL_set_tlsext_host_name(tls.native_handle(), url.host.c_str())) {
      return net_error(NetErrorKind::IO, url.text() + ": cannot set the TLS server name");
    }
    tls.set_verify_mode(ssl::verify_peer);
    tls.set_verify_callback(ssl::host_name_verification(url.host));
    ec = s->run_blocking([&](auto done) { tls.async_handshake(ssl::stream_base::client, done); });
    if (ec) return net_error(NetErrorKind::IO, url.text() + ": TLS handshake: " + ec.message());
  }
  ec = s->run_blocking([&](auto done) { s->ws().async_handshake(url.host + ":" + std::to_string(url.port), url.path, done); });
  if (ec) return from_ec(ec, url.text(), "WebSocket upgrade");
  s->set_names(url.text(), connected.address().to_string(), url.path);
  s->start_session();
  return std::unique_ptr<WsStream>(std::move(s));
}

}  // namespace

NetResult<std::unique_ptr<WsStream>> ws_connect(const WsUrl& url, const WsClientOptions& options, Deadline deadline) {
  tcp::resolver::results_type eps;
  {
    asio::io_context ioc;
    tcp::resolver resolver(ioc);
    beast::error_code ec;
    eps = resolver.resolve(url.host, std::to_string(url.port), ec);
    if (ec) return net_error(NetErrorKind::IO, "cannot resolve " + url.host + ": " + ec.message());
  }
  if (!url.tls) return connect_as(std::make_unique<WsImpl<PlainWs>>(std::make_unique<Runner>(), nullptr, options.limits), url, eps, deadline);
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_client);
  beast::error_code ec;
  ctx->set_default_verify_paths(ec);  // OpenSSL's defaults, which read SSL_CERT_FILE / SSL_CERT_DIR
  if (ec) return net_error(NetErrorKind::IO, "cannot load the system trust store: " + ec.message());
  if (!options.ca_file.empty()) {
    ctx->load_verify_file(options.ca_file, ec);
    if (ec) return net_error(NetErrorKind::IO, "cannot load CA file " + options.ca_file + ": " + ec.message());
  }
  return connect_as(std::make_unique<WsImpl<TlsWs>>(std::make_unique<Runner>(), ctx, options.limits), url, eps, deadline);
}

// ---- WsListener -------------------------------------------------------------------------------------------

struct WsListener::Impl : std::enable_shared_from_this<WsListener::Impl> {
  WsListenerOptions opts;
  std::shared_ptr<Admission> admission;  // shared with every stream holding one of its tickets
  std::shared_ptr<ssl::context> ctx;
  Runner runner;  // the accept loop, and where finished handshakes are destroyed
  tcp::acceptor acceptor{runner.ioc};
  uint16_t port = 0;

  std::mutex mu;
  std::condition_variable cv;
  bool closed = false;
  uint64_t next_id = 0;
  std::map<uint64_t, std::unique_ptr<WsStream>> handshaking;  // guarded by mu
  std::deque<std::unique_ptr<ByteStream>> ready;              // guarded by mu
  WsListenerStats stats;                                      // guarded by mu

  void accept_next() {
    acceptor.async_accept([self = shared_from_this()](beast::error_code ec, tcp::socket sock) {
      if (ec == asio::error::operation_aborted || !self->acceptor.is_open()) return;
      if (!ec) self->on_accepted(std::move(sock));
      self->accept_next();
    });
  }

  void on_accepted(tcp::socket sock) {
    beast::error_code ignored;
    tcp::endpoint remote = sock.remote_endpoint(ignored);
    std::unique_lock lk(mu);
    ++stats.accepted_tcp;
    if (closed) {
      ++stats.refused_busy;
      sock.close(ignored);
      return;
    }
    const uint64_t id = next_id++;
    lk.unlock();
    sock.set_option(tcp::no_delay(true), ignored);
    const auto proto = remote.protocol();
    const int fd = sock.release(ignored);
    auto start = [&](auto s) {
      beast::error_code e;
      beast::get_lowest_layer(s->ws()).socket().assign(proto, fd, e);
      s->set_names(endpoint_text(remote), remote.address().to_string(), "");
      s->admit(admission, remote.address().to_string());  // may evict the oldest unauthenticated connection
      auto* raw = s.get();
      std::weak_ptr<Impl> weak = weak_from_this();
      {
        std::lock_guard g(mu);
        handshaking.emplace(id, std::move(s));
      }
      raw->serve_handshake(opts, [weak, id, raw](bool upgraded) {
        std::shared_ptr<Impl> self = weak.lock();
        if (!self) return;
        // Not here: this runs on the stream's own thread, which its destructor joins.
        asio::post(self->runner.ioc, [self, id, upgraded, answered = raw->http_answered_] { self->finish(id, upgraded, answered); });
      });
    };
    if (ctx) {
      start(std::make_unique<WsImpl<ServerTlsWs>>(std::make_unique<Runner>(), ctx, opts.limits));
    } else {
      start(std::make_unique<WsImpl<ServerPlainWs>>(std::make_unique<Runner>(), nullptr, opts.limits));
    }
  }

  void finish(uint64_t id, bool upgraded, bool answered) {
    std::unique_ptr<WsStream> s;
    std::unique_lock lk(mu);
    auto it = handshaking.find(id);
    if (it == handshaking.end()) return;
    s = std::move(it->second);
    handshaking.erase(it);
    if (upgraded && !closed) {
      ++stats.upgraded;
      ready.push_back(std::move(s));
      cv.notify_all();
      return;
    }
    if (answered) {
      ++stats.http_requests;
    } else if (!upgraded) {
      ++stats.handshake_failures;
    }
    lk.unlock();
    s.reset();
  }
};

NetResult<std::unique_ptr<WsListener>> WsListener::listen(std::string_view host, uint16_t port, WsListenerOptions options) {
  auto impl = std::make_shared<Impl>();
  impl->opts = std::move(options);
  impl->admission = std::make_shared<Admission>(impl->opts.admission, impl->opts.log);
  beast::error_code ec;
  if (impl->opts.tls) {
    impl->ctx = std::make_shared<ssl::context>(ssl::context::tls_server);
    impl->ctx->use_certificate_chain_file(impl->opts.tls->cert_file, ec);
    if (ec) return net_error(NetErrorKind::IO, "cannot load certificate " + impl->opts.tls->cert_file + ": " + ec.message());
    impl->ctx->use_private_key_file(impl->opts.tls->key_file, ssl::context::pem, ec);
    if (ec) return net_error(NetErrorKind::IO, "cannot load private key " + impl->opts.tls->key_file + ": " + ec.message());
  }
  auto addr = asio::ip::make_address(std::string(host), ec);
  if (ec) return net_error(NetErrorKind::IO, "'" + std::string(host) + "' is not an IP address: " + ec.message());
  tcp::endpoint ep(addr, port);
  impl->acceptor.open(ep.protocol(), ec);
  if (!ec) impl->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(ep, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return net_error(NetErrorKind::IO, "cannot listen on " + endpoint_text(ep) + ": " + ec.message());
  impl->port = impl->acceptor.local_endpoint().port();
  asio::post(impl->runner.ioc, [impl] { impl->accept_next(); });
  return std::unique_ptr<WsListener>(new WsListener(std::move(impl)));
}

WsListener::WsListener(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

WsListener::~WsListener() {
  close();
  // The streams still in their handshake first: destroying one joins its thread, so none of their
  // callbacks (which hold the Impl for a moment) is left running; then the accept thread.
  std::map<uint64_t, std::unique_ptr<WsStream>> handshaking;
  {
    std::lock_guard lk(impl_->mu);
    handshaking.swap(impl_->handshaking);
  }
  handshaking.clear();
  impl_->runner.stop();
  // Run what was still queued (finish() calls for streams gone already): they hold the Impl.
  impl_->runner.ioc.restart();
  impl_->runner.ioc.poll();
  std::lock_guard lk(impl_->mu);
  impl_->ready.clear();
}

uint16_t WsListener::port() const { return impl_->port; }

NetResult<std::unique_ptr<ByteStream>> WsListener::accept(Deadline deadline) {
  std::unique_lock lk(impl_->mu);
  if (!impl_->cv.wait_until(lk, deadline, [&] { return impl_->closed || !impl_->ready.empty(); })) {
    return net_error(NetErrorKind::TIMEOUT, "no connection before the deadline");
  }
  if (impl_->closed) return net_error(NetErrorKind::CLOSED, "the listener was closed");
  std::unique_ptr<ByteStream> s = std::move(impl_->ready.front());
  impl_->ready.pop_front();
  return s;
}

void WsListener::close() {
  {
    std::lock_guard lk(impl_->mu);
    if (impl_->closed) return;
    impl_->closed = true;
    impl_->cv.notify_all();
  }
  std::promise<void> done;
  asio::post(impl_->runner.ioc, [&] {
    beast::error_code ignored;
    impl_->acceptor.close(ignored);
    done.set_value();
  });
  done.get_future().wait_for(std::chrono::seconds(5));
}

WsListenerStats WsListener::stats() const {
  std::lock_guard lk(impl_->mu);
  WsListenerStats s = impl_->stats;
  s.admission = impl_->admission->counters();
  return s;
}

}  // namespace essaim::net
