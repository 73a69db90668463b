// WebSocket transports (RFC 6455, Boost.Beast; TLS through OpenSSL): the client stream over ws:// and
// wss://, a WsStream, which is a ByteStream: FrameConnection and the worker and backbone cores run over it
// unchanged. The server side (the relay's) is net/ws_listener.h, on a fixed pool of I/O threads.
//
//   NetResult<WsUrl> url = parse_ws_url("wss://relay.example.org:443/node/n-0123");
//   NetResult<std::unique_ptr<WsStream>> s = ws_connect(*url, {.ca_file = "ca.pem"}, deadline_in(5s));
//   (*s)->write_message(bytes, deadline_in(1s));        // one binary message
//   NetResult<std::vector<uint8_t>> m = (*s)->read_message(deadline_in(1s));
//
// Byte-stream mapping: every write_all() is sent as one binary message; read_some() hands out the bytes
// of the received messages in order, so message boundaries carry no meaning to a ByteStream user (the
// expert protocol's frames have their own lengths). read_message()/write_message() keep the boundaries
// (the relay's clients). Text messages are a protocol error (close 1003).
//
// Threading: every stream has its own io_context and one thread that runs it (Beast's asynchronous
// operations, each with a timer), and the blocking calls wait for them on a condition variable with the
// caller's deadline: one thread may read while another writes, close() from any thread wakes both. Reads
// run ahead of the reader by at most `read_ahead_bytes` plus one message, then stop (TCP flow control
// pushes back on the sender): a peer that sends faster than we read costs bounded memory.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "net/byte_stream.h"
#include "net/tls.h"

namespace essaim::net {

// Close codes (RFC 6455 section 7.4.1) that essaim sends, each with a reason text.
enum class WsCloseCode : uint16_t {
  NORMAL = 1000,
  GOING_AWAY = 1001,     // the server stops
  PROTOCOL = 1002,       // malformed frames or a malformed first message (relay preamble)
  UNSUPPORTED = 1003,    // a text message
  POLICY = 1008,         // bad token, fingerprint mismatch, connection limit
  TOO_BIG = 1009,        // a message over the limit
  INTERNAL = 1011,       // the peer of a pair failed or stalled
  TRY_AGAIN_LATER = 1013,  // (RFC 6455 "Try Again Later"; TRY_AGAIN is a <netdb.h> macro) no worker available for that node now
};

struct WsUrl {
  bool tls = false;
  std::string host;
  uint16_t port = 0;
  std::string path = "/";  // always starts with '/'
  std::string text() const;  // back to "ws[s]://host:port/path"
};
// "ws://host:port/path" or "wss://host[:port]/path" (default ports 80 and 443; "[::1]" for IPv6).
NetResult<WsUrl> parse_ws_url(std::string_view text);
bool looks_like_ws_url(std::string_view text);  // starts with ws:// or wss://

struct WsLimits {
  // The largest message accepted; a bigger one is refused with close 1009 (Beast enforces it while
  // reading, before the message is held).
  uint64_t max_message_bytes = proto::kDefaultMaxPayloadBytes + proto::kFrameHeaderBytes;
  // The first message a server session accepts (net/ws_listener.h; the relay's preamble is at most 1 KiB):
  // an unauthenticated peer cannot make it hold max_message_bytes before its first message is checked.
  // 0: max_message_bytes.
  uint64_t first_message_max_bytes = 0;
  // A client stream reads ahead of its reader by at most this plus one message; the relay queues at most
  // this plus one message for one destination before it stops reading from the sender.
  uint64_t read_ahead_bytes = 4 << 20;
  // Keep-alive: a ping after idle/2 without traffic, the connection closed after idle without any frame
  // (a pong counts). 0 = no keep-alive.
  std::chrono::milliseconds idle_timeout{30000};
  std::chrono::milliseconds handshake_timeout{10000};  // TLS + HTTP upgrade
};

class WsStream : public ByteStream {
 public:
  NetResult<size_t> read_some(std::span<uint8_t> buf, Deadline deadline) override = 0;
  NetStatus write_all(std::span<const uint8_t> bytes, Deadline deadline) override = 0;
  void close() override = 0;  // close 1000
  // The next whole message (not mixed with read_some on the same stream).
  virtual NetResult<std::vector<uint8_t>> read_message(Deadline deadline) = 0;
  virtual NetStatus write_message(std::span<const uint8_t> bytes, Deadline deadline) = 0;
  // Sends a close frame with this code and reason (after a write in progress), then closes.
  virtual void close_with(WsCloseCode code, std::string_view reason) = 0;
  // The close code the peer sent (0 while open or when it vanished without one) and its reason.
  virtual uint16_t peer_close_code() const = 0;
  virtual std::string peer_close_reason() const = 0;
  // The request target it asked for in the upgrade ("/", "/node/n-1").
  virtual std::string target() const = 0;
};

struct WsClientOptions {
  WsLimits limits;
  // With wss://: the relay's certificate is verified against the system trust store (OpenSSL's default
  // paths, so SSL_CERT_FILE / SSL_CERT_DIR are honoured), plus this PEM file if given; the host name is
  // checked against the certificate and sent as SNI.
  std::string ca_file;
};
NetResult<std::unique_ptr<WsStream>> ws_connect(const WsUrl& url, const WsClientOptions& options, Deadline deadline);

using WsServerTls = ServerTls;  // the relay's wss:// listener (net/tls.h)

}  // namespace essaim::net
