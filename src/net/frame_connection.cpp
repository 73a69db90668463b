#include "net/frame_connection.h"

#include "net/wait.h"

namespace essaim::net {

namespace {

NetError protocol_error(const proto::ProtoError& e, const std::string& peer) {
  return NetError{NetErrorKind::PROTOCOL, peer + ": " + e.status().message(), e.kind, {}};
}

}  // namespace

FrameConnection::FrameConnection(std::unique_ptr<ByteStream> stream, ConnectionOptions options)
    : FrameConnection(*stream, options) {
  owned_ = std::move(stream);
}

FrameConnection::FrameConnection(ByteStream& stream, ConnectionOptions options)
    : stream_(&stream),
      max_payload_(options.max_payload_bytes),
      peer_max_payload_(options.max_payload_bytes),
      decoder_(options.max_payload_bytes),
      rbuf_(std::max<size_t>(options.read_chunk_bytes, 1)) {}

FrameConnection::~FrameConnection() {
  if (owned_) owned_->close();
}

void FrameConnection::close() {
  read_broken_ = true;
  write_broken_ = true;
  stream_->close();
}

NetStatus FrameConnection::send(const proto::Message& m, Deadline deadline) {
  // Checked before anything is built, then encoded outside the lock: concurrent senders encode in
  // parallel and only take turns on the wire.
  uint64_t payload = proto::message_payload_bytes(m);
  if (payload > peer_max_payload_) {
    return net_error(NetErrorKind::TOO_LARGE,
                     std::string(proto::frame_type_name(proto::message_frame_type(m))) + " of " +
                         std::to_string(payload) + " bytes exceeds the " + std::to_string(peer_max_payload_.load()) +
                         "-byte limit of " + peer_name() + "; split it");
  }
  return send_raw(proto::encode_message(m), deadline);
}

NetStatus FrameConnection::send_raw(std::span<const uint8_t> frames, Deadline deadline) {
  {
    std::unique_lock lock(write_mu_);
    if (!wait_until_deadline(write_cv_, lock, deadline, [&] { return !writing_; })) {
      return net_error(NetErrorKind::TIMEOUT, "other senders to " + peer_name() + " held the line past the deadline");
    }
    writing_ = true;
  }
  NetStatus s = write_broken_ ? NetStatus(net_error(NetErrorKind::CLOSED, "connection to " + peer_name() + " is closed"))
                              : stream_->write_all(frames, deadline);
  if (!s) {
    // Part of a frame may be out: the peer's decoder is now out of step, so no frame may follow. A peer
    // that is gone (CLOSED) may still have left a last message in our input (a REFUSE, an ERROR saying
    // why), so reading stays possible; a timeout or an I/O error closes the stream at once.
    write_broken_ = true;
    if (s.error().kind != NetErrorKind::CLOSED) stream_->close();
  }
  {
    std::lock_guard lock(write_mu_);
    writing_ = false;
  }
  write_cv_.notify_one();
  return s;
}

NetResult<proto::Frame> FrameConnection::receive_frame(Deadline deadline) {
  for (;;) {
    if (decoder_.ready()) return decoder_.take();
    if (decoder_.error()) {
      read_broken_ = true;
      return protocol_error(*decoder_.error(), peer_name());
    }
    if (rpos_ < rend_) {
      rpos_ += decoder_.feed(std::span<const uint8_t>(rbuf_).subspan(rpos_, rend_ - rpos_));
      continue;
    }
    NetResult<size_t> n = stream_->read_some(rbuf_, deadline);
    if (!n) {
      if (n.error().kind == NetErrorKind::TIMEOUT) return n.error();  // nothing lost; read again later
      read_broken_ = true;
      if (n.error().kind == NetErrorKind::CLOSED && !decoder_.at_boundary()) {
        return protocol_error({proto::ProtoErrorKind::TRUNCATED, "the stream ended inside a frame"}, peer_name());
      }
      return n.error();
    }
    rpos_ = 0;
    rend_ = *n;
  }
}

NetResult<proto::Message> FrameConnection::receive(Deadline deadline) {
  NetResult<proto::Frame> f = receive_frame(deadline);
  if (!f) return f.error();
  proto::ProtoResult<proto::Message> m = proto::decode_message(*f);
  if (!m) return protocol_error(m.error(), peer_name());  // framing intact: the connection stays usable
  return std::move(*m);
}

NetResult<proto::Hello> handshake(FrameConnection& c, proto::Hello mine, Deadline deadline,
                                  const proto::HandshakePolicy& policy) {
  using proto::Message;
  mine.max_payload_bytes = c.max_payload_bytes();
  c.limit_reads(proto::kMaxHelloPayloadBytes);  // until the peer is accepted; raised below
  auto refuse = [&](proto::Refuse r, const std::string& context) -> NetError {
    (void)c.send(r, deadline);  // best effort: the peer may already be gone
    c.close();
    return NetError{NetErrorKind::REFUSED, context + ": " + r.message, {}, r.reason};
  };

  NetStatus sent = c.send(mine, deadline);
  if (!sent && sent.error().kind != NetErrorKind::CLOSED) {
    c.close();
    return sent.error();
  }
  NetResult<Message> theirs = c.receive(deadline);  // read even if the peer hung up: it may say why
  if (!theirs && theirs.error().kind == NetErrorKind::PROTOCOL &&
      (theirs.error().proto == proto::ProtoErrorKind::UNKNOWN_TYPE || theirs.error().proto == proto::ProtoErrorKind::OVERSIZED)) {
    // Its very first bytes are no frame at all: another program on that port (a web server answers "HTTP/1.1",
    // 'H' = frame type 72). Say so rather than which byte was wrong.
    NetError e = theirs.error();
    e.message = c.peer_name() + " is not an essaim " + (mine.role == proto::Role::BACKBONE ? "worker" : "backbone") +
                " (its first bytes are not an expert-protocol frame: is it another service's port?); " + e.message;
    theirs = e;
  }
  if (!theirs) {
    if (sent && theirs.error().kind == NetErrorKind::PROTOCOL) {
      return refuse({proto::RefuseReason::BAD_HELLO, theirs.error().message}, "refused " + c.peer_name());
    }
    if (sent && theirs.error().kind == NetErrorKind::TIMEOUT) {
      // A silent peer is told why it is dropped (a write that cannot complete at once is skipped: the
      // deadline has passed). Still reported as the TIMEOUT it is.
      (void)c.send(proto::Refuse{proto::RefuseReason::BAD_HELLO, "no HELLO before the handshake deadline"}, deadline);
    }
    c.close();
    return sent ? theirs.error() : sent.error();
  }
  const auto* hello = std::get_if<proto::Hello>(&*theirs);
  if (!hello) {
    // A REFUSE here means the peer refused before reading our HELLO (it could not parse it, say).
    if (const auto* r = std::get_if<proto::Refuse>(&*theirs)) {
      c.close();
      return NetError{NetErrorKind::REFUSED, c.peer_name() + " refused us: " + r->message, {}, r->reason};
    }
    std::string got(proto::frame_type_name(proto::message_frame_type(*theirs)));
    return refuse({proto::RefuseReason::BAD_HELLO, "expected HELLO as the first frame, got " + got},
                  "refused " + c.peer_name());
  }
  if (std::optional<proto::Refuse> no = proto::check_hello(mine, *hello, policy)) {
    return refuse(*no, "refused " + c.peer_name());
  }
  proto::Hello peer = *hello;
  // The peer's limit applies from here on: our HELLO_ACK and everything after it.
  c.set_peer_max_payload_bytes(peer.max_payload_bytes);
  NetStatus ack = c.send(proto::HelloAck{}, deadline);
  if (!ack && ack.error().kind != NetErrorKind::CLOSED) {
    c.close();
    return ack.error();
  }
  // Even when the peer hung up before our HELLO_ACK went out, its REFUSE may be waiting: read it, so
  // that the refusal's reason is what the caller sees rather than a bare "closed".
  NetResult<Message> answer = c.receive(deadline);
  if (!answer) {
    c.close();
    return ack ? answer.error() : ack.error();
  }
  if (std::holds_alternative<proto::HelloAck>(*answer)) {
    c.limit_reads(c.max_payload_bytes());
    return peer;
  }
  if (const auto* r = std::get_if<proto::Refuse>(&*answer)) {
    c.close();
    return NetError{NetErrorKind::REFUSED, c.peer_name() + " refused us: " + r->message, {}, r->reason};
  }
  std::string got(proto::frame_type_name(proto::message_frame_type(*answer)));
  return refuse({proto::RefuseReason::BAD_HELLO, "expected HELLO_ACK or REFUSE, got " + got},
                "refused " + c.peer_name());
}

}  // namespace essaim::net
