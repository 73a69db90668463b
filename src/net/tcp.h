// TCP transport: a client connect, a listener (an Acceptor) and the stream both produce.
//
//   NetResult<std::unique_ptr<TcpListener>> l = TcpListener::listen("127.0.0.1", 0);  // 0: any free port
//   uint16_t port = (*l)->port();
//   NetResult<std::unique_ptr<TcpStream>> c = tcp_connect("127.0.0.1", port, deadline_in(2s));
//   NetResult<std::unique_ptr<ByteStream>> s = (*l)->accept(deadline_in(2s));
//
// Boost.Asio resolves names, connects (with a deadline) and accepts; the connected socket then leaves
// Asio (release()) and is driven with non-blocking send/recv and poll(2). That gives every blocking call a
// deadline, lets one thread read while another writes the same socket (Asio's socket objects are not safe
// for that), and lets close() from a third thread wake both (shutdown(2)). Every socket has TCP_NODELAY:
// a request is one write of a whole frame, and Nagle's delay would add up to 40 ms per layer.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "net/byte_stream.h"

namespace essaim::net {

class TcpStream : public ByteStream {
 public:
  // Takes ownership of a connected socket; sets it non-blocking.
  TcpStream(int fd, std::string peer_name, std::string peer_address = {});
  ~TcpStream() override;
  TcpStream(const TcpStream&) = delete;
  TcpStream& operator=(const TcpStream&) = delete;

  NetResult<size_t> read_some(std::span<uint8_t> buf, Deadline deadline) override;
  NetStatus write_all(std::span<const uint8_t> bytes, Deadline deadline) override;
  void close() override;
  std::string peer_name() const override { return peer_; }
  std::string peer_address() const override { return address_.empty() ? peer_ : address_; }

  bool no_delay() const;  // TCP_NODELAY as the kernel reports it

 private:
  int fd_;
  std::string peer_;
  std::string address_;
  std::atomic<bool> closed_{false};
};

// Resolves host (name or address) and connects to the first address that answers, all before `deadline`.
NetResult<std::unique_ptr<TcpStream>> tcp_connect(std::string_view host, uint16_t port, Deadline deadline);

// "host:port", "[::1]:port". Errors name what is wrong with the text.
NetResult<std::pair<std::string, uint16_t>> parse_host_port(std::string_view text);

class TcpListener : public Acceptor {
 public:
  // Binds and listens (SO_REUSEADDR). host "0.0.0.0" or "::" for every interface; port 0 picks one.
  static NetResult<std::unique_ptr<TcpListener>> listen(std::string_view host, uint16_t port, int backlog = 128);
  ~TcpListener() override;

  uint16_t port() const { return port_; }
  NetResult<std::unique_ptr<ByteStream>> accept(Deadline deadline) override;
  void close() override;

 private:
  struct Impl;
  explicit TcpListener(std::unique_ptr<Impl> impl, uint16_t port);
  std::unique_ptr<Impl> impl_;
  uint16_t port_;
};

}  // namespace essaim::net
