#include "net/tcp.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstring>

namespace essaim::net {

namespace asio = boost::asio;
using asio::ip::tcp;

namespace {

int poll_timeout_ms(Deadline deadline) {
  if (deadline == kNoDeadline) return -1;
  Deadline now = Clock::now();
  if (deadline <= now) return 0;
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
  return ms > INT_MAX ? INT_MAX : int(ms);
}

enum class Wait { READY, TIMEOUT, WOKEN };

// Waits for `events` on fd (or any input on wake_fd) until the deadline. READY also covers errors and
// hang-ups: the next send/recv reports them precisely.
Wait wait_fd(int fd, short events, Deadline deadline, int wake_fd = -1) {
  for (;;) {
    pollfd fds[2] = {{fd, events, 0}, {wake_fd, POLLIN, 0}};
    int n = ::poll(fds, wake_fd >= 0 ? 2 : 1, poll_timeout_ms(deadline));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Wait::READY;  // let the caller's syscall report the error
    if (wake_fd >= 0 && fds[1].revents) return Wait::WOKEN;
    if (n > 0) return Wait::READY;
    if (Clock::now() >= deadline) return Wait::TIMEOUT;  // else poll rounded down; wait again
  }
}

bool is_disconnect(int err) {
  return err == ECONNRESET || err == EPIPE || err == ENOTCONN || err == ESHUTDOWN || err == ECONNABORTED;
}

std::string endpoint_name(const tcp::endpoint& ep) {
  std::string addr = ep.address().to_string();
  if (ep.address().is_v6()) addr = "[" + addr + "]";
  return addr + ":" + std::to_string(ep.port());
}

}  // namespace

// ---- TcpStream ----------------------------------------------------------------------------------------

TcpStream::TcpStream(int fd, std::string peer_name, std::string peer_address)
    : fd_(fd), peer_(std::move(peer_name)), address_(std::move(peer_address)) {
  ESSAIM_CHECK(fd_ >= 0);
  int flags = ::fcntl(fd_, F_GETFL, 0);
  ESSAIM_CHECK(flags >= 0 && ::fcntl(fd_, F_SETFL, flags | O_NONBLOCK) == 0);
  int one = 1;
  // Set here rather than by each caller so that no path can produce a stream without it.
  (void)::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
#ifdef SO_NOSIGPIPE
  (void)::setsockopt(fd_, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof(one));
#endif
}

TcpStream::~TcpStream() {
  close();
  ::close(fd_);
}

void TcpStream::close() {
  // shutdown, not close: another thread may be inside poll/recv on this fd, and a closed fd number could
  // be reused under it. shutdown wakes it; the fd itself is released in the destructor.
  if (!closed_.exchange(true)) (void)::shutdown(fd_, SHUT_RDWR);
}

bool TcpStream::no_delay() const {
  int v = 0;
  socklen_t len = sizeof(v);
  return ::getsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &v, &len) == 0 && v != 0;
}

NetResult<size_t> TcpStream::read_some(std::span<uint8_t> buf, Deadline deadline) {
  if (buf.empty()) return size_t(0);
  for (;;) {
    if (closed_) return net_error(NetErrorKind::CLOSED, "connection to " + peer_ + " was closed locally");
    ssize_t n = ::recv(fd_, buf.data(), buf.size(), 0);
    if (n > 0) return size_t(n);
    if (n == 0) {
      if (closed_) continue;
      return net_error(NetErrorKind::CLOSED, peer_ + " closed the connection");
    }
    int err = errno;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) {
      if (wait_fd(fd_, POLLIN, deadline) == Wait::TIMEOUT) {
        return net_error(NetErrorKind::TIMEOUT, "no data from " + peer_ + " before the deadline");
      }
      continue;
    }
    if (is_disconnect(err)) return net_error(NetErrorKind::CLOSED, peer_ + ": " + std::strerror(err));
    return net_error(NetErrorKind::IO, "reading from " + peer_ + ": " + std::strerror(err));
  }
}

NetStatus TcpStream::write_all(std::span<const uint8_t> bytes, Deadline deadline) {
#ifdef MSG_NOSIGNAL
  const int flags = MSG_NOSIGNAL;  // a peer that vanished is an error value, not a SIGPIPE
#else
  const int flags = 0;
#endif
  while (!bytes.empty()) {
    if (closed_) return net_error(NetErrorKind::CLOSED, "connection to " + peer_ + " was closed locally");
    ssize_t n = ::send(fd_, bytes.data(), bytes.size(), flags);
    if (n >= 0) {
      bytes = bytes.subspan(size_t(n));
      continue;
    }
    int err = errno;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) {
      if (wait_fd(fd_, POLLOUT, deadline) == Wait::TIMEOUT) {
        return net_error(NetErrorKind::TIMEOUT, peer_ + " did not read before the deadline");
      }
      continue;
    }
    if (is_disconnect(err)) return net_error(NetErrorKind::CLOSED, peer_ + ": " + std::strerror(err));
    return net_error(NetErrorKind::IO, "writing to " + peer_ + ": " + std::strerror(err));
  }
  return {};
}

// ---- connect --------------------------------------------------------------------------------------------

NetResult<std::unique_ptr<TcpStream>> tcp_connect(std::string_view host, uint16_t port, Deadline deadline) {
  const std::string where = std::string(host) + ":" + std::to_string(port);
  // Declared before the objects that use it: destroyed last, after they have dropped their handlers.
  asio::io_context ctx;
  tcp::resolver resolver(ctx);
  tcp::socket socket(ctx);
  boost::system::error_code result;
  bool done = false;
  const char* stage = "resolving";
  tcp::endpoint peer;
  resolver.async_resolve(std::string(host), std::to_string(port),
                         [&](const boost::system::error_code& ec, const tcp::resolver::results_type& found) {
                           if (ec) {
                             result = ec;
                             done = true;
                             return;
                           }
                           stage = "connecting to";
                           asio::async_connect(socket, found,
                                               [&](const boost::system::error_code& ec2, const tcp::endpoint& ep) {
                                                 result = ec2;
                                                 peer = ep;
                                                 done = true;
                                               });
                         });
  if (deadline == kNoDeadline) {
    ctx.run();
  } else {
    ctx.run_until(deadline);
  }
  if (!done) return net_error(NetErrorKind::TIMEOUT, std::string(stage) + " " + where + ": deadline passed");
  if (result) return net_error(NetErrorKind::IO, std::string(stage) + " " + where + ": " + result.message());
  boost::system::error_code ec;
  int fd = socket.release(ec);
  if (ec) return net_error(NetErrorKind::IO, "connected to " + where + " but: " + ec.message());
  return std::make_unique<TcpStream>(fd, endpoint_name(peer));
}

NetResult<std::pair<std::string, uint16_t>> parse_host_port(std::string_view text) {
  std::string_view host, port;
  if (!text.empty() && text.front() == '[') {
    size_t close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return net_error(NetErrorKind::IO, "'" + std::string(text) + "' is not [ipv6]:port");
    }
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string_view::npos || text.find(':') != colon) {
      return net_error(NetErrorKind::IO, "'" + std::string(text) + "' is not host:port (write IPv6 as [addr]:port)");
    }
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  unsigned value = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (host.empty() || port.empty() || ec != std::errc() || end != port.data() + port.size() || value > 65535) {
    return net_error(NetErrorKind::IO, "'" + std::string(text) + "': expected host:port with a port 0-65535");
  }
  return std::pair<std::string, uint16_t>(std::string(host), uint16_t(value));
}

// ---- listener -------------------------------------------------------------------------------------------

struct TcpListener::Impl {
  asio::io_context ctx;  // never run: the acceptor is used synchronously, in non-blocking mode
  tcp::acceptor acceptor{ctx};
  int wake[2] = {-1, -1};  // self-pipe: close() writes a byte so that a poll() in accept() returns
  std::atomic<bool> closed{false};
  ~Impl() {
    for (int fd : wake) {
      if (fd >= 0) ::close(fd);
    }
  }
};

TcpListener::TcpListener(std::unique_ptr<Impl> impl, uint16_t port) : impl_(std::move(impl)), port_(port) {}
TcpListener::~TcpListener() { close(); }

NetResult<std::unique_ptr<TcpListener>> TcpListener::listen(std::string_view host, uint16_t port, int backlog) {
  const std::string where = std::string(host) + ":" + std::to_string(port);
  auto impl = std::make_unique<Impl>();
  boost::system::error_code ec;
  asio::ip::address addr = asio::ip::make_address(std::string(host), ec);
  if (ec) return net_error(NetErrorKind::IO, "listen address '" + std::string(host) + "': " + ec.message());
  tcp::endpoint ep(addr, port);
  auto fail = [&](const char* what) { return net_error(NetErrorKind::IO, std::string(what) + " " + where + ": " + ec.message()); };
  if (impl->acceptor.open(ep.protocol(), ec)) return fail("opening");
  if (impl->acceptor.set_option(asio::socket_base::reuse_address(true), ec)) return fail("configuring");
  if (impl->acceptor.bind(ep, ec)) return fail("binding");
  if (impl->acceptor.listen(backlog, ec)) return fail("listening on");
  if (impl->acceptor.non_blocking(true, ec)) return fail("configuring");
  uint16_t bound = impl->acceptor.local_endpoint(ec).port();
  if (ec) return fail("reading the port of");
  if (::pipe(impl->wake) != 0) return net_error(NetErrorKind::IO, std::string("pipe: ") + std::strerror(errno));
  for (int fd : impl->wake) (void)::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
  return std::unique_ptr<TcpListener>(new TcpListener(std::move(impl), bound));
}

NetResult<std::unique_ptr<ByteStream>> TcpListener::accept(Deadline deadline) {
  for (;;) {
    if (impl_->closed) return net_error(NetErrorKind::CLOSED, "listener closed");
    tcp::socket socket(impl_->ctx);
    tcp::endpoint peer;
    boost::system::error_code ec;
    impl_->acceptor.accept(socket, peer, ec);
    if (!ec) {
      int fd = socket.release(ec);
      if (ec) return net_error(NetErrorKind::IO, "accepting: " + ec.message());
      return std::unique_ptr<ByteStream>(
          std::make_unique<TcpStream>(fd, endpoint_name(peer), peer.address().to_string()));
    }
    if (ec == asio::error::would_block || ec == asio::error::try_again) {
      Wait w = wait_fd(impl_->acceptor.native_handle(), POLLIN, deadline, impl_->wake[0]);
      if (w == Wait::TIMEOUT) return net_error(NetErrorKind::TIMEOUT, "no connection before the deadline");
      continue;  // READY: accept again; WOKEN: the closed flag is set
    }
    // A client that gave up between SYN and accept is not the listener's failure.
    if (ec == asio::error::connection_aborted || ec == asio::error::interrupted) continue;
    return net_error(NetErrorKind::IO, "accepting on port " + std::to_string(port_) + ": " + ec.message());
  }
}

void TcpListener::close() {
  if (impl_->closed.exchange(true)) return;
  uint8_t b = 1;
  (void)!::write(impl_->wake[1], &b, 1);
}

}  // namespace essaim::net
