#include "proto/messages.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <type_traits>

#include "proto/wire.h"

namespace essaim::proto {

namespace {

ProtoError err(ProtoErrorKind kind, std::string message) { return ProtoError{kind, std::move(message)}; }
ProtoError truncated(std::string_view what) {
  return err(ProtoErrorKind::TRUNCATED, "payload ends inside " + std::string(what));
}

std::string_view clip(std::string_view s, size_t max) { return s.substr(0, std::min(s.size(), max)); }

// The byte offset is part of every message so that a transcript can be checked by hand against the doc.
ProtoResult<void> finish(const WireReader& r, FrameType type) {
  if (r.at_end()) return {};
  return err(ProtoErrorKind::TRAILING_BYTES, std::to_string(r.remaining()) + " bytes after the end of a " +
                                                 std::string(frame_type_name(type)) + " message (offset " +
                                                 std::to_string(r.position()) + ")");
}

bool read_str(WireReader& r, std::string& out, size_t max, std::string_view what, ProtoError& e) {
  size_t at = r.position();
  if (!r.str16(out)) {
    e = truncated(what);
    return false;
  }
  if (out.size() > max) {
    e = err(ProtoErrorKind::BAD_VALUE, std::string(what) + " at offset " + std::to_string(at) + " is " +
                                           std::to_string(out.size()) + " bytes, over the limit of " +
                                           std::to_string(max));
    return false;
  }
  return true;
}

// ---- encoders ---------------------------------------------------------------------------------------

void put(WireWriter& w, const Hello& m) {
  ESSAIM_CHECK(m.fingerprint.isa_class.size() <= kMaxIsaClassBytes);
  ESSAIM_CHECK(m.label.size() <= kMaxLabelBytes);
  w.u32(kHelloMagic);
  w.u16(m.version);
  w.u8(uint8_t(m.role));
  w.u32(m.fingerprint.kernel_abi);
  w.str16(m.fingerprint.isa_class);
  w.bytes(m.model);
  w.u64(m.max_payload_bytes);
  w.str16(m.label);
  w.u32(static_cast<uint32_t>(m.holdings.size()));
  for (const Holding& h : m.holdings) {
    w.u32(h.layer);
    w.u32(h.first_expert);
    w.u32(h.expert_count);
    w.bytes(h.sha256);
  }
}
void put(WireWriter&, const HelloAck&) {}
void put(WireWriter& w, const Refuse& m) {
  w.u8(uint8_t(m.reason));
  w.str16(clip(m.message, kMaxReasonBytes));
}
void put(WireWriter& w, const ExpertRequest& m) {
  ESSAIM_CHECK(validate_expert_request(m).is_ok());
  w.u64(m.request_id);
  w.u32(m.layer);
  w.u32(static_cast<uint32_t>(m.n_rows()));
  w.u32(static_cast<uint32_t>(m.n_pairs()));
  w.i32(int32_t(m.act_type));
  w.u64(m.act_row_bytes);
  w.u8(uint8_t(m.output));
  w.array(std::span<const uint32_t>(m.row_expert_counts));
  w.array(std::span<const uint32_t>(m.expert_ids));
  w.bytes(m.activations);
}
void put(WireWriter& w, const ExpertResponse& m) {
  ESSAIM_CHECK(uint64_t(m.n_outputs) * m.n_embd == m.outputs.size());
  w.u64(m.request_id);
  w.u32(m.n_outputs);
  w.u32(m.n_embd);
  w.u8(uint8_t(m.output));
  if (m.output == ExpertOutput::BF16) {
    // The rounding happens here for a worker that computed f32 rows; rows already rounded are kept as they
    // are (round_to_bf16_bits is exact on bf16 values, NaN payloads included).
    std::vector<uint16_t> half(m.outputs.size());
    for (size_t i = 0; i < half.size(); ++i) half[i] = round_to_bf16_bits(m.outputs[i]);
    w.array(std::span<const uint16_t>(half));
  } else {
    w.array(std::span<const float>(m.outputs));
  }
}
void put(WireWriter& w, const ExpertError& m) {
  w.u64(m.request_id);
  w.u8(uint8_t(m.code));
  w.str16(clip(m.message, kMaxReasonBytes));
}
void put(WireWriter& w, const Ping& m) { w.u64(m.nonce); }
void put(WireWriter& w, const Pong& m) { w.u64(m.nonce); }
void put(WireWriter& w, const Goodbye& m) { w.str16(clip(m.message, kMaxReasonBytes)); }

// ---- decoders ---------------------------------------------------------------------------------------

ProtoResult<Message> get_hello(WireReader& r) {
  Hello m;
  uint32_t magic = 0;
  if (!r.u32(magic)) return truncated("HELLO magic");
  if (magic != kHelloMagic) return err(ProtoErrorKind::BAD_MAGIC, "HELLO does not start with \"ESSM\"");
  if (!r.u16(m.version)) return truncated("HELLO version");
  // The magic and version prefix is frozen across versions; what follows is this version's layout, which a peer
  // of another version may not share. The caller refuses on the version alone.
  if (m.version != kProtocolVersion) return Message(std::move(m));
  uint8_t role = 0;
  if (!r.u8(role)) return truncated("HELLO role");
  if (role == 0 || role >= uint8_t(Role::COUNT)) {
    return err(ProtoErrorKind::BAD_VALUE, "HELLO role " + std::to_string(role) + " is not a role");
  }
  m.role = Role(role);
  if (!r.u32(m.fingerprint.kernel_abi)) return truncated("HELLO kernel ABI");
  ProtoError e;
  if (!read_str(r, m.fingerprint.isa_class, kMaxIsaClassBytes, "HELLO ISA class", e)) return e;
  std::span<const uint8_t> model;
  if (!r.view(m.model.size(), model)) return truncated("HELLO model id");
  std::memcpy(m.model.data(), model.data(), model.size());
  if (!r.u64(m.max_payload_bytes)) return truncated("HELLO max payload");
  if (!read_str(r, m.label, kMaxLabelBytes, "HELLO label", e)) return e;
  uint32_t n = 0;
  if (!r.u32(n)) return truncated("HELLO holding count");
  if (!r.fits(n, kHoldingWireBytes)) {
    return err(ProtoErrorKind::TRUNCATED, "HELLO declares " + std::to_string(n) + " holdings but only " +
                                              std::to_string(r.remaining()) + " bytes follow");
  }
  m.holdings.resize(n);
  for (Holding& h : m.holdings) {
    std::span<const uint8_t> digest;
    (void)(r.u32(h.layer) && r.u32(h.first_expert) && r.u32(h.expert_count) &&
           r.view(h.sha256.size(), digest));  // fits() checked above
    std::memcpy(h.sha256.data(), digest.data(), digest.size());
    if (h.expert_count == 0 || uint64_t(h.first_expert) + h.expert_count > (uint64_t(1) << 32)) {
      return err(ProtoErrorKind::BAD_VALUE, "HELLO holding of layer " + std::to_string(h.layer) +
                                                " has an empty or wrapping expert range");
    }
  }
  if (auto f = finish(r, FrameType::HELLO); !f) return f.error();
  return Message(std::move(m));
}

ProtoResult<Message> get_refuse(WireReader& r) {
  Refuse m;
  uint8_t reason = 0;
  if (!r.u8(reason)) return truncated("REFUSE reason");
  if (reason == 0 || reason >= uint8_t(RefuseReason::COUNT)) {
    return err(ProtoErrorKind::BAD_VALUE, "REFUSE reason " + std::to_string(reason) + " is not a reason");
  }
  m.reason = RefuseReason(reason);
  ProtoError e;
  if (!read_str(r, m.message, kMaxReasonBytes, "REFUSE message", e)) return e;
  if (auto f = finish(r, FrameType::REFUSE); !f) return f.error();
  return Message(std::move(m));
}

ProtoResult<Message> get_request(WireReader& r) {
  ExpertRequest m;
  uint32_t n_rows = 0, n_pairs = 0;
  int32_t type_id = 0;
  uint8_t output = 0;
  if (!(r.u64(m.request_id) && r.u32(m.layer) && r.u32(n_rows) && r.u32(n_pairs) && r.i32(type_id) &&
        r.u64(m.act_row_bytes) && r.u8(output))) {
    return truncated("EXPERT_REQUEST header");
  }
  if (output >= uint8_t(ExpertOutput::COUNT)) {
    return err(ProtoErrorKind::BAD_VALUE, "EXPERT_REQUEST output format " + std::to_string(output) +
                                              " is not 0 (f32) or 1 (bf16)");
  }
  m.output = ExpertOutput(output);
  std::optional<GgmlType> type = ggml_type_from_id(type_id);
  if (!type || type_traits(*type).block_size == 0) {
    return err(ProtoErrorKind::BAD_VALUE, "EXPERT_REQUEST activation type " + std::to_string(type_id) +
                                              " is not a ggml type");
  }
  m.act_type = *type;
  // Every count is checked against the bytes that remain before a vector grows: n_rows counts, n_pairs
  // ids, then n_rows rows whose size is checked by division so that n_rows * row_bytes cannot overflow.
  if (!r.array(n_rows, m.row_expert_counts)) {
    return truncated("EXPERT_REQUEST row counts (" + std::to_string(n_rows) + " rows)");
  }
  if (!r.array(n_pairs, m.expert_ids)) {
    return truncated("EXPERT_REQUEST expert ids (" + std::to_string(n_pairs) + " pairs)");
  }
  if (m.act_row_bytes == 0 || !r.fits(n_rows, m.act_row_bytes)) {
    return m.act_row_bytes == 0 ? err(ProtoErrorKind::BAD_VALUE, "EXPERT_REQUEST activation rows of 0 bytes")
                                : truncated("EXPERT_REQUEST activation rows");
  }
  std::span<const uint8_t> rows;
  (void)r.view(n_rows * m.act_row_bytes, rows);  // fits() checked above
  m.activations.assign(rows.begin(), rows.end());
  if (auto f = finish(r, FrameType::EXPERT_REQUEST); !f) return f.error();
  if (auto v = validate_expert_request(m); !v) return v.error();
  return Message(std::move(m));
}

ProtoResult<Message> get_response(WireReader& r) {
  ExpertResponse m;
  uint8_t output = 0;
  if (!(r.u64(m.request_id) && r.u32(m.n_outputs) && r.u32(m.n_embd) && r.u8(output))) {
    return truncated("EXPERT_RESPONSE header");
  }
  if (output >= uint8_t(ExpertOutput::COUNT)) {
    return err(ProtoErrorKind::BAD_VALUE, "EXPERT_RESPONSE output format " + std::to_string(output) +
                                              " is not 0 (f32) or 1 (bf16)");
  }
  m.output = ExpertOutput(output);
  // u32 * u32 fits in u64; fits() divides, so the byte count cannot overflow either.
  const uint64_t n_values = uint64_t(m.n_outputs) * m.n_embd;
  const std::string what = "EXPERT_RESPONSE outputs (" + std::to_string(m.n_outputs) + " x " +
                           std::to_string(m.n_embd) + " " + std::string(expert_output_name(m.output)) + ")";
  if (m.output == ExpertOutput::BF16) {
    std::vector<uint16_t> half;
    if (!r.array(n_values, half)) return truncated(what);
    m.outputs.resize(half.size());
    for (size_t i = 0; i < half.size(); ++i) m.outputs[i] = bf16_to_f32(half[i]);
  } else if (!r.array(n_values, m.outputs)) {
    return truncated(what);
  }
  if (auto f = finish(r, FrameType::EXPERT_RESPONSE); !f) return f.error();
  return Message(std::move(m));
}

ProtoResult<Message> get_error(WireReader& r) {
  ExpertError m;
  uint8_t code = 0;
  if (!(r.u64(m.request_id) && r.u8(code))) return truncated("ERROR header");
  if (code == 0 || code >= uint8_t(ErrorCode::COUNT)) {
    return err(ProtoErrorKind::BAD_VALUE, "ERROR code " + std::to_string(code) + " is not an error code");
  }
  m.code = ErrorCode(code);
  ProtoError e;
  if (!read_str(r, m.message, kMaxReasonBytes, "ERROR message", e)) return e;
  if (auto f = finish(r, FrameType::ERROR); !f) return f.error();
  return Message(std::move(m));
}

template <typename T>
ProtoResult<Message> get_nonce(WireReader& r, FrameType type) {
  T m;
  if (!r.u64(m.nonce)) return truncated(frame_type_name(type));
  if (auto f = finish(r, type); !f) return f.error();
  return Message(m);
}

ProtoResult<Message> get_goodbye(WireReader& r) {
  Goodbye m;
  ProtoError e;
  if (!read_str(r, m.message, kMaxReasonBytes, "GOODBYE message", e)) return e;
  if (auto f = finish(r, FrameType::GOODBYE); !f) return f.error();
  return Message(std::move(m));
}

}  // namespace

std::string_view role_name(Role r) {
  switch (r) {
    case Role::BACKBONE: return "backbone";
    case Role::WORKER: return "worker";
    case Role::COUNT: break;
  }
  return "?";
}

std::string_view refuse_reason_name(RefuseReason r) {
  switch (r) {
    case RefuseReason::VERSION: return "VERSION";
    case RefuseReason::FINGERPRINT: return "FINGERPRINT";
    case RefuseReason::MODEL: return "MODEL";
    case RefuseReason::ROLE: return "ROLE";
    case RefuseReason::LIMITS: return "LIMITS";
    case RefuseReason::BAD_HELLO: return "BAD_HELLO";
    case RefuseReason::WEIGHTS: return "WEIGHTS";
    case RefuseReason::BUSY: return "BUSY";
    case RefuseReason::COUNT: break;
  }
  return "?";
}

std::string_view error_code_name(ErrorCode c) {
  switch (c) {
    case ErrorCode::UNKNOWN_EXPERT: return "UNKNOWN_EXPERT";
    case ErrorCode::WRONG_LAYER: return "WRONG_LAYER";
    case ErrorCode::BAD_SHAPE: return "BAD_SHAPE";
    case ErrorCode::BAD_ENCODING: return "BAD_ENCODING";
    case ErrorCode::OVERLOADED: return "OVERLOADED";
    case ErrorCode::INTERNAL: return "INTERNAL";
    case ErrorCode::MALFORMED: return "MALFORMED";
    case ErrorCode::UNEXPECTED: return "UNEXPECTED";
    case ErrorCode::COUNT: break;
  }
  return "?";
}

std::string model_id_hex(const ModelId& id) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (uint8_t b : id) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

FrameType message_frame_type(const Message& m) {
  // Variant alternatives are listed in frame-type order: HELLO is index 0, GOODBYE index 8.
  static_assert(std::variant_size_v<Message> == size_t(FrameType::COUNT) - 1);
  static_assert(std::is_same_v<std::variant_alternative_t<3, Message>, ExpertRequest> &&
                uint8_t(FrameType::EXPERT_REQUEST) == 3 + 1);
  static_assert(std::is_same_v<std::variant_alternative_t<5, Message>, ExpertError> &&
                uint8_t(FrameType::ERROR) == 5 + 1);
  return FrameType(static_cast<uint8_t>(m.index() + 1));
}

uint64_t expert_request_payload_bytes(uint64_t n_rows, uint64_t n_pairs, uint64_t act_row_bytes) {
  return 8 + 4 + 4 + 4 + 4 + 8 + 1 + 4 * n_rows + 4 * n_pairs + n_rows * act_row_bytes;
}

uint64_t expert_response_payload_bytes(uint64_t n_outputs, uint64_t n_embd, ExpertOutput output) {
  return 8 + 4 + 4 + 1 + expert_output_value_bytes(output) * n_outputs * n_embd;
}

ProtoResult<void> validate_expert_request(const ExpertRequest& r) {
  const TypeTraits& t = type_traits(r.act_type);
  if (t.block_size == 0) return err(ProtoErrorKind::BAD_VALUE, "activation type is a removed ggml type");
  if (r.act_row_bytes == 0 || r.act_row_bytes % t.type_size != 0) {
    return err(ProtoErrorKind::BAD_VALUE, "activation row of " + std::to_string(r.act_row_bytes) +
                                              " bytes is not a whole number of " + std::string(t.name) +
                                              " blocks");
  }
  if (r.row_expert_counts.size() > UINT32_MAX || r.expert_ids.size() > UINT32_MAX) {
    return err(ProtoErrorKind::BAD_VALUE, "more than 2^32 rows or pairs in one request");
  }
  uint64_t sum = 0;  // n_rows < 2^32 counts of < 2^32 each: no overflow in 64 bits
  for (uint32_t c : r.row_expert_counts) sum += c;
  if (sum != r.expert_ids.size()) {
    return err(ProtoErrorKind::BAD_VALUE, "row expert counts add up to " + std::to_string(sum) + " but " +
                                              std::to_string(r.expert_ids.size()) + " expert ids are listed");
  }
  if (r.activations.size() / r.act_row_bytes != r.n_rows() || r.activations.size() % r.act_row_bytes != 0) {
    return err(ProtoErrorKind::BAD_VALUE, std::to_string(r.activations.size()) + " activation bytes for " +
                                              std::to_string(r.n_rows()) + " rows of " +
                                              std::to_string(r.act_row_bytes) + " bytes");
  }
  return {};
}

uint64_t message_payload_bytes(const Message& m) {
  auto text = [](const std::string& s) { return 2 + uint64_t(std::min(s.size(), kMaxReasonBytes)); };
  struct Size {
    decltype(text)& t;
    uint64_t operator()(const Hello& h) const {
      return 4 + 2 + 1 + 4 + 2 + h.fingerprint.isa_class.size() + 32 + 8 + 2 + h.label.size() + 4 +
             kHoldingWireBytes * uint64_t(h.holdings.size());
    }
    uint64_t operator()(const HelloAck&) const { return 0; }
    uint64_t operator()(const Refuse& r) const { return 1 + t(r.message); }
    uint64_t operator()(const ExpertRequest& r) const {
      return expert_request_payload_bytes(r.n_rows(), r.n_pairs(), r.act_row_bytes);
    }
    uint64_t operator()(const ExpertResponse& r) const {
      return expert_response_payload_bytes(r.n_outputs, r.n_embd, r.output);
    }
    uint64_t operator()(const ExpertError& e) const { return 8 + 1 + t(e.message); }
    uint64_t operator()(const Ping&) const { return 8; }
    uint64_t operator()(const Pong&) const { return 8; }
    uint64_t operator()(const Goodbye& g) const { return t(g.message); }
  };
  return std::visit(Size{text}, m);
}

void append_message_frame(const Message& m, std::vector<uint8_t>& out) {
  const size_t start = out.size();
  const uint64_t len = message_payload_bytes(m);
  // One allocation of the exact size: a 16 MiB response grown by doubling would be copied and faulted in
  // several times over.
  out.reserve(start + kFrameHeaderBytes + len);
  append_frame_header(message_frame_type(m), len, out);
  WireWriter w(out);
  std::visit([&](const auto& msg) { put(w, msg); }, m);
  ESSAIM_CHECK(out.size() - start - kFrameHeaderBytes == len);
}

std::vector<uint8_t> encode_message(const Message& m) {
  std::vector<uint8_t> out;
  append_message_frame(m, out);
  return out;
}

ProtoResult<Message> decode_message(FrameType type, std::span<const uint8_t> payload) {
  WireReader r(payload);
  switch (type) {
    case FrameType::HELLO: return get_hello(r);
    case FrameType::HELLO_ACK:
      if (auto f = finish(r, type); !f) return f.error();
      return Message(HelloAck{});
    case FrameType::REFUSE: return get_refuse(r);
    case FrameType::EXPERT_REQUEST: return get_request(r);
    case FrameType::EXPERT_RESPONSE: return get_response(r);
    case FrameType::ERROR: return get_error(r);
    case FrameType::PING: return get_nonce<Ping>(r, type);
    case FrameType::PONG: return get_nonce<Pong>(r, type);
    case FrameType::GOODBYE: return get_goodbye(r);
    case FrameType::COUNT: break;
  }
  return err(ProtoErrorKind::UNKNOWN_TYPE, "frame type " + std::to_string(uint8_t(type)) + " has no message");
}

}  // namespace essaim::proto
