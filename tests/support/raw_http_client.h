// A raw HTTP client for hostile-listener tests: a blocking loopback socket, bound to a chosen source
// address (any of 127.0.0.0/8, so one test can play several hosts), that writes bytes as given and reads
// what the server answers within a deadline. Shared by the tests of every HTTP listener.
//
//   net::testing::RawClient c(port, "127.0.0.2");
//   c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
//   std::string head = c.read_response(2s);   // one response (head + Content-Length body), or what came
#pragma once

#include <boost/asio.hpp>
#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <string>

namespace essaim::net::testing {

class RawClient {
 public:
  explicit RawClient(uint16_t port, const std::string& from = "127.0.0.1") : socket_(io_) {
    namespace asio = boost::asio;
    boost::system::error_code ec;
    socket_.open(asio::ip::tcp::v4(), ec);
    if (!ec) socket_.bind({asio::ip::make_address(from), 0}, ec);
    if (!ec) socket_.connect({asio::ip::make_address("127.0.0.1"), port}, ec);
    connected_ = !ec;
  }
  bool connected() const { return connected_; }

  // False once the server has closed or reset (what it answered may still be read).
  bool send(const std::string& bytes) {
    boost::system::error_code ec;
    boost::asio::write(socket_, boost::asio::buffer(bytes), ec);
    return !ec;
  }

  // Everything until the server closes, or until `timeout` passes.
  std::string read_all(std::chrono::milliseconds timeout) {
    std::string out;
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (read_some_until(out, until)) {
    }
    return out;
  }

  // One response: its head and a Content-Length body; less if the server closes or `timeout` passes.
  std::string read_response(std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    std::string out = std::move(pending_);
    pending_.clear();
    for (;;) {
      const size_t head_end = out.find("\r\n\r\n");
      if (head_end != std::string::npos) {
        const size_t at = out.find("Content-Length: ");
        const size_t length = at != std::string::npos && at < head_end ? std::stoul(out.substr(at + 16)) : 0;
        const size_t total = head_end + 4 + length;
        if (out.size() >= total) {
          pending_ = out.substr(total);
          out.resize(total);
          return out;
        }
      }
      if (!read_some_until(out, until)) return out;
    }
  }

  // Half-closes: the server reads end of stream (FIN); what it sends can still be read.
  void shutdown_send() {
    boost::system::error_code ec;
    socket_.shutdown(boost::asio::socket_base::shutdown_send, ec);
  }

  // The client end's port (the server's peer port for this connection).
  uint16_t local_port() const {
    boost::system::error_code ec;
    return socket_.local_endpoint(ec).port();
  }

  // Closes with a reset (SO_LINGER 0): the server's pending writes fail at once.
  void reset() {
    boost::system::error_code ec;
    socket_.set_option(boost::asio::socket_base::linger(true, 0), ec);
    socket_.close(ec);
  }

 private:
  bool read_some_until(std::string& out, std::chrono::steady_clock::time_point until) {
    // poll + recv on the descriptor: Asio's blocking read would wait past any socket timeout.
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{.fd = socket_.native_handle(), .events = POLLIN, .revents = 0};
    if (::poll(&p, 1, int(left.count())) <= 0) return false;
    char buf[16384];
    const ssize_t n = ::recv(socket_.native_handle(), buf, sizeof buf, MSG_DONTWAIT);
    if (n <= 0) return false;
    out.append(buf, size_t(n));
    return true;
  }

  boost::asio::io_context io_;
  boost::asio::ip::tcp::socket socket_;
  bool connected_ = false;
  std::string pending_;  // bytes read past the last response
};

}  // namespace essaim::net::testing
