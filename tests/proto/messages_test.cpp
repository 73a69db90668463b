// Messages: every type survives encode -> frame decode -> message decode unchanged, and the bytes match
// the layouts written down in docs/protocol.md.
#include "proto/messages.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "test_messages.h"

namespace essaim::proto {
namespace {

Message round_trip(const Message& m) {
  std::vector<uint8_t> bytes = encode_message(m);
  ProtoResult<Frame> f = decode_one_frame(bytes, kDefaultMaxPayloadBytes);
  EXPECT_TRUE(f) << f.error().message;
  EXPECT_EQ(f->type, message_frame_type(m));
  ProtoResult<Message> back = decode_message(*f);
  EXPECT_TRUE(back) << back.error().message;
  return *back;
}

TEST(Messages, EveryTypeRoundTrips) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    std::vector<Message> all = testing::sample_messages(seed);
    ASSERT_EQ(all.size(), size_t(FrameType::COUNT) - 1);
    for (size_t i = 0; i < all.size(); ++i) {
      EXPECT_EQ(uint8_t(message_frame_type(all[i])), i + 1);
      EXPECT_EQ(round_trip(all[i]), all[i]) << frame_type_name(message_frame_type(all[i]));
    }
  }
  // The seeds give different contents (the test would be blind to a constant encoder otherwise).
  EXPECT_NE(testing::sample_messages(1)[3], testing::sample_messages(2)[3]);
}

TEST(Messages, PingBytesAreExactlyAsDocumented) {
  std::vector<uint8_t> bytes = encode_message(Ping{0x0102030405060708ull});
  EXPECT_EQ(bytes, (std::vector<uint8_t>{7, 8, 0, 0, 0, 0, 0, 0, 0, 8, 7, 6, 5, 4, 3, 2, 1}));
}

TEST(Messages, ExpertRequestBytesAreExactlyAsDocumented) {
  ExpertRequest r{.request_id = 7, .layer = 3, .act_type = GgmlType::Q8_0, .act_row_bytes = 34,
                  .row_expert_counts = {2, 1}, .expert_ids = {17, 40, 17}, .activations = {}};
  r.activations.assign(68, 0xAB);
  std::vector<uint8_t> b = encode_message(r);
  ASSERT_EQ(b.size(), 9 + expert_request_payload_bytes(2, 3, 34));
  std::vector<uint8_t> head = {4, 121, 0, 0, 0, 0, 0, 0, 0,  // EXPERT_REQUEST, payload 121 bytes
                               7, 0, 0, 0, 0, 0, 0, 0,       // request id
                               3, 0, 0, 0,                   // layer
                               2, 0, 0, 0,                   // n_rows
                               3, 0, 0, 0,                   // n_pairs
                               8, 0, 0, 0,                   // act type Q8_0
                               34, 0, 0, 0, 0, 0, 0, 0,      // row bytes
                               0,                            // output format (v3): f32
                               2, 0, 0, 0, 1, 0, 0, 0,       // counts
                               17, 0, 0, 0, 40, 0, 0, 0, 17, 0, 0, 0};
  EXPECT_EQ(std::vector<uint8_t>(b.begin(), b.begin() + head.size()), head);
  EXPECT_EQ(b.size() - head.size(), 68u);
}

TEST(Messages, Bf16ResponseBytesAreExactlyAsDocumented) {
  // v3 lean wire: output format byte after n_embd, then 2 bytes per value, the values rounded to nearest
  // even by the encoder (1 + 2^-8 is a tie that goes to the even 1.0; 1 + 3·2^-8 goes up to 1 + 2^-6).
  ExpertResponse r{.request_id = 9, .n_outputs = 1, .n_embd = 3, .output = ExpertOutput::BF16, .outputs = {}};
  r.outputs = {1.0f + 1.0f / 256, 1.0f + 3.0f / 256, -2.0f};
  std::vector<uint8_t> b = encode_message(r);
  ASSERT_EQ(b.size(), 9 + expert_response_payload_bytes(1, 3, ExpertOutput::BF16));
  EXPECT_EQ(b, (std::vector<uint8_t>{5, 23, 0, 0, 0, 0, 0, 0, 0,  // EXPERT_RESPONSE, payload 23 bytes
                                     9, 0, 0, 0, 0, 0, 0, 0,     // request id
                                     1, 0, 0, 0, 3, 0, 0, 0,     // n_outputs, n_embd
                                     1,                          // output format: bf16
                                     0x80, 0x3F, 0x82, 0x3F, 0x00, 0xC0}));
  Message back = round_trip(r);
  const auto& got = std::get<ExpertResponse>(back);
  EXPECT_EQ(got.output, ExpertOutput::BF16);
  EXPECT_EQ(got.outputs, (std::vector<float>{1.0f, 1.0f + 1.0f / 64, -2.0f}));
  // The same answer in f32 takes 2 more bytes per value.
  EXPECT_EQ(expert_response_payload_bytes(8, 3072, ExpertOutput::F32) -
                expert_response_payload_bytes(8, 3072, ExpertOutput::BF16),
            8u * 3072 * 2);
}

TEST(Messages, Bf16ResponseKeepsEveryBf16BitPatternIncludingNaNs) {
  // Every one of the 65536 bf16 patterns, signalling NaNs included, decodes and re-encodes to the same bytes.
  ExpertResponse r{.request_id = 3, .n_outputs = 256, .n_embd = 256, .output = ExpertOutput::BF16, .outputs = {}};
  for (uint32_t h = 0; h < 65536; ++h) r.outputs.push_back(bf16_to_f32(uint16_t(h)));
  std::vector<uint8_t> b = encode_message(r);
  for (uint32_t h = 0; h < 65536; ++h) ASSERT_EQ(b[9 + 17 + 2 * h] | b[9 + 17 + 2 * h + 1] << 8, int(h)) << h;
  ProtoResult<Frame> f = decode_one_frame(b, kDefaultMaxPayloadBytes);
  ASSERT_TRUE(f);
  ProtoResult<Message> back = decode_message(*f);
  ASSERT_TRUE(back);
  EXPECT_EQ(encode_message(*back), b);
}

TEST(Messages, UnknownOutputFormatIsRefused) {
  ExpertRequest q{.request_id = 7, .layer = 3, .act_type = GgmlType::Q8_0, .act_row_bytes = 34,
                  .row_expert_counts = {1}, .expert_ids = {17}, .activations = std::vector<uint8_t>(34, 1)};
  std::vector<uint8_t> b = encode_message(q);
  b[9 + 32] = 2;  // the output format byte
  ProtoResult<Message> m = decode_message(FrameType::EXPERT_REQUEST, std::span(b).subspan(9));
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error().kind, ProtoErrorKind::BAD_VALUE);
  EXPECT_NE(m.error().message.find("output format 2"), std::string::npos) << m.error().message;
  ExpertResponse r{.request_id = 9, .n_outputs = 1, .n_embd = 1, .output = ExpertOutput::F32, .outputs = {1.0f}};
  std::vector<uint8_t> rb = encode_message(r);
  rb[9 + 16] = 7;
  ProtoResult<Message> mr = decode_message(FrameType::EXPERT_RESPONSE, std::span(rb).subspan(9));
  ASSERT_FALSE(mr);
  EXPECT_EQ(mr.error().kind, ProtoErrorKind::BAD_VALUE);
}

TEST(Messages, HelloBytesStartWithMagicAndVersion) {
  std::mt19937_64 rng(5);
  std::vector<uint8_t> b = encode_message(testing::sample_hello(rng, Role::BACKBONE));
  EXPECT_EQ(b[0], uint8_t(FrameType::HELLO));
  EXPECT_EQ(std::string(b.begin() + 9, b.begin() + 13), "ESSM");
  EXPECT_EQ(b[13], kProtocolVersion);
  EXPECT_EQ(b[14], 0);
  EXPECT_EQ(b[15], uint8_t(Role::BACKBONE));
}

TEST(Messages, HelloV2HoldingIsLayerFirstCountThenDigest) {
  Hello h;
  h.fingerprint = {.kernel_abi = 3, .isa_class = "avx2"};
  h.max_payload_bytes = 1 << 20;
  Holding one{.layer = 7, .first_expert = 32, .expert_count = 16};
  for (size_t i = 0; i < one.sha256.size(); ++i) one.sha256[i] = uint8_t(0xA0 + i);
  h.holdings = {one};
  std::vector<uint8_t> b = encode_message(h);
  const size_t fixed = 9 + 4 + 2 + 1 + 4 + 2 + 4 + 32 + 8 + 2 + 0;  // header .. label (empty)
  ASSERT_EQ(b.size(), fixed + 4 + kHoldingWireBytes);
  EXPECT_EQ(kHoldingWireBytes, 44u);
  std::vector<uint8_t> tail = {1, 0, 0, 0, 7, 0, 0, 0, 32, 0, 0, 0, 16, 0, 0, 0};
  for (uint8_t d : one.sha256) tail.push_back(d);
  EXPECT_EQ(std::vector<uint8_t>(b.begin() + long(fixed), b.end()), tail);
  EXPECT_EQ(round_trip(h), Message(h));
  // One byte short of the last digest: refused as truncated, nothing allocated past the bytes present.
  std::vector<uint8_t> payload(b.begin() + 9, b.end() - 1);
  ProtoResult<Message> m = decode_message(FrameType::HELLO, payload);
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error().kind, ProtoErrorKind::TRUNCATED);
}

TEST(Messages, ResponseKeepsEveryFloatBitPattern) {
  ExpertResponse r{.request_id = 9, .n_outputs = 2, .n_embd = 3, .outputs = {}};
  r.outputs = {-0.0f, std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::infinity(),
               std::numeric_limits<float>::quiet_NaN(), 1e-38f, -3.5f};
  Message back = round_trip(r);
  const auto& got = std::get<ExpertResponse>(back);
  ASSERT_EQ(got.outputs.size(), r.outputs.size());
  EXPECT_EQ(std::memcmp(got.outputs.data(), r.outputs.data(), r.outputs.size() * 4), 0);
  EXPECT_TRUE(std::signbit(got.outputs[0]));
}

TEST(Messages, EmptyRequestAndResponse) {
  ExpertRequest req{.request_id = 1, .layer = 0, .act_type = GgmlType::F32, .act_row_bytes = 4 * 64,
                    .row_expert_counts = {}, .expert_ids = {}, .activations = {}};
  EXPECT_EQ(round_trip(req), Message(req));
  ExpertResponse resp{.request_id = 1, .n_outputs = 0, .n_embd = 64, .outputs = {}};
  EXPECT_EQ(round_trip(resp), Message(resp));
}

TEST(Messages, LargeRequestMatchesPayloadSizeHelper) {
  std::mt19937_64 rng(11);
  ExpertRequest r = testing::sample_request(rng, 512);
  std::vector<uint8_t> b = encode_message(r);
  EXPECT_EQ(b.size(), kFrameHeaderBytes + expert_request_payload_bytes(r.n_rows(), r.n_pairs(), r.act_row_bytes));
  EXPECT_EQ(round_trip(r), Message(r));
  ExpertResponse resp = testing::sample_response(rng, 100, 3072);
  EXPECT_EQ(encode_message(resp).size(), kFrameHeaderBytes + expert_response_payload_bytes(100, 3072));
}

TEST(Messages, LongHumanTextIsClippedNotRefused) {
  Goodbye g{std::string(kMaxReasonBytes + 100, 'x')};
  Message back = round_trip(g);
  EXPECT_EQ(std::get<Goodbye>(back).message.size(), kMaxReasonBytes);
}

TEST(Messages, ValidateCatchesInconsistentRequests) {
  std::mt19937_64 rng(12);
  ExpertRequest r = testing::sample_request(rng, 4);
  EXPECT_TRUE(validate_expert_request(r));
  ExpertRequest bad_sum = r;
  bad_sum.row_expert_counts[0] += 1;
  EXPECT_FALSE(validate_expert_request(bad_sum));
  ExpertRequest bad_rows = r;
  bad_rows.activations.pop_back();
  EXPECT_FALSE(validate_expert_request(bad_rows));
  ExpertRequest bad_row_bytes = r;
  bad_row_bytes.act_row_bytes = 291;  // not a whole Q8_K block
  EXPECT_FALSE(validate_expert_request(bad_row_bytes));
}

}  // namespace
}  // namespace essaim::proto
