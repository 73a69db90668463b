// A ByteStream speaking the expert protocol: whole messages in, whole messages out, with deadlines.
//
//   FrameConnection c(std::move(stream));                        // or FrameConnection c(stream_ref)
//   NetResult<proto::Hello> peer = handshake(c, my_hello, deadline_in(5s));
//   c.send(proto::ExpertRequest{...}, deadline_in(1s));          // from any thread; frames never interleave
//   NetResult<proto::Message> m = c.receive(deadline_in(1s));    // one reader thread
//   if (!m && m.error().kind == NetErrorKind::TIMEOUT) ...         // nothing lost: receive again later
//
// Several requests may be in flight: senders are serialised frame by frame, and answers come back in
// whatever order the peer produces them (match them by request id). A timed-out or failed write may leave
// a partial frame on the wire, so it ends sending (and closes the stream, except when the peer was already
// gone: its last words can still be read); a read timeout loses nothing (a partial frame stays buffered
// for the next receive). A message that does not decode is reported as PROTOCOL and the stream
// stays usable (the framing is intact); a framing error (bad type, oversized) is final for reading, but
// the write side still works, so the owner can answer ERROR MALFORMED before closing.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "net/byte_stream.h"
#include "proto/frame.h"
#include "proto/handshake.h"
#include "proto/messages.h"

namespace essaim::net {

struct ConnectionOptions {
  uint64_t max_payload_bytes = proto::kDefaultMaxPayloadBytes;  // the largest payload we accept
  size_t read_chunk_bytes = 64 << 10;
};

class FrameConnection {
 public:
  explicit FrameConnection(std::unique_ptr<ByteStream> stream, ConnectionOptions options = {});
  // Borrows a stream owned elsewhere (a server's connection); it must outlive this object.
  explicit FrameConnection(ByteStream& stream, ConnectionOptions options = {});
  ~FrameConnection();
  FrameConnection(const FrameConnection&) = delete;
  FrameConnection& operator=(const FrameConnection&) = delete;

  // Thread-safe. TOO_LARGE (nothing sent) when the payload exceeds the peer's limit; CLOSED once the
  // connection is broken; TIMEOUT when the deadline passed, waiting for another sender included.
  NetStatus send(const proto::Message& m, Deadline deadline);
  // Sends bytes that already form whole frames (a relay forwarding, a test injecting garbage).
  NetStatus send_raw(std::span<const uint8_t> frames, Deadline deadline);

  // One reader at a time. PROTOCOL errors carry proto::ProtoErrorKind; a peer that closes between frames
  // is CLOSED, one that closes inside a frame is PROTOCOL/TRUNCATED.
  NetResult<proto::Message> receive(Deadline deadline);
  NetResult<proto::Frame> receive_frame(Deadline deadline);

  void close();
  // True once the connection cannot carry frames both ways any more: a write failed, or reading ended
  // (peer closed, framing error, transport error). The owner should close it.
  bool broken() const { return write_broken_ || read_broken_; }
  ByteStream& stream() { return *stream_; }
  std::string peer_name() const { return stream_->peer_name(); }

  // The limit this side announces (and applies once the handshake is done).
  uint64_t max_payload_bytes() const { return max_payload_; }
  // The limit reads apply now: min(n, max_payload_bytes()). net::handshake lowers it to the HELLO's real
  // maximum (proto::kMaxHelloPayloadBytes) until the peer is accepted, so a peer that has not completed
  // the handshake can make us hold at most that many payload bytes, whatever our frame limit.
  void limit_reads(uint64_t n) { decoder_.set_max_payload_bytes(std::min(n, max_payload_)); }
  uint64_t read_limit() const { return decoder_.max_payload_bytes(); }
  // The peer's announced receive limit; until the handshake sets it, assumed equal to ours.
  uint64_t peer_max_payload_bytes() const { return peer_max_payload_; }
  void set_peer_max_payload_bytes(uint64_t n) { peer_max_payload_ = n; }

 private:
  std::unique_ptr<ByteStream> owned_;
  ByteStream* stream_;
  // Senders take turns through a flag rather than a timed_mutex: waiting for a turn honours the deadline,
  // and the wait is a plain condition variable that every sanitizer understands.
  std::mutex write_mu_;
  std::condition_variable write_cv_;
  bool writing_ = false;  // guarded by write_mu_
  uint64_t max_payload_;
  std::atomic<uint64_t> peer_max_payload_;
  std::atomic<bool> write_broken_{false};
  std::atomic<bool> read_broken_{false};
  // Reader state (one reader at a time):
  proto::FrameDecoder decoder_;
  std::vector<uint8_t> rbuf_;
  size_t rpos_ = 0, rend_ = 0;
};

// The symmetric handshake (docs/protocol.md, "Handshake"): send our HELLO, read theirs, answer HELLO_ACK
// or REFUSE, read their answer. Returns the peer's HELLO, and records its frame limit on `c`. Every
// failure closes the connection: REFUSED carries the reason (whichever side refused, the message says
// which), PROTOCOL a first frame that is not a HELLO, TIMEOUT/CLOSED/IO the transport's failure.
// mine.max_payload_bytes is replaced by c's own limit.
NetResult<proto::Hello> handshake(FrameConnection& c, proto::Hello mine, Deadline deadline,
                                  const proto::HandshakePolicy& policy = {});

}  // namespace essaim::net
