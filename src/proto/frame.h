// Framing of the expert protocol (docs/protocol.md, "Frames"): every message is one frame
//
//   offset 0  u8   type            FrameType, 1..9
//   offset 1  u64  payload_length  little-endian, checked against the receiver's limit before any allocation
//   offset 9  payload_length bytes
//
// and an incremental decoder that takes arbitrary chunks of a byte stream (one byte at a time works):
//
//   FrameDecoder dec(limits.max_payload_bytes);
//   while (!dec.error()) {
//     size_t used = dec.feed(chunk);          // takes bytes up to the end of the current frame
//     chunk = chunk.subspan(used);
//     if (dec.ready()) handle(dec.take());    // then feed the rest of the chunk
//     else if (chunk.empty()) chunk = read_more();
//   }
//
// A framing error (unknown type, declared length over the limit) is sticky: the stream cannot be
// resynchronised, so the connection must be dropped after reporting it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "proto/expected.h"

namespace essaim::proto {

enum class FrameType : uint8_t {
  HELLO = 1,            // both ways, first frame of a connection
  HELLO_ACK = 2,        // "your HELLO is acceptable"
  REFUSE = 3,           // "it is not", with a reason; the sender closes
  EXPERT_REQUEST = 4,   // backbone -> worker
  EXPERT_RESPONSE = 5,  // worker -> backbone
  ERROR = 6,            // a typed failure, usually for one request; the connection stays up
  PING = 7,
  PONG = 8,
  GOODBYE = 9,          // orderly close, with a reason
  COUNT = 10,
};
// Wire values: never renumber, only append (and bump the protocol version).
static_assert(uint8_t(FrameType::HELLO) == 1 && uint8_t(FrameType::EXPERT_REQUEST) == 4 &&
              uint8_t(FrameType::ERROR) == 6 && uint8_t(FrameType::GOODBYE) == 9 &&
              uint8_t(FrameType::COUNT) == 10);

std::string_view frame_type_name(FrameType t);
// nullopt for 0 and for values >= COUNT.
std::optional<FrameType> frame_type_from_byte(uint8_t b);

inline constexpr size_t kFrameHeaderBytes = 9;
// Default receive limit on one payload. The 122B-shaped decode step moves ~100 KiB per request; big
// prefill batches are split by the sender to fit the peer's announced limit (Hello::max_frame_bytes).
inline constexpr uint64_t kDefaultMaxPayloadBytes = 64ull << 20;
// No peer may announce a limit below this: a HELLO itself must always fit.
inline constexpr uint64_t kMinMaxPayloadBytes = 64ull << 10;

// Why bytes were refused. Everything a peer can send maps to one of these, never to a crash.
enum class ProtoErrorKind : uint8_t {
  TRUNCATED,       // a field or array runs past the end of the payload (or the stream ended mid-frame)
  TRAILING_BYTES,  // bytes left after the last field of a message
  OVERSIZED,       // a declared payload length exceeds the receiver's limit
  UNKNOWN_TYPE,    // a frame type byte this version does not define
  BAD_MAGIC,       // a HELLO that does not start with the protocol magic
  BAD_VALUE,       // an enum out of range, inconsistent counts, an invalid ggml type, ...
  COUNT,
};
std::string_view proto_error_kind_name(ProtoErrorKind k);

struct ProtoError {
  ProtoErrorKind kind = ProtoErrorKind::BAD_VALUE;
  std::string message;
  Status status() const;  // "protocol error (OVERSIZED): ..."
};
template <typename T>
using ProtoResult = Expected<T, ProtoError>;

struct Frame {
  FrameType type = FrameType::PING;
  std::vector<uint8_t> payload;
};

// Appends the 9-byte header of a frame.
void append_frame_header(FrameType type, uint64_t payload_bytes, std::vector<uint8_t>& out);
// Appends header + payload.
void append_frame(FrameType type, std::span<const uint8_t> payload, std::vector<uint8_t>& out);

class FrameDecoder {
 public:
  explicit FrameDecoder(uint64_t max_payload_bytes = kDefaultMaxPayloadBytes);

  // Consumes bytes of `in` up to the end of the current frame and returns how many it took. Takes
  // nothing while a complete frame waits in take() or after an error.
  size_t feed(std::span<const uint8_t> in);

  bool ready() const { return state_ == State::READY; }
  Frame take();  // precondition: ready()

  // Set once a framing error was seen; the decoder then refuses all further input.
  const std::optional<ProtoError>& error() const { return error_; }
  // True between frames (no partial header or payload buffered): a stream that ends here ended cleanly.
  bool at_boundary() const { return state_ == State::HEADER && header_fill_ == 0; }
  uint64_t max_payload_bytes() const { return max_payload_; }
  // Applies from the next frame header on (a frame being read keeps the limit it was checked against).
  void set_max_payload_bytes(uint64_t n) { max_payload_ = n; }

 private:
  enum class State : uint8_t { HEADER, PAYLOAD, READY, FAILED };
  void fail(ProtoErrorKind kind, std::string message);
  void header_complete();

  uint64_t max_payload_ = 0;
  State state_ = State::HEADER;
  uint8_t header_[kFrameHeaderBytes] = {};
  size_t header_fill_ = 0;
  uint64_t payload_len_ = 0;
  Frame frame_;
  std::optional<ProtoError> error_;
};

// Decodes exactly one frame from a complete buffer (tests, fuzzing, datagram-style transports).
// Refuses leftover bytes after the frame with TRAILING_BYTES and a short buffer with TRUNCATED.
ProtoResult<Frame> decode_one_frame(std::span<const uint8_t> bytes, uint64_t max_payload_bytes);

}  // namespace essaim::proto
