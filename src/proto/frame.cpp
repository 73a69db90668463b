#include "proto/frame.h"

#include <algorithm>
#include <cstring>

#include "proto/wire.h"

namespace essaim::proto {

std::string_view frame_type_name(FrameType t) {
  switch (t) {
    case FrameType::HELLO: return "HELLO";
    case FrameType::HELLO_ACK: return "HELLO_ACK";
    case FrameType::REFUSE: return "REFUSE";
    case FrameType::EXPERT_REQUEST: return "EXPERT_REQUEST";
    case FrameType::EXPERT_RESPONSE: return "EXPERT_RESPONSE";
    case FrameType::ERROR: return "ERROR";
    case FrameType::PING: return "PING";
    case FrameType::PONG: return "PONG";
    case FrameType::GOODBYE: return "GOODBYE";
    case FrameType::COUNT: break;
  }
  return "?";
}

std::optional<FrameType> frame_type_from_byte(uint8_t b) {
  if (b == 0 || b >= uint8_t(FrameType::COUNT)) return std::nullopt;
  return FrameType(b);
}

std::string_view proto_error_kind_name(ProtoErrorKind k) {
  switch (k) {
    case ProtoErrorKind::TRUNCATED: return "TRUNCATED";
    case ProtoErrorKind::TRAILING_BYTES: return "TRAILING_BYTES";
    case ProtoErrorKind::OVERSIZED: return "OVERSIZED";
    case ProtoErrorKind::UNKNOWN_TYPE: return "UNKNOWN_TYPE";
    case ProtoErrorKind::BAD_MAGIC: return "BAD_MAGIC";
    case ProtoErrorKind::BAD_VALUE: return "BAD_VALUE";
    case ProtoErrorKind::COUNT: break;
  }
  return "?";
}

Status ProtoError::status() const {
  return Status::error("protocol error (" + std::string(proto_error_kind_name(kind)) + "): " + message);
}

void append_frame_header(FrameType type, uint64_t payload_bytes, std::vector<uint8_t>& out) {
  WireWriter w(out);
  w.u8(uint8_t(type));
  w.u64(payload_bytes);
}

void append_frame(FrameType type, std::span<const uint8_t> payload, std::vector<uint8_t>& out) {
  out.reserve(out.size() + kFrameHeaderBytes + payload.size());
  append_frame_header(type, payload.size(), out);
  out.insert(out.end(), payload.begin(), payload.end());
}

FrameDecoder::FrameDecoder(uint64_t max_payload_bytes) : max_payload_(max_payload_bytes) {}

void FrameDecoder::fail(ProtoErrorKind kind, std::string message) {
  state_ = State::FAILED;
  error_ = ProtoError{kind, std::move(message)};
  frame_.payload = {};
}

void FrameDecoder::header_complete() {
  std::optional<FrameType> type = frame_type_from_byte(header_[0]);
  if (!type) {
    fail(ProtoErrorKind::UNKNOWN_TYPE, "unknown frame type " + std::to_string(header_[0]));
    return;
  }
  std::memcpy(&payload_len_, header_ + 1, sizeof(payload_len_));
  // The limit is checked here, before the payload vector exists: a length with its high bits set is
  // an error value, never an allocation attempt.
  if (payload_len_ > max_payload_) {
    fail(ProtoErrorKind::OVERSIZED, std::string(frame_type_name(*type)) + " frame declares " +
                                        std::to_string(payload_len_) + " payload bytes, over the limit of " +
                                        std::to_string(max_payload_));
    return;
  }
  frame_.type = *type;
  frame_.payload.clear();
  // The declared length is within the limit, so it is reserved at once (no copies while the frame grows).
  // reserve() writes nothing: pages are touched only as bytes arrive, so a peer that declares 64 MiB and
  // then trickles holds address space, not memory.
  frame_.payload.reserve(payload_len_);
  header_fill_ = 0;
  state_ = payload_len_ == 0 ? State::READY : State::PAYLOAD;
}

size_t FrameDecoder::feed(std::span<const uint8_t> in) {
  size_t used = 0;
  while (used < in.size()) {
    if (state_ == State::HEADER) {
      size_t n = std::min(in.size() - used, kFrameHeaderBytes - header_fill_);
      std::memcpy(header_ + header_fill_, in.data() + used, n);
      header_fill_ += n;
      used += n;
      // The type byte alone is enough to refuse a stream that is not ours (an HTTP request, TLS hello).
      if (header_fill_ >= 1 && !frame_type_from_byte(header_[0])) {
        fail(ProtoErrorKind::UNKNOWN_TYPE, "unknown frame type " + std::to_string(header_[0]));
        return used;
      }
      if (header_fill_ == kFrameHeaderBytes) header_complete();
    } else if (state_ == State::PAYLOAD) {
      uint64_t missing = payload_len_ - frame_.payload.size();
      size_t n = static_cast<size_t>(std::min<uint64_t>(in.size() - used, missing));
      frame_.payload.insert(frame_.payload.end(), in.data() + used, in.data() + used + n);
      used += n;
      if (frame_.payload.size() == payload_len_) state_ = State::READY;
    } else {
      break;  // READY waits for take(); FAILED takes nothing
    }
  }
  return used;
}

Frame FrameDecoder::take() {
  ESSAIM_CHECK(state_ == State::READY);
  Frame out = std::move(frame_);
  frame_ = Frame{};
  state_ = State::HEADER;
  header_fill_ = 0;
  return out;
}

ProtoResult<Frame> decode_one_frame(std::span<const uint8_t> bytes, uint64_t max_payload_bytes) {
  FrameDecoder dec(max_payload_bytes);
  size_t used = dec.feed(bytes);
  if (dec.error()) return *dec.error();
  if (!dec.ready()) {
    return ProtoError{ProtoErrorKind::TRUNCATED,
                      "frame ends after " + std::to_string(bytes.size()) + " bytes, before its declared end"};
  }
  if (used != bytes.size()) {
    return ProtoError{ProtoErrorKind::TRAILING_BYTES,
                      std::to_string(bytes.size() - used) + " bytes after the end of the frame"};
  }
  return dec.take();
}

}  // namespace essaim::proto
