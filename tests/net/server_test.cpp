// StreamServer: one stalled client never stalls another, the connection limit holds, stop() is prompt.
// The same server runs over TCP and over the in-memory hub (the server core only sees an Acceptor).
#include "net/stream_server.h"

#include <gtest/gtest.h>

#include <future>

#include "net_test_util.h"

namespace essaim::net {
namespace {

using namespace std::chrono_literals;
using testing::Transport;

// A server over either transport, and a way to dial it.
struct Fixture {
  std::unique_ptr<StreamServer> server;
  std::function<std::unique_ptr<ByteStream>()> dial;
};

Fixture start(Transport t, StreamServer::Handler handler, ServerOptions options = {}) {
  Fixture f;
  if (t == Transport::PIPE) {
    auto hub = std::make_unique<PipeHub>();
    PipeHub* h = hub.get();
    f.server = std::make_unique<StreamServer>(std::move(hub), std::move(handler), options);
    f.dial = [h] { return h->connect(); };
  } else {
    auto listener = TcpListener::listen("127.0.0.1", 0);
    EXPECT_TRUE(listener) << listener.error().message;
    uint16_t port = (*listener)->port();
    f.server = std::make_unique<StreamServer>(std::move(*listener), std::move(handler), options);
    f.dial = [port]() -> std::unique_ptr<ByteStream> {
      auto c = tcp_connect("127.0.0.1", port, deadline_in(5s));
      EXPECT_TRUE(c) << c.error().message;
      return c ? std::unique_ptr<ByteStream>(std::move(*c)) : nullptr;
    };
  }
  return f;
}

class ServerTest : public ::testing::TestWithParam<Transport> {};

TEST_P(ServerTest, StalledClientsDoNotStallAnother) {
  Fixture f = start(GetParam(), [](ByteStream& s) { testing::serve_echo(s, 20s); });

  // Client A sends half a frame and stalls.
  std::unique_ptr<ByteStream> half = f.dial();
  std::vector<uint8_t> ping = proto::encode_message(proto::Ping{1});
  ASSERT_TRUE(half->write_all(std::span(ping).first(4), deadline_in(1s)));

  // Client C floods the server with 1 MiB echoes and never reads the answers: the server's writes to C
  // block once the buffers are full, and C's own writes then block too.
  FrameConnection flood(f.dial());
  proto::ExpertResponse mib{.request_id = 1, .n_outputs = 256, .n_embd = 1024, .outputs = {}};
  mib.outputs.assign(256 * 1024, 0.5f);
  std::atomic<int> flood_sent{0};
  std::jthread flooder([&] {
    for (int i = 0; i < 64; ++i) {
      if (!flood.send(mib, deadline_in(1500ms))) return;
      ++flood_sent;
    }
  });
  std::this_thread::sleep_for(300ms);

  // Client B is served promptly all the same.
  FrameConnection b(f.dial());
  auto start_time = Clock::now();
  for (uint64_t i = 0; i < 100; ++i) {
    ASSERT_TRUE(b.send(proto::Ping{i}, deadline_in(1s)));
    NetResult<proto::Message> m = b.receive(deadline_in(1s));
    ASSERT_TRUE(m) << "round trip " << i << ": " << m.error().message;
    EXPECT_EQ(std::get<proto::Pong>(*m).nonce, i);
  }
  EXPECT_LT(Clock::now() - start_time, 2s);
  EXPECT_LT(flood_sent.load(), 64) << "the flood should have been blocked by the server's full buffers";
  flooder.join();
  EXPECT_GE(f.server->stats().accepted, 3u);
}

TEST_P(ServerTest, ConnectionsBeyondTheLimitAreClosedAndCounted) {
  Fixture f = start(GetParam(), [](ByteStream& s) { testing::serve_echo(s, 20s); }, {.max_connections = 2});
  FrameConnection a(f.dial()), b(f.dial());
  for (FrameConnection* c : {&a, &b}) {  // both served: they count against the limit
    ASSERT_TRUE(c->send(proto::Ping{1}, deadline_in(1s)));
    ASSERT_TRUE(c->receive(deadline_in(2s)));
  }
  FrameConnection third(f.dial());
  NetResult<proto::Message> m = third.receive(deadline_in(2s));
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error().kind, NetErrorKind::CLOSED) << m.error().message;
  EXPECT_EQ(f.server->stats().refused_over_limit, 1u);
  EXPECT_EQ(f.server->stats().active, 2u);
}

TEST_P(ServerTest, StopClosesLiveConnectionsPromptly) {
  Fixture f = start(GetParam(), [](ByteStream& s) { testing::serve_echo(s, 60s); });
  std::vector<std::unique_ptr<ByteStream>> clients;
  for (int i = 0; i < 5; ++i) clients.push_back(f.dial());
  FrameConnection probe(f.dial());
  ASSERT_TRUE(probe.send(proto::Ping{1}, deadline_in(1s)));
  ASSERT_TRUE(probe.receive(deadline_in(2s)));
  auto t0 = Clock::now();
  f.server->stop();
  EXPECT_LT(Clock::now() - t0, 2s);
  NetResult<proto::Message> m = probe.receive(deadline_in(2s));
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error().kind, NetErrorKind::CLOSED);
}

TEST_P(ServerTest, AHandlerThatThrowsEndsOnlyItsConnection) {
  std::atomic<int> calls{0};
  Fixture f = start(GetParam(), [&](ByteStream& s) {
    if (calls++ == 0) throw std::runtime_error("boom");
    testing::serve_echo(s);
  });
  FrameConnection first(f.dial());
  NetResult<proto::Message> m = first.receive(deadline_in(2s));
  ASSERT_FALSE(m);
  FrameConnection second(f.dial());
  ASSERT_TRUE(second.send(proto::Ping{2}, deadline_in(1s)));
  NetResult<proto::Message> pong = second.receive(deadline_in(2s));
  ASSERT_TRUE(pong) << pong.error().message;
  EXPECT_EQ(f.server->stats().handler_exceptions, 1u);
}

INSTANTIATE_TEST_SUITE_P(AllTransports, ServerTest, ::testing::Values(Transport::PIPE, Transport::TCP),
                         testing::transport_name);

}  // namespace
}  // namespace essaim::net
