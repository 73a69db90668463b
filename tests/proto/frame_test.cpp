// Framing: sizes around every boundary a length encoding tends to get wrong, the limit checked on the
// header alone, and incremental decoding from arbitrary chunks (down to one byte at a time).
#include "proto/frame.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

namespace essaim::proto {
namespace {

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

std::vector<uint8_t> frame_bytes(FrameType type, const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> out;
  append_frame(type, payload, out);
  return out;
}

TEST(Frame, HeaderLayoutIsTypeThenLittleEndianLength) {
  std::vector<uint8_t> out;
  append_frame_header(FrameType::EXPERT_RESPONSE, 0x0102030405060708ull, out);
  EXPECT_EQ(out, (std::vector<uint8_t>{5, 8, 7, 6, 5, 4, 3, 2, 1}));
}

TEST(Frame, RoundTripAtBoundarySizes) {
  for (size_t n : {size_t(0), size_t(1), size_t(125), size_t(126), size_t(127), size_t(65535), size_t(65536),
                   size_t(65537)}) {
    std::vector<uint8_t> payload = random_bytes(n, n);
    std::vector<uint8_t> bytes = frame_bytes(FrameType::EXPERT_REQUEST, payload);
    ASSERT_EQ(bytes.size(), kFrameHeaderBytes + n);
    ProtoResult<Frame> f = decode_one_frame(bytes, kDefaultMaxPayloadBytes);
    ASSERT_TRUE(f) << n << ": " << f.error().message;
    EXPECT_EQ(f->type, FrameType::EXPERT_REQUEST);
    EXPECT_EQ(f->payload, payload) << n;
  }
}

TEST(Frame, ByteAtATimeAtBoundarySizes) {
  for (size_t n : {size_t(0), size_t(125), size_t(126), size_t(127), size_t(65535), size_t(65536),
                   size_t(65537)}) {
    std::vector<uint8_t> payload = random_bytes(n, 1000 + n);
    std::vector<uint8_t> bytes = frame_bytes(FrameType::PING, payload);
    FrameDecoder dec;
    for (size_t i = 0; i < bytes.size(); ++i) {
      ASSERT_FALSE(dec.ready()) << "frame complete early at byte " << i << " of " << bytes.size();
      ASSERT_EQ(dec.feed({&bytes[i], 1}), 1u);
    }
    ASSERT_TRUE(dec.ready()) << n;
    ASSERT_FALSE(dec.error());
    Frame f = dec.take();
    EXPECT_EQ(f.payload, payload) << n;
    EXPECT_TRUE(dec.at_boundary());
  }
}

TEST(Frame, SixteenMiBPlusOneRefusedUnderSixteenMiBLimitAcceptedAbove) {
  const size_t n = (16u << 20) + 1;
  std::vector<uint8_t> payload = random_bytes(n, 16);
  std::vector<uint8_t> bytes = frame_bytes(FrameType::EXPERT_RESPONSE, payload);

  // Refused on the header alone: the decoder takes the 9 header bytes and stops there.
  FrameDecoder small(16u << 20);
  EXPECT_EQ(small.feed(bytes), kFrameHeaderBytes);
  ASSERT_TRUE(small.error());
  EXPECT_EQ(small.error()->kind, ProtoErrorKind::OVERSIZED);
  EXPECT_NE(small.error()->message.find("16777217"), std::string::npos) << small.error()->message;
  EXPECT_EQ(small.feed(bytes), 0u) << "a failed decoder takes nothing more";

  ProtoResult<Frame> big = decode_one_frame(bytes, 32u << 20);
  ASSERT_TRUE(big) << big.error().message;
  EXPECT_EQ(big->payload, payload);

  // Exactly at the limit is accepted.
  std::vector<uint8_t> at_limit = frame_bytes(FrameType::EXPERT_RESPONSE, random_bytes(16u << 20, 17));
  EXPECT_TRUE(decode_one_frame(at_limit, 16u << 20));
}

TEST(Frame, ManyFramesFromRandomChunks) {
  std::mt19937_64 rng(42);
  std::vector<std::vector<uint8_t>> payloads;
  std::vector<uint8_t> stream;
  for (int i = 0; i < 200; ++i) {
    payloads.push_back(random_bytes(rng() % 3000, 500 + i));
    append_frame(FrameType(1 + i % 9), payloads.back(), stream);
  }
  FrameDecoder dec;
  std::vector<Frame> got;
  std::set<size_t> chunk_sizes;
  std::span<const uint8_t> rest(stream);
  while (!rest.empty()) {
    size_t chunk = std::min<size_t>(rest.size(), 1 + rng() % 5000);
    chunk_sizes.insert(chunk);
    std::span<const uint8_t> piece = rest.first(chunk);
    rest = rest.subspan(chunk);
    while (!piece.empty()) {
      piece = piece.subspan(dec.feed(piece));
      ASSERT_FALSE(dec.error());
      if (dec.ready()) got.push_back(dec.take());
    }
  }
  if (dec.ready()) got.push_back(dec.take());
  EXPECT_GT(chunk_sizes.size(), 20u) << "chunking should vary";
  ASSERT_EQ(got.size(), payloads.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(uint8_t(got[i].type), 1 + i % 9);
    EXPECT_EQ(got[i].payload, payloads[i]) << i;
  }
  EXPECT_TRUE(dec.at_boundary());
}

TEST(Frame, ReadyDecoderTakesNothingUntilTaken) {
  std::vector<uint8_t> stream;
  append_frame(FrameType::PING, random_bytes(8, 1), stream);
  append_frame(FrameType::PONG, random_bytes(8, 2), stream);
  FrameDecoder dec;
  EXPECT_EQ(dec.feed(stream), kFrameHeaderBytes + 8);
  EXPECT_TRUE(dec.ready());
  EXPECT_EQ(dec.feed(std::span(stream).subspan(17)), 0u);
  EXPECT_EQ(dec.take().type, FrameType::PING);
  EXPECT_EQ(dec.feed(std::span(stream).subspan(17)), kFrameHeaderBytes + 8);
  EXPECT_EQ(dec.take().type, FrameType::PONG);
}

TEST(Frame, BoundaryTracksPartialFrames) {
  std::vector<uint8_t> bytes = frame_bytes(FrameType::PING, random_bytes(8, 3));
  FrameDecoder dec;
  EXPECT_TRUE(dec.at_boundary());
  dec.feed(std::span(bytes).first(1));
  EXPECT_FALSE(dec.at_boundary()) << "a stream ending after one header byte ended mid-frame";
  dec.feed(std::span(bytes).subspan(1, 10));
  EXPECT_FALSE(dec.at_boundary());
}

}  // namespace
}  // namespace essaim::proto
