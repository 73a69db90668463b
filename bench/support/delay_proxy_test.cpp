// DelayProxy: a round trip through it takes at least twice the one-way delay, and with jitter at most twice
// (delay + jitter) plus scheduling; bytes arrive complete and in order in both directions (4 MiB of seeded
// random bytes in writes of varied sizes, echoed back, with and without jitter), while both directions are
// busy at once; closing one side ends the proxied connection; a retargeted proxy sends new connections to
// the new port, and closes them at once while nothing listens there; a paced link takes its bytes' time.
#include "delay_proxy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <thread>

namespace essaim::bench {
namespace {

using namespace std::chrono_literals;
using net::Clock;

// Echoes every byte of the first connection back until the peer closes.
class EchoServer {
 public:
  EchoServer() {
    auto l = net::TcpListener::listen("127.0.0.1", 0);
    EXPECT_TRUE(l);
    listener_ = std::move(*l);
    thread_ = std::thread([this] {
      auto c = listener_->accept(Clock::now() + 10s);
      if (!c) return;
      accepted_ = true;
      std::vector<uint8_t> buf(65536);
      for (auto until = Clock::now() + 30s; Clock::now() < until;) {
        auto n = (*c)->read_some(buf, Clock::now() + 1s);
        if (!n && n.error().kind == net::NetErrorKind::TIMEOUT) continue;
        if (!n || !(*c)->write_all(std::span(buf).first(*n), Clock::now() + 10s)) break;
      }
      (*c)->close();
    });
  }
  ~EchoServer() { thread_.join(); }
  uint16_t port() const { return listener_->port(); }
  bool accepted() const { return accepted_.load(); }

 private:
  std::atomic<bool> accepted_{false};
  std::unique_ptr<net::TcpListener> listener_;
  std::thread thread_;
};

std::vector<uint8_t> read_exactly(net::ByteStream& s, size_t n) {
  std::vector<uint8_t> out;
  std::vector<uint8_t> buf(65536);
  const auto until = Clock::now() + 30s;
  while (out.size() < n && Clock::now() < until) {
    auto r = s.read_some(std::span(buf).first(std::min(buf.size(), n - out.size())), until);
    if (!r) break;
    out.insert(out.end(), buf.begin(), buf.begin() + long(*r));
  }
  return out;
}

TEST(DelayProxy, RoundTripTakesTwiceTheOneWayDelay) {
  EchoServer echo;
  auto proxy = DelayProxy::start("127.0.0.1", echo.port(), 20ms);
  ASSERT_TRUE(proxy) << proxy.error().message;
  auto c = net::tcp_connect("127.0.0.1", (*proxy)->port(), Clock::now() + 5s);
  ASSERT_TRUE(c);
  for (int i = 0; i < 3; ++i) {
    const uint8_t b = uint8_t(i);
    const auto t0 = Clock::now();
    ASSERT_TRUE((*c)->write_all(std::span(&b, 1), Clock::now() + 5s));
    const std::vector<uint8_t> got = read_exactly(**c, 1);
    const auto rtt = Clock::now() - t0;
    ASSERT_EQ(got, std::vector<uint8_t>{b});
    EXPECT_GE(rtt, 40ms);
    EXPECT_LT(rtt, 5s);
  }
  EXPECT_EQ((*proxy)->connections(), 1u);
}

TEST(DelayProxy, JitteredRoundTripsStayWithinTheirBounds) {
  EchoServer echo;
  auto proxy = DelayProxy::start("127.0.0.1", echo.port(), LinkDelay{.one_way = 5ms, .jitter = 10ms, .seed = 3});
  ASSERT_TRUE(proxy) << proxy.error().message;
  auto c = net::tcp_connect("127.0.0.1", (*proxy)->port(), Clock::now() + 5s);
  ASSERT_TRUE(c);
  std::vector<Clock::duration> rtts;
  for (int i = 0; i < 12; ++i) {
    const uint8_t b = uint8_t(i);
    const auto t0 = Clock::now();
    ASSERT_TRUE((*c)->write_all(std::span(&b, 1), Clock::now() + 5s));
    ASSERT_EQ(read_exactly(**c, 1), std::vector<uint8_t>{b});
    rtts.push_back(Clock::now() - t0);
  }
  for (const Clock::duration& r : rtts) {
    EXPECT_GE(r, 10ms);
    EXPECT_LT(r, 5s);
  }
  // The draws vary: 12 round trips over a 20 ms spread are not all within 1 ms of each other.
  EXPECT_GT(*std::max_element(rtts.begin(), rtts.end()) - *std::min_element(rtts.begin(), rtts.end()), 1ms);
}

TEST(DelayProxy, RetargetedProxyReachesTheNewPortAndRefusesWhileNothingListens) {
  EchoServer first, second;
  auto proxy = DelayProxy::start("127.0.0.1", first.port(), 1ms);
  ASSERT_TRUE(proxy);
  auto round_trip = [&](uint8_t b) {
    auto c = net::tcp_connect("127.0.0.1", (*proxy)->port(), Clock::now() + 5s);
    if (!c) return false;
    const bool ok = (*c)->write_all(std::span(&b, 1), Clock::now() + 5s) && read_exactly(**c, 1) == std::vector<uint8_t>{b};
    (*c)->close();
    return ok;
  };
  EXPECT_TRUE(round_trip(1));
  EXPECT_TRUE(first.accepted());
  EXPECT_FALSE(second.accepted());
  (*proxy)->retarget(second.port());
  EXPECT_TRUE(round_trip(2));
  EXPECT_TRUE(second.accepted());
  // A port nothing listens on (a listener opened and closed): the proxied connection is closed at once.
  uint16_t dead = 0;
  {
    auto l = net::TcpListener::listen("127.0.0.1", 0);
    ASSERT_TRUE(l);
    dead = (*l)->port();
  }
  (*proxy)->retarget(dead);
  auto c = net::tcp_connect("127.0.0.1", (*proxy)->port(), Clock::now() + 5s);
  ASSERT_TRUE(c);
  std::vector<uint8_t> buf(4);
  auto r = (*c)->read_some(buf, Clock::now() + 5s);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().kind, net::NetErrorKind::CLOSED);
}

TEST(DelayProxy, BytesArriveCompleteAndInOrderBothWays) {
  for (LinkDelay delay : {LinkDelay{}, LinkDelay{.one_way = 3ms}, LinkDelay{.one_way = 1ms, .jitter = 2ms, .seed = 9}}) {
    EchoServer echo;
    auto proxy = DelayProxy::start("127.0.0.1", echo.port(), delay);
    ASSERT_TRUE(proxy);
    auto c = net::tcp_connect("127.0.0.1", (*proxy)->port(), Clock::now() + 5s);
    ASSERT_TRUE(c);
    std::mt19937 rng(42);
    std::vector<uint8_t> data(4 << 20);
    for (uint8_t& b : data) b = uint8_t(rng());
    ASSERT_NE(data[0], data[1]);  // the bytes vary
    std::thread writer([&] {      // writes while the echo comes back: both directions busy
      size_t off = 0;
      while (off < data.size()) {
        const size_t n = std::min(data.size() - off, size_t(1 + rng() % 100000));
        if (!(*c)->write_all(std::span(data).subspan(off, n), Clock::now() + 30s)) return;
        off += n;
      }
    });
    const std::vector<uint8_t> got = read_exactly(**c, data.size());
    writer.join();
    EXPECT_TRUE(got == data) << "delay " << delay.one_way.count() << " us, jitter " << delay.jitter.count()
                             << " us: " << got.size() << " of " << data.size();
    (*c)->close();
  }
}

// A paced link: 400 KB at 400 KB/s per direction takes at least a second (the crossings there and back
// overlap) and arrives whole.
TEST(DelayProxy, APacedLinkTakesItsBytesTime) {
  EchoServer echo;
  auto proxy = DelayProxy::start("127.0.0.1", echo.port(), LinkDelay{.bytes_per_s = 400000});
  ASSERT_TRUE(proxy) << proxy.error().message;
  auto c = net::tcp_connect("127.0.0.1", (*proxy)->port(), Clock::now() + 5s);
  ASSERT_TRUE(c);
  std::vector<uint8_t> data(400000);
  std::mt19937 rng(5);
  for (uint8_t& b : data) b = uint8_t(rng());
  const auto t0 = Clock::now();
  ASSERT_TRUE((*c)->write_all(data, Clock::now() + 30s));
  const std::vector<uint8_t> got = read_exactly(**c, data.size());
  const auto took = Clock::now() - t0;
  EXPECT_TRUE(got == data);
  EXPECT_GE(took, 900ms);  // at least one paced crossing of 400 KB (both crossings overlap in time)
  EXPECT_LT(took, 20s);
  (*c)->close();
}

TEST(DelayProxy, ClosingTheTargetClosesTheClient) {
  auto l = net::TcpListener::listen("127.0.0.1", 0);
  ASSERT_TRUE(l);
  auto proxy = DelayProxy::start("127.0.0.1", (*l)->port(), 1ms);
  ASSERT_TRUE(proxy);
  auto c = net::tcp_connect("127.0.0.1", (*proxy)->port(), Clock::now() + 5s);
  ASSERT_TRUE(c);
  auto server_side = (*l)->accept(Clock::now() + 5s);
  ASSERT_TRUE(server_side);
  const uint8_t hello[3] = {1, 2, 3};
  ASSERT_TRUE((*server_side)->write_all(hello, Clock::now() + 5s));
  (*server_side)->close();
  EXPECT_EQ(read_exactly(**c, 3), std::vector<uint8_t>(hello, hello + 3));  // delivered before the close
  std::vector<uint8_t> buf(16);
  auto r = (*c)->read_some(buf, Clock::now() + 5s);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().kind, net::NetErrorKind::CLOSED);
}

}  // namespace
}  // namespace essaim::bench
