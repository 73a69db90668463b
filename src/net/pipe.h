// In-memory transport for tests: a connected pair of ByteStreams over two bounded buffers, and a hub
// that hands out such pairs as an Acceptor, so server code runs unchanged without sockets.
//
//   auto [a, b] = make_pipe(64 << 10);          // writes to a block once 64 KiB wait unread in b
//   a->write_all(bytes, kNoDeadline);
//   b->read_some(buf, deadline_in(100ms));
//   a->close();                                 // b reads what is left, then CLOSED; b's writes fail
//
//   PipeHub hub;                                // an Acceptor
//   std::unique_ptr<ByteStream> client = hub.connect();   // the server end waits in hub.accept()
//
// Semantics follow a TCP socket's: bounded buffering (a writer blocks, with its deadline, on a slow
// reader), end-of-stream after the last byte, and close() waking blocked calls on both ends.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <utility>

#include "net/byte_stream.h"

namespace essaim::net {

inline constexpr size_t kDefaultPipeCapacity = 256 << 10;

std::pair<std::unique_ptr<ByteStream>, std::unique_ptr<ByteStream>> make_pipe(
    size_t capacity_bytes = kDefaultPipeCapacity);

class PipeHub : public Acceptor {
 public:
  explicit PipeHub(size_t capacity_bytes = kDefaultPipeCapacity) : capacity_(capacity_bytes) {}
  // A new connection: returns the client end and queues the server end for accept(). After close(), the
  // client end comes back already closed (like a refused connect).
  std::unique_ptr<ByteStream> connect();

  NetResult<std::unique_ptr<ByteStream>> accept(Deadline deadline) override;
  void close() override;

 private:
  size_t capacity_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<ByteStream>> pending_;
  bool closed_ = false;
};

}  // namespace essaim::net
