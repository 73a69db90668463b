// One byte-stream interface for every transport (TCP, the in-memory pipe, later the relay's WebSocket):
// the worker and backbone cores are written against ByteStream and never learn which one they got.
//
//   std::unique_ptr<ByteStream> s = ...;                        // tcp_connect, make_pipe, acceptor->accept
//   NetStatus w = s->write_all(bytes, deadline_in(2s));
//   NetResult<size_t> n = s->read_some(buf, deadline_in(2s));   // >= 1 byte, or TIMEOUT / CLOSED / IO
//   if (!n && n.error().kind == NetErrorKind::TIMEOUT) ...       // nothing is lost: read again later
//   s->close();                                                   // any thread; wakes blocked calls
//
// Why blocking calls with deadlines (not an async interface): a worker connection is a loop "read a
// request, compute, answer", and the backbone waits for answers with a deadline; both read top to bottom
// as blocking code, are tested with plain threads, and need no executor threaded through the model code.
// At swarm scale (tens of connections per process) a thread per connection costs little, and it is what
// makes "one stalled peer never stalls another" hold by construction.
//
// Thread safety: at most one thread reads and at most one thread writes at a time (they may be different
// threads: a reader thread collects responses while callers send requests); close() from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>

#include "core/status.h"
#include "proto/expected.h"
#include "proto/frame.h"
#include "proto/messages.h"

namespace essaim::net {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;
inline constexpr Deadline kNoDeadline = Deadline::max();
inline Deadline deadline_in(Clock::duration d) { return Clock::now() + d; }

enum class NetErrorKind : uint8_t {
  TIMEOUT,   // the deadline passed; for reads nothing was lost, for writes the stream is unusable
  CLOSED,    // the peer closed (EOF at a frame boundary, reset, broken pipe) or close() was called here
  IO,        // any other transport failure (connect refused, resolve failed, socket error)
  PROTOCOL,  // the peer's bytes broke the protocol; `proto` says how
  REFUSED,   // a handshake was refused (by either side); `refuse` says why
  TOO_LARGE, // a message to send is over the peer's announced frame limit; nothing was sent
  COUNT,
};
std::string_view net_error_kind_name(NetErrorKind k);

struct NetError {
  NetErrorKind kind = NetErrorKind::IO;
  std::string message;
  std::optional<proto::ProtoErrorKind> proto;  // set for PROTOCOL
  std::optional<proto::RefuseReason> refuse;   // set for REFUSED
  Status status() const;                       // "connection closed: ..." for callers that only log
};
template <typename T>
using NetResult = proto::Expected<T, NetError>;
using NetStatus = proto::Expected<void, NetError>;

inline NetError net_error(NetErrorKind kind, std::string message) { return NetError{kind, std::move(message), {}, {}}; }

class ByteStream {
 public:
  virtual ~ByteStream() = default;
  // Waits until at least one byte is available or `deadline` passes; returns 1..buf.size() bytes read.
  // CLOSED once the peer has closed and every byte it sent has been read.
  virtual NetResult<size_t> read_some(std::span<uint8_t> buf, Deadline deadline) = 0;
  // Writes every byte or fails. After a failure (TIMEOUT included) part of `bytes` may have been sent:
  // the byte stream is no longer in step, and the caller must close it.
  virtual NetStatus write_all(std::span<const uint8_t> bytes, Deadline deadline) = 0;
  // Idempotent. Blocked and later calls on this end return CLOSED; the peer sees end-of-stream.
  virtual void close() = 0;
  // "127.0.0.1:41234", "pipe#3": for logs and error messages.
  virtual std::string peer_name() const = 0;
  // The peer's address without the port ("127.0.0.1", "::1"): what admission limits count per source.
  // Transports without addresses (pipes) return peer_name(), one "address" per connection.
  virtual std::string peer_address() const { return peer_name(); }
};

// Where servers get their connections from (a TCP listener, an in-memory hub in tests, later the relay).
class Acceptor {
 public:
  virtual ~Acceptor() = default;
  // The next connection, or TIMEOUT at the deadline, or CLOSED once close() was called.
  virtual NetResult<std::unique_ptr<ByteStream>> accept(Deadline deadline) = 0;
  virtual void close() = 0;  // idempotent, any thread; wakes a blocked accept()
};

}  // namespace essaim::net
