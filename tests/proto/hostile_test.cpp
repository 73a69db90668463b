// Hostile input (label: sanitize): truncated, malformed, oversized and randomly mutated bytes are refused
// with a typed error, never a crash, an abort or an allocation sized by the attacker.
#include <gtest/gtest.h>

#include <random>

#include "proto/frame.h"
#include "proto/messages.h"
#include "proto/wire.h"
#include "test_messages.h"

namespace essaim::proto {
namespace {

std::vector<uint8_t> payload_of(const Message& m) {
  std::vector<uint8_t> b = encode_message(m);
  return {b.begin() + kFrameHeaderBytes, b.end()};
}

ProtoErrorKind decode_error(FrameType type, const std::vector<uint8_t>& payload) {
  ProtoResult<Message> m = decode_message(type, payload);
  EXPECT_FALSE(m) << frame_type_name(type) << " decoded from hostile bytes";
  return m ? ProtoErrorKind::COUNT : m.error().kind;
}

TEST(Hostile, LengthWithHighBitsSetIsOversizedNotAnAllocation) {
  for (uint64_t len : std::vector<uint64_t>{~0ull, 1ull << 63, (1ull << 63) | 5, 1ull << 40, kDefaultMaxPayloadBytes + 1}) {
    std::vector<uint8_t> header;
    append_frame_header(FrameType::EXPERT_REQUEST, len, header);
    FrameDecoder dec;
    EXPECT_EQ(dec.feed(header), kFrameHeaderBytes);
    ASSERT_TRUE(dec.error()) << len;
    EXPECT_EQ(dec.error()->kind, ProtoErrorKind::OVERSIZED) << len;
  }
}

TEST(Hostile, UnknownTypeRefusedOnItsFirstByte) {
  for (uint8_t t : {uint8_t(0), uint8_t(FrameType::COUNT), uint8_t(0x47), uint8_t(0x16), uint8_t(255)}) {
    FrameDecoder dec;
    EXPECT_EQ(dec.feed(std::vector<uint8_t>{t}), 1u);
    ASSERT_TRUE(dec.error()) << int(t);
    EXPECT_EQ(dec.error()->kind, ProtoErrorKind::UNKNOWN_TYPE);
  }
  // A stray HTTP client is refused at once, not after it sent 9 bytes.
  std::string http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  ProtoResult<Frame> f = decode_one_frame({reinterpret_cast<const uint8_t*>(http.data()), http.size()}, 1 << 20);
  ASSERT_FALSE(f);
  EXPECT_EQ(f.error().kind, ProtoErrorKind::UNKNOWN_TYPE);
}

TEST(Hostile, TruncatedFrameAndTrailingBytes) {
  std::vector<uint8_t> bytes = encode_message(Ping{5});
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    ProtoResult<Frame> f = decode_one_frame(std::span(bytes).first(cut), 1 << 20);
    ASSERT_FALSE(f) << cut;
    EXPECT_EQ(f.error().kind, ProtoErrorKind::TRUNCATED) << cut;
  }
  bytes.push_back(0);
  ProtoResult<Frame> f = decode_one_frame(bytes, 1 << 20);
  ASSERT_FALSE(f);
  EXPECT_EQ(f.error().kind, ProtoErrorKind::TRAILING_BYTES);
}

TEST(Hostile, EveryPrefixOfEveryMessageIsTruncatedAndExtraBytesAreRefused) {
  for (const Message& m : testing::sample_messages(9)) {
    FrameType type = message_frame_type(m);
    std::vector<uint8_t> payload = payload_of(m);
    for (size_t cut = 0; cut < payload.size(); ++cut) {
      std::vector<uint8_t> prefix(payload.begin(), payload.begin() + cut);
      EXPECT_EQ(decode_error(type, prefix), ProtoErrorKind::TRUNCATED) << frame_type_name(type) << " cut " << cut;
    }
    payload.push_back(0x5A);
    EXPECT_EQ(decode_error(type, payload), ProtoErrorKind::TRAILING_BYTES) << frame_type_name(type);
  }
}

// Builds an EXPERT_REQUEST payload field by field, so that counts can lie about what follows.
std::vector<uint8_t> request_payload(uint32_t n_rows, uint32_t n_pairs, int32_t type, uint64_t row_bytes,
                                     size_t tail_bytes, uint8_t output_format = 0) {
  std::vector<uint8_t> p;
  WireWriter w(p);
  w.u64(1);
  w.u32(0);
  w.u32(n_rows);
  w.u32(n_pairs);
  w.i32(type);
  w.u64(row_bytes);
  w.u8(output_format);  // v3
  p.resize(p.size() + tail_bytes, 0);
  return p;
}

TEST(Hostile, RequestCountsAreCheckedBeforeAllocation) {
  const int32_t q8k = int32_t(GgmlType::Q8_K);
  // Huge counts against a small payload: refused without a 16 GiB vector.
  EXPECT_EQ(decode_error(FrameType::EXPERT_REQUEST, request_payload(0xFFFFFFFF, 0, q8k, 292, 64)),
            ProtoErrorKind::TRUNCATED);
  EXPECT_EQ(decode_error(FrameType::EXPERT_REQUEST, request_payload(1, 0xFFFFFFFF, q8k, 292, 64)),
            ProtoErrorKind::TRUNCATED);
  // n_rows * row_bytes would overflow 64 bits.
  EXPECT_EQ(decode_error(FrameType::EXPERT_REQUEST, request_payload(2, 0, q8k, 1ull << 63, 8)),
            ProtoErrorKind::TRUNCATED);
  // Types: out of range, a removed id, rows that are not whole blocks, empty rows.
  EXPECT_EQ(decode_error(FrameType::EXPERT_REQUEST, request_payload(0, 0, 99, 292, 0)), ProtoErrorKind::BAD_VALUE);
  EXPECT_EQ(decode_error(FrameType::EXPERT_REQUEST, request_payload(0, 0, -1, 292, 0)), ProtoErrorKind::BAD_VALUE);
  EXPECT_EQ(decode_error(FrameType::EXPERT_REQUEST, request_payload(0, 0, 4, 292, 0)), ProtoErrorKind::BAD_VALUE);
  EXPECT_EQ(decode_error(FrameType::EXPERT_REQUEST, request_payload(1, 0, q8k, 291, 4 + 291)),
            ProtoErrorKind::BAD_VALUE);
  EXPECT_EQ(decode_error(FrameType::EXPERT_REQUEST, request_payload(1, 0, q8k, 0, 4)), ProtoErrorKind::BAD_VALUE);
  // Counts that do not add up to n_pairs: one row claims 3 experts, 2 ids follow.
  std::vector<uint8_t> p = request_payload(1, 2, q8k, 292, 0);
  WireWriter w(p);
  w.u32(3);
  w.u32(10);
  w.u32(11);
  p.resize(p.size() + 292, 0);
  EXPECT_EQ(decode_error(FrameType::EXPERT_REQUEST, p), ProtoErrorKind::BAD_VALUE);
  // An output format other than f32 (0) or bf16 (1), checked before any count is trusted.
  for (uint8_t f : {uint8_t(2), uint8_t(255)})
    EXPECT_EQ(decode_error(FrameType::EXPERT_REQUEST, request_payload(0xFFFFFFFF, 0, q8k, 292, 64, f)),
              ProtoErrorKind::BAD_VALUE);
}

TEST(Hostile, ResponseCountsAreCheckedBeforeAllocation) {
  std::vector<uint8_t> p;
  WireWriter w(p);
  w.u64(1);
  w.u32(0xFFFFFFFF);
  w.u32(0xFFFFFFFF);
  p.resize(p.size() + 64);  // output format 0 (f32), then too few bytes
  EXPECT_EQ(decode_error(FrameType::EXPERT_RESPONSE, p), ProtoErrorKind::TRUNCATED);
  p[16] = 1;  // bf16: half the bytes per value, still refused before allocating
  EXPECT_EQ(decode_error(FrameType::EXPERT_RESPONSE, p), ProtoErrorKind::TRUNCATED);
  p[16] = 2;
  EXPECT_EQ(decode_error(FrameType::EXPERT_RESPONSE, p), ProtoErrorKind::BAD_VALUE);
}

TEST(Hostile, HelloFieldsValidated) {
  std::mt19937_64 rng(3);
  Hello h = testing::sample_hello(rng, Role::WORKER);
  std::vector<uint8_t> good = payload_of(h);

  std::vector<uint8_t> bad_magic = good;
  bad_magic[0] = 'X';
  EXPECT_EQ(decode_error(FrameType::HELLO, bad_magic), ProtoErrorKind::BAD_MAGIC);

  for (uint8_t role : {uint8_t(0), uint8_t(Role::COUNT), uint8_t(200)}) {
    std::vector<uint8_t> bad_role = good;
    bad_role[6] = role;  // after magic (4) and version (2)
    EXPECT_EQ(decode_error(FrameType::HELLO, bad_role), ProtoErrorKind::BAD_VALUE) << int(role);
  }

  // A holding count that promises more than the payload holds.
  std::vector<uint8_t> many = good;
  size_t count_at = good.size() - 4 - kHoldingWireBytes * h.holdings.size();
  many[count_at + 3] = 0x7F;
  EXPECT_EQ(decode_error(FrameType::HELLO, many), ProtoErrorKind::TRUNCATED);

  // An empty expert range.
  Hello empty = h;
  empty.holdings[1].expert_count = 0;
  EXPECT_EQ(decode_error(FrameType::HELLO, payload_of(empty)), ProtoErrorKind::BAD_VALUE);
  // A range that wraps past 2^32.
  Hello wrap = h;
  wrap.holdings[0] = {0, 0xFFFFFFF0u, 0x20};
  EXPECT_EQ(decode_error(FrameType::HELLO, payload_of(wrap)), ProtoErrorKind::BAD_VALUE);

  // An ISA class string over its limit (the encoder refuses to write one, so build it by hand).
  std::vector<uint8_t> long_isa;
  WireWriter w(long_isa);
  w.u32(kHelloMagic);
  w.u16(kProtocolVersion);
  w.u8(uint8_t(Role::WORKER));
  w.u32(3);
  w.str16(std::string(kMaxIsaClassBytes + 1, 'a'));
  long_isa.resize(long_isa.size() + 32 + 8 + 2 + 4, 0);
  EXPECT_EQ(decode_error(FrameType::HELLO, long_isa), ProtoErrorKind::BAD_VALUE);
}

TEST(Hostile, EnumsOutOfRange) {
  EXPECT_EQ(decode_error(FrameType::REFUSE, {0, 0, 0}), ProtoErrorKind::BAD_VALUE);
  EXPECT_EQ(decode_error(FrameType::REFUSE, {uint8_t(RefuseReason::COUNT), 0, 0}), ProtoErrorKind::BAD_VALUE);
  std::vector<uint8_t> e(8, 0);
  e.push_back(uint8_t(ErrorCode::COUNT));
  e.push_back(0);
  e.push_back(0);
  EXPECT_EQ(decode_error(FrameType::ERROR, e), ProtoErrorKind::BAD_VALUE);
  e[8] = 0;
  EXPECT_EQ(decode_error(FrameType::ERROR, e), ProtoErrorKind::BAD_VALUE);
  EXPECT_EQ(decode_error(FrameType::HELLO_ACK, {1}), ProtoErrorKind::TRAILING_BYTES);
}

TEST(Hostile, RandomMutationsNeverCrash) {
  // Flip, insert and delete bytes of valid frames; decoding must end in a frame or a typed error. The
  // counts of each outcome show the mutations reach past the framing into the message decoders.
  std::mt19937_64 rng(2024);
  std::vector<Message> all = testing::sample_messages(4);
  size_t ok = 0, framing_errors = 0, message_errors = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::vector<uint8_t> b = encode_message(all[iter % all.size()]);
    int edits = 1 + int(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      size_t at = rng() % b.size();
      switch (rng() % 3) {
        case 0: b[at] ^= uint8_t(1 + rng() % 255); break;
        case 1: b.insert(b.begin() + at, uint8_t(rng())); break;
        default: if (b.size() > 1) b.erase(b.begin() + at); break;
      }
    }
    FrameDecoder dec(1 << 20);
    std::span<const uint8_t> rest(b);
    while (!rest.empty() && !dec.error()) {
      size_t chunk = std::min<size_t>(rest.size(), 1 + rng() % 64);
      rest = rest.subspan(dec.feed(rest.first(chunk)));
      if (dec.ready()) {
        ProtoResult<Message> m = decode_message(dec.take());
        m ? ++ok : ++message_errors;
      }
    }
    if (dec.error()) ++framing_errors;
  }
  EXPECT_GT(ok, 100u);
  EXPECT_GT(framing_errors, 100u);
  EXPECT_GT(message_errors, 1000u);
}

}  // namespace
}  // namespace essaim::proto
