// The messages of the expert protocol, v3 (docs/protocol.md has every byte). One message per frame; the
// frame type names the message. Encoders trust their input (our own code built it: inconsistent counts
// trip ESSAIM_CHECK); decoders trust nothing and return a typed ProtoError.
//
//   ExpertRequest req{.request_id = 7, .layer = 3, .act_type = GgmlType::Q8_K, .act_row_bytes = 3504,
//                     .row_expert_counts = {2, 1},        // row 0 -> experts 17, 40; row 1 -> expert 17
//                     .expert_ids = {17, 40, 17},
//                     .activations = rows};               // [2][3504] bytes, Q8_K
//   std::vector<uint8_t> bytes = encode_message(req);      // one whole frame
//   ...
//   ProtoResult<Message> m = decode_message(frame);        // frame from a FrameDecoder
//   if (auto* r = std::get_if<ExpertRequest>(&*m)) ...
//
// A response carries one row of n_embd per (row, expert) pair, in the request's pair order: row 0's
// experts in the order listed, then row 1's, ... (the backbone maps pair i back to its (token, slot)).
// The request's output format (v3) says how the rows travel: f32, or bf16 (2 bytes a value, the values
// rounded by round_to_bf16_bits, core/expert_output.h); in memory they are floats either way.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/expert_output.h"
#include "core/ggml_type.h"
#include "proto/frame.h"

namespace essaim::proto {

inline constexpr uint16_t kProtocolVersion = 3;
// First four payload bytes of every HELLO: "ESSM".
inline constexpr uint32_t kHelloMagic = 0x4D535345;
static_assert(kHelloMagic == ('E' | 'S' << 8 | 'S' << 16 | 'M' << 24));

// Field limits (bytes); longer human text is truncated by the encoder and refused by the decoder.
inline constexpr size_t kMaxIsaClassBytes = 64;
inline constexpr size_t kMaxLabelBytes = 256;
inline constexpr size_t kMaxReasonBytes = 4096;
// The largest HELLO payload a peer reads before the handshake has completed (docs/protocol.md, "Limits"):
// a real HELLO is ~100 bytes plus 44 per holding, so an unauthenticated peer can make a node hold at most
// this much of its bytes. A worker with more holdings than fit is refused at start, not at handshake.
inline constexpr uint64_t kMaxHelloPayloadBytes = 64 << 10;
// Request id 0 is never used for a request: an ERROR with id 0 is about the connection, not a request.
inline constexpr uint64_t kNoRequestId = 0;

enum class Role : uint8_t { BACKBONE = 1, WORKER = 2, COUNT = 3 };
static_assert(uint8_t(Role::BACKBONE) == 1 && uint8_t(Role::WORKER) == 2);
std::string_view role_name(Role r);

// What a build computes with. Two peers must agree on kernel_abi for results to be bit-identical; the ISA
// class ("avx2", "avx512", "neon", "scalar") is reported, and only compared under a strict policy, because
// every SIMD kernel is tested bit-exact against the scalar reference (docs/invariants.md invariant 1).
struct BuildFingerprint {
  uint32_t kernel_abi = 0;
  std::string isa_class;
  bool operator==(const BuildFingerprint&) const = default;
};

// 32-byte content hash of the source model's GGUF header and tensor table (the same for the full file,
// its backbone file and every slice cut from it).
using ModelId = std::array<uint8_t, 32>;
std::string model_id_hex(const ModelId& id);

// SHA-256 of the bytes a holding computes with (slice/expert_digest.h): the identity of the weights
// themselves, where ModelId only names the layout.
using ContentDigest = std::array<uint8_t, 32>;

// Experts [first_expert, first_expert + expert_count) of one layer, and the digest of their bytes.
struct Holding {
  uint32_t layer = 0;
  uint32_t first_expert = 0;
  uint32_t expert_count = 0;
  ContentDigest sha256{};  // holding digest: SHA-256 over the experts' own digests, in expert order
  bool operator==(const Holding&) const = default;
};
inline constexpr uint64_t kHoldingWireBytes = 4 + 4 + 4 + 32;  // layer, first, count, sha256

struct Hello {
  uint16_t version = kProtocolVersion;  // a HELLO of another version is decoded up to here only
  Role role = Role::WORKER;
  BuildFingerprint fingerprint;
  ModelId model{};
  uint64_t max_payload_bytes = kDefaultMaxPayloadBytes;  // the largest payload this peer will accept
  std::string label;                                     // a human name for logs ("pixel-7 #2")
  std::vector<Holding> holdings;                         // empty for a backbone
  bool operator==(const Hello&) const = default;
};

struct HelloAck {
  bool operator==(const HelloAck&) const = default;
};

enum class RefuseReason : uint8_t {
  VERSION = 1,      // protocol versions differ
  FINGERPRINT = 2,  // kernel ABI (or, under a strict policy, ISA class) differs
  MODEL = 3,        // the peers hold different models
  ROLE = 4,         // two backbones or two workers
  LIMITS = 5,       // a frame limit too small to work with
  BAD_HELLO = 6,    // the first frame was not a well-formed HELLO
  WEIGHTS = 7,      // v2: a holding's content digest differs from the backbone's bytes for those experts
  BUSY = 8,         // v2: admission limits (too many connections, from this address or in all)
  COUNT = 9,
};
static_assert(uint8_t(RefuseReason::VERSION) == 1 && uint8_t(RefuseReason::BAD_HELLO) == 6 &&
              uint8_t(RefuseReason::WEIGHTS) == 7 && uint8_t(RefuseReason::BUSY) == 8);
std::string_view refuse_reason_name(RefuseReason r);

struct Refuse {
  RefuseReason reason = RefuseReason::VERSION;
  std::string message;
  bool operator==(const Refuse&) const = default;
};

struct ExpertRequest {
  uint64_t request_id = 1;
  uint32_t layer = 0;
  // Activations in the form the expert kernel consumes: the vec_dot type of the expert's gate/up
  // weights (Q8_K for K-quants), or F32 (the worker then quantises each row itself, with the same result).
  GgmlType act_type = GgmlType::F32;
  uint64_t act_row_bytes = 0;                // bytes of one activation row
  ExpertOutput output = ExpertOutput::F32;   // v3: the precision the answer's rows are rounded to and sent in
  std::vector<uint32_t> row_expert_counts;   // [n_rows] experts this worker computes for each row
  std::vector<uint32_t> expert_ids;          // [n_pairs] expert indices within the layer, row-major
  std::vector<uint8_t> activations;          // [n_rows][act_row_bytes]
  size_t n_rows() const { return row_expert_counts.size(); }
  size_t n_pairs() const { return expert_ids.size(); }
  bool operator==(const ExpertRequest&) const = default;
};

struct ExpertResponse {
  uint64_t request_id = 1;
  uint32_t n_outputs = 0;      // = the request's n_pairs
  uint32_t n_embd = 0;
  ExpertOutput output = ExpertOutput::F32;  // v3: = the request's; BF16 rows are encoded rounded (2 bytes a value)
  std::vector<float> outputs;  // [n_outputs][n_embd], in the request's pair order
  bool operator==(const ExpertResponse&) const = default;  // compares float values; tests use bit patterns
};

enum class ErrorCode : uint8_t {
  UNKNOWN_EXPERT = 1,  // an expert id outside this worker's holdings for that layer
  WRONG_LAYER = 2,     // the worker holds no expert of that layer
  BAD_SHAPE = 3,       // row size does not match the layer's n_embd, counts inconsistent with the slice
  BAD_ENCODING = 4,    // an activation type the layer's kernels do not consume
  OVERLOADED = 5,      // too many requests in flight; retry elsewhere or compute locally
  INTERNAL = 6,        // the worker failed; its message says how
  MALFORMED = 7,       // the peer's bytes could not be decoded; the sender closes after this
  UNEXPECTED = 8,      // a well-formed message that is not valid now (a request before the handshake)
  COUNT = 9,
};
static_assert(uint8_t(ErrorCode::UNKNOWN_EXPERT) == 1 && uint8_t(ErrorCode::INTERNAL) == 6 &&
              uint8_t(ErrorCode::UNEXPECTED) == 8);
std::string_view error_code_name(ErrorCode c);

struct ExpertError {
  uint64_t request_id = kNoRequestId;
  ErrorCode code = ErrorCode::INTERNAL;
  std::string message;
  bool operator==(const ExpertError&) const = default;
};

struct Ping {
  uint64_t nonce = 0;
  bool operator==(const Ping&) const = default;
};
struct Pong {
  uint64_t nonce = 0;  // echoes the PING's
  bool operator==(const Pong&) const = default;
};
struct Goodbye {
  std::string message;
  bool operator==(const Goodbye&) const = default;
};

using Message = std::variant<Hello, HelloAck, Refuse, ExpertRequest, ExpertResponse, ExpertError, Ping, Pong,
                             Goodbye>;
FrameType message_frame_type(const Message& m);

// Payload sizes, for senders that split work to fit the peer's limit before building anything.
uint64_t expert_request_payload_bytes(uint64_t n_rows, uint64_t n_pairs, uint64_t act_row_bytes);
uint64_t expert_response_payload_bytes(uint64_t n_outputs, uint64_t n_embd, ExpertOutput output = ExpertOutput::F32);

// Structural consistency of a request (counts sum to n_pairs, rows sized, type valid). The decoder runs it
// on every request; senders may run it before encoding.
ProtoResult<void> validate_expert_request(const ExpertRequest& r);

// Payload bytes encode_message will produce for m (without encoding it).
uint64_t message_payload_bytes(const Message& m);

// Appends one whole frame (header + payload) to out.
void append_message_frame(const Message& m, std::vector<uint8_t>& out);
std::vector<uint8_t> encode_message(const Message& m);

// Decodes a frame's payload as the message its type names; every count is checked against the bytes
// that remain before anything is allocated, and leftover bytes are refused.
ProtoResult<Message> decode_message(FrameType type, std::span<const uint8_t> payload);
inline ProtoResult<Message> decode_message(const Frame& f) { return decode_message(f.type, f.payload); }

}  // namespace essaim::proto
