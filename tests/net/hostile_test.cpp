// Hostile peers against a live frame server (label: sanitize): garbage, oversized lengths, malformed
// messages, truncated frames and random byte streams. The server answers ERROR MALFORMED, drops only the
// offending connection when the framing is lost, and keeps serving everyone else.
#include <gtest/gtest.h>

#include <random>

#include "net/stream_server.h"
#include "net_test_util.h"
#include "proto/wire.h"

namespace essaim::net {
namespace {

using namespace std::chrono_literals;

struct Server {
  PipeHub* hub = nullptr;
  std::unique_ptr<StreamServer> server;
  Server() {
    auto h = std::make_unique<PipeHub>();
    hub = h.get();
    server = std::make_unique<StreamServer>(std::move(h), [](ByteStream& s) {
      testing::serve_echo(s, 5s, 2, {.max_payload_bytes = 1 << 20});
    });
  }
  void expect_healthy() {
    FrameConnection c(hub->connect());
    ASSERT_TRUE(c.send(proto::Ping{77}, deadline_in(1s)));
    NetResult<proto::Message> m = c.receive(deadline_in(2s));
    ASSERT_TRUE(m) << m.error().message;
    EXPECT_EQ(std::get<proto::Pong>(*m).nonce, 77u);
  }
};

// Sends raw bytes and returns what the server says before it hangs up (or the first answer).
std::pair<NetResult<proto::Message>, NetResult<proto::Message>> poke(Server& s, std::span<const uint8_t> bytes) {
  FrameConnection c(s.hub->connect());
  EXPECT_TRUE(c.send_raw(bytes, deadline_in(1s)));
  NetResult<proto::Message> first = c.receive(deadline_in(3s));
  NetResult<proto::Message> second = c.receive(deadline_in(3s));
  return {std::move(first), std::move(second)};
}

TEST(NetHostile, GarbageGetsMalformedThenTheConnectionCloses) {
  Server s;
  std::string http = "GET / HTTP/1.1\r\nHost: worker\r\n\r\n";
  auto [first, second] = poke(s, {reinterpret_cast<const uint8_t*>(http.data()), http.size()});
  ASSERT_TRUE(first) << first.error().message;
  const auto& e = std::get<proto::ExpertError>(*first);
  EXPECT_EQ(e.code, proto::ErrorCode::MALFORMED);
  EXPECT_NE(e.message.find("UNKNOWN_TYPE"), std::string::npos) << e.message;
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error().kind, NetErrorKind::CLOSED);
  s.expect_healthy();
}

TEST(NetHostile, OversizedLengthIsRefusedFromTheHeader) {
  Server s;
  for (uint64_t len : std::vector<uint64_t>{(1u << 20) + 1, 1ull << 62, ~0ull}) {
    std::vector<uint8_t> header;
    proto::append_frame_header(proto::FrameType::EXPERT_REQUEST, len, header);
    auto [first, second] = poke(s, header);
    ASSERT_TRUE(first) << first.error().message;
    const auto& e = std::get<proto::ExpertError>(*first);
    EXPECT_EQ(e.code, proto::ErrorCode::MALFORMED);
    EXPECT_NE(e.message.find("OVERSIZED"), std::string::npos) << e.message;
    EXPECT_FALSE(second);
  }
  s.expect_healthy();
}

TEST(NetHostile, MalformedMessageInAGoodFrameKeepsTheConnection) {
  Server s;
  FrameConnection c(s.hub->connect());
  // An EXPERT_REQUEST whose counts promise 2^32-1 rows in a 40-byte payload.
  std::vector<uint8_t> payload;
  proto::WireWriter w(payload);
  w.u64(5);
  w.u32(0);
  w.u32(0xFFFFFFFF);
  w.u32(0);
  w.i32(int32_t(GgmlType::Q8_K));
  w.u64(292);
  payload.resize(40);
  std::vector<uint8_t> frame;
  proto::append_frame(proto::FrameType::EXPERT_REQUEST, payload, frame);
  ASSERT_TRUE(c.send_raw(frame, deadline_in(1s)));
  NetResult<proto::Message> m = c.receive(deadline_in(2s));
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(std::get<proto::ExpertError>(*m).code, proto::ErrorCode::MALFORMED);
  // Same connection, still served.
  ASSERT_TRUE(c.send(proto::Ping{3}, deadline_in(1s)));
  NetResult<proto::Message> pong = c.receive(deadline_in(2s));
  ASSERT_TRUE(pong) << pong.error().message;
  EXPECT_EQ(std::get<proto::Pong>(*pong).nonce, 3u);
}

TEST(NetHostile, TruncatedFrameThenHangUpEndsTheHandler) {
  Server s;
  {
    std::unique_ptr<ByteStream> c = s.hub->connect();
    std::vector<uint8_t> bytes = proto::encode_message(proto::Ping{1});
    ASSERT_TRUE(c->write_all(std::span(bytes).first(12), deadline_in(1s)));
    c->close();
  }
  auto t0 = Clock::now();
  while (s.server->stats().active > 0 && Clock::now() - t0 < 3s) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(s.server->stats().active, 0u);
  s.expect_healthy();
}

TEST(NetHostile, RandomByteStreamsNeverCrashTheServer) {
  Server s;
  std::mt19937_64 rng(99);
  std::vector<proto::Message> valid = {proto::Ping{1}, proto::Goodbye{"x"}, proto::HelloAck{},
                                       proto::ExpertError{1, proto::ErrorCode::INTERNAL, "e"}};
  size_t answered_malformed = 0;
  for (int i = 0; i < 200; ++i) {
    std::vector<uint8_t> bytes;
    if (i % 2 == 0) {  // pure noise
      bytes.resize(1 + rng() % 64);
      for (uint8_t& b : bytes) b = uint8_t(rng());
    } else {  // a valid frame with a few bytes flipped
      bytes = proto::encode_message(valid[rng() % valid.size()]);
      for (int k = 0; k < 3; ++k) bytes[rng() % bytes.size()] ^= uint8_t(1 + rng() % 255);
    }
    FrameConnection c(s.hub->connect());
    ASSERT_TRUE(c.send_raw(bytes, deadline_in(1s)));
    // Noise that is a partial frame leaves the server waiting for the rest: give up after a moment and
    // hang up (the server then sees the stream end inside a frame).
    for (int k = 0; k < 4; ++k) {
      NetResult<proto::Message> m = c.receive(deadline_in(50ms));
      if (!m) break;
      if (auto* e = std::get_if<proto::ExpertError>(&*m); e && e->code == proto::ErrorCode::MALFORMED) {
        ++answered_malformed;
      }
    }
  }
  EXPECT_GT(answered_malformed, 0u);
  s.expect_healthy();
}

}  // namespace
}  // namespace essaim::net
