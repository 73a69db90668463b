#include "net/websocket.h"

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>
#include <charconv>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "net/tls.h"
#include "net/ws_error.h"

namespace essaim::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
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

NetError ws_error(const beast::error_code& ec, const std::string& who, const char* what) {
  if (ec == beast::error::timeout) return net_error(NetErrorKind::TIMEOUT, who + ": " + what + " timed out");
  if (ec == websocket::error::closed || ec == asio::error::eof || ec == asio::error::connection_reset ||
      ec == asio::error::broken_pipe || ec == asio::error::operation_aborted) {
    return net_error(NetErrorKind::CLOSED, who + ": " + what + ": " + ec.message());
  }
  if (ec == websocket::error::message_too_big) return net_error(NetErrorKind::TOO_LARGE, who + ": " + what + ": " + ec.message());
  if (ec.category() == beast::error_code(websocket::error::closed).category()) {
    return net_error(NetErrorKind::PROTOCOL, who + ": " + what + ": " + ec.message());
  }
  return net_error(NetErrorKind::IO, who + ": " + what + ": " + ec.message());
}

std::string ws_endpoint_text(const tcp::endpoint& ep) {
  std::string a = ep.address().to_string();
  return (ep.address().is_v6() ? "[" + a + "]" : a) + ":" + std::to_string(ep.port());
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

using PlainWs = websocket::stream<beast::tcp_stream>;
using TlsWs = websocket::stream<beast::ssl_stream<beast::tcp_stream>>;

// The stream over either layer. Every asynchronous operation runs on the runner's one thread; the blocking
// calls wait for them under mu_. pending_ counts operations not yet completed, so the destructor can wait
// until nothing refers to the stream before stopping the thread.
template <class Ws>
class WsImpl final : public WsStream {
  static constexpr bool kTls = std::is_same_v<Ws, TlsWs>;

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
    ws_.read_message_max(limits_.max_message_bytes);
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
    if (write_ec_) return ws_error(write_ec_, peer_, "write");
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
  std::string peer_name() const override { return peer_; }
  std::string peer_address() const override { return address_.empty() ? peer_ : address_; }

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
    return ws_error(read_ec_, peer_, "read");
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

 private:
  std::unique_ptr<Runner> runner_;
  std::shared_ptr<ssl::context> ctx_;
  WsLimits limits_;
  Ws ws_;
  asio::steady_timer timer_;
  beast::flat_buffer rbuf_;
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
  if (ec) return ws_error(ec, url.text(), "connect");
  beast::error_code ignored;
  lowest.socket().set_option(tcp::no_delay(true), ignored);
  if constexpr (std::is_same_v<typename std::remove_reference_t<decltype(s->ws())>, TlsWs>) {
    auto& tls = s->ws().next_layer();
    auto check = std::make_shared<TlsPeerCheck>();
    if (NetStatus set = tls_client_setup(tls, url.host, check); !set) return set.error();
    ec = s->run_blocking([&](auto done) { tls.async_handshake(ssl::stream_base::client, done); });
    if (ec) return tls_handshake_error(url.text(), ec, *check);
  }
  ec = s->run_blocking([&](auto done) { s->ws().async_handshake(url.host + ":" + std::to_string(url.port), url.path, done); });
  if (ec) return ws_error(ec, url.text(), "WebSocket upgrade");
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
  NetResult<std::shared_ptr<ssl::context>> ctx = tls_client_context(options.ca_file);
  if (!ctx) return ctx.error();
  return connect_as(std::make_unique<WsImpl<TlsWs>>(std::make_unique<Runner>(), *ctx, options.limits), url, eps, deadline);
}

}  // namespace essaim::net
