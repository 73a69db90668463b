// The ByteStream contract, checked identically on every transport (pipe and TCP loopback): bytes arrive
// in order, deadlines fire, a closed peer is detected, close() wakes a blocked call.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <random>

#include "net_test_util.h"

namespace essaim::net {
namespace {

using namespace std::chrono_literals;
using testing::Transport;

class TransportTest : public ::testing::TestWithParam<Transport> {};

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; i += 8) {  // eight bytes per draw: 16 MiB in a few milliseconds
    uint64_t r = rng();
    std::memcpy(v.data() + i, &r, std::min<size_t>(8, n - i));
  }
  return v;
}

// Reads exactly n bytes (or fails the test).
std::vector<uint8_t> read_exactly(ByteStream& s, size_t n, Deadline deadline) {
  std::vector<uint8_t> out(n);
  size_t got = 0;
  while (got < n) {
    NetResult<size_t> r = s.read_some(std::span(out).subspan(got), deadline);
    if (!r) {
      ADD_FAILURE() << r.error().message << " after " << got << " of " << n << " bytes";
      break;
    }
    got += *r;
  }
  out.resize(got);
  return out;
}

TEST_P(TransportTest, BytesArriveInOrderBothWaysAt16MiB) {
  testing::StreamPair p = testing::connected_pair(GetParam());
  const size_t n = 16u << 20;
  std::vector<uint8_t> ab = random_bytes(n, 1), ba = random_bytes(n, 2);
  ASSERT_NE(ab, ba);
  // Both directions at once: neither side can finish writing before the other reads.
  auto w1 = std::async(std::launch::async, [&] { return p.a->write_all(ab, deadline_in(30s)).is_ok(); });
  auto w2 = std::async(std::launch::async, [&] { return p.b->write_all(ba, deadline_in(30s)).is_ok(); });
  auto r1 = std::async(std::launch::async, [&] { return read_exactly(*p.b, n, deadline_in(30s)); });
  std::vector<uint8_t> got_ba = read_exactly(*p.a, n, deadline_in(30s));
  EXPECT_TRUE(w1.get());
  EXPECT_TRUE(w2.get());
  EXPECT_TRUE(r1.get() == ab);
  EXPECT_TRUE(got_ba == ba);
}

TEST_P(TransportTest, ReadDeadlineFiresAndLosesNothing) {
  testing::StreamPair p = testing::connected_pair(GetParam());
  uint8_t buf[16];
  auto start = Clock::now();
  NetResult<size_t> r = p.a->read_some(buf, start + 100ms);
  auto waited = Clock::now() - start;
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().kind, NetErrorKind::TIMEOUT);
  EXPECT_GE(waited, 100ms);
  EXPECT_LT(waited, 2s);
  // The stream is still good after a read timeout.
  std::vector<uint8_t> msg = {1, 2, 3};
  ASSERT_TRUE(p.b->write_all(msg, deadline_in(1s)));
  EXPECT_EQ(read_exactly(*p.a, 3, deadline_in(1s)), msg);
}

TEST_P(TransportTest, PeerCloseIsDetectedAfterTheLastByte) {
  testing::StreamPair p = testing::connected_pair(GetParam());
  std::vector<uint8_t> msg = random_bytes(1000, 3);
  ASSERT_TRUE(p.a->write_all(msg, deadline_in(1s)));
  p.a->close();
  EXPECT_EQ(read_exactly(*p.b, msg.size(), deadline_in(2s)), msg);
  uint8_t buf[8];
  NetResult<size_t> r = p.b->read_some(buf, deadline_in(2s));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().kind, NetErrorKind::CLOSED);
  // Writing to a peer that closed fails (TCP may buffer the first writes; it fails within a few).
  NetStatus w;
  for (int i = 0; i < 100 && w; ++i) {
    w = p.b->write_all(random_bytes(64 << 10, 4), deadline_in(2s));
    if (w) std::this_thread::sleep_for(5ms);
  }
  ASSERT_FALSE(w);
  EXPECT_EQ(w.error().kind, NetErrorKind::CLOSED) << w.error().message;
}

TEST_P(TransportTest, CloseWakesABlockedReaderAndLaterCallsFail) {
  testing::StreamPair p = testing::connected_pair(GetParam());
  auto reader = std::async(std::launch::async, [&] {
    uint8_t buf[8];
    return p.a->read_some(buf, kNoDeadline);
  });
  std::this_thread::sleep_for(50ms);
  p.a->close();
  ASSERT_EQ(reader.wait_for(5s), std::future_status::ready) << "close() did not wake the reader";
  NetResult<size_t> r = reader.get();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().kind, NetErrorKind::CLOSED);
  std::vector<uint8_t> msg = {1};
  NetStatus w = p.a->write_all(msg, deadline_in(1s));
  ASSERT_FALSE(w);
  EXPECT_EQ(w.error().kind, NetErrorKind::CLOSED);
  p.a->close();  // idempotent
}

TEST_P(TransportTest, WriterToAPeerThatDoesNotReadTimesOut) {
  testing::StreamPair p = testing::connected_pair(GetParam());
  // More than any socket buffer on loopback holds, and far more than the pipe's capacity.
  std::vector<uint8_t> lots(64u << 20, 0x5A);
  auto start = Clock::now();
  NetStatus w = p.a->write_all(lots, start + 300ms);
  ASSERT_FALSE(w);
  EXPECT_EQ(w.error().kind, NetErrorKind::TIMEOUT);
  EXPECT_LT(Clock::now() - start, 5s);
}

INSTANTIATE_TEST_SUITE_P(AllTransports, TransportTest, ::testing::Values(Transport::PIPE, Transport::TCP),
                         testing::transport_name);

TEST(Pipe, WriterBlocksOnAFullBufferUntilTheReaderTakesBytes) {
  auto pipe = make_pipe(1024);
  ByteStream* a = pipe.first.get();
  ByteStream* b = pipe.second.get();
  std::vector<uint8_t> msg = random_bytes(4096, 6);
  auto writer = std::async(std::launch::async, [&] { return a->write_all(msg, deadline_in(5s)).is_ok(); });
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(writer.wait_for(0ms), std::future_status::timeout) << "4 KiB cannot fit a 1 KiB pipe";
  EXPECT_EQ(read_exactly(*b, msg.size(), deadline_in(5s)), msg);
  EXPECT_TRUE(writer.get());
}

TEST(Pipe, HubHandsOutConnectionsAndRefusesAfterClose) {
  PipeHub hub;
  std::unique_ptr<ByteStream> client = hub.connect();
  NetResult<std::unique_ptr<ByteStream>> server = hub.accept(deadline_in(1s));
  ASSERT_TRUE(server);
  std::vector<uint8_t> msg = {7, 8, 9};
  ASSERT_TRUE(client->write_all(msg, deadline_in(1s)));
  EXPECT_EQ(read_exactly(**server, 3, deadline_in(1s)), msg);

  NetResult<std::unique_ptr<ByteStream>> none = hub.accept(deadline_in(50ms));
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().kind, NetErrorKind::TIMEOUT);

  auto waiting = std::async(std::launch::async, [&] { return hub.accept(kNoDeadline); });
  std::this_thread::sleep_for(20ms);
  hub.close();
  ASSERT_EQ(waiting.wait_for(5s), std::future_status::ready);
  NetResult<std::unique_ptr<ByteStream>> closed = waiting.get();
  ASSERT_FALSE(closed);
  EXPECT_EQ(closed.error().kind, NetErrorKind::CLOSED);
  std::unique_ptr<ByteStream> late = hub.connect();
  uint8_t buf[1];
  NetResult<size_t> r = late->read_some(buf, deadline_in(1s));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().kind, NetErrorKind::CLOSED);
}

}  // namespace
}  // namespace essaim::net
