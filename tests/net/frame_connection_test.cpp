// FrameConnection and the handshake over every transport: whole messages with deadlines, many requests in
// flight with answers out of order, partial frames surviving a read timeout, refusals with their reason.
#include "net/frame_connection.h"

#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <set>

#include "net_test_util.h"

namespace essaim::net {
namespace {

using namespace std::chrono_literals;
using testing::Transport;

class FrameConnectionTest : public ::testing::TestWithParam<Transport> {};

proto::Hello hello(proto::Role role) {
  proto::Hello h;
  h.role = role;
  h.fingerprint = {.kernel_abi = 1, .isa_class = "avx2"};
  h.model.fill(0x5A);
  h.label = role == proto::Role::WORKER ? "worker" : "backbone";
  if (role == proto::Role::WORKER) h.holdings = {{0, 0, 16}, {1, 16, 16}};
  return h;
}

TEST_P(FrameConnectionTest, SixteenMiBMessagesRoundTrip) {
  testing::StreamPair p = testing::connected_pair(GetParam());
  // jthread: joined after `c` is destroyed (and closed), also when an assertion returns early.
  std::jthread server([&] { testing::serve_echo(*p.b, 30s); });
  FrameConnection c(std::move(p.a));
  std::mt19937 rng(1);
  proto::ExpertResponse big{.request_id = 3, .n_outputs = 1024, .n_embd = 4096, .outputs = {}};
  big.outputs.resize(size_t(big.n_outputs) * big.n_embd);
  for (float& v : big.outputs) v = float(rng()) * 1e-9f;
  ASSERT_GE(proto::encode_message(big).size(), 16u << 20);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(c.send(big, deadline_in(30s)));
    NetResult<proto::Message> back = c.receive(deadline_in(30s));
    ASSERT_TRUE(back) << back.error().message;
    const auto& got = std::get<proto::ExpertResponse>(*back);
    ASSERT_EQ(got.outputs.size(), big.outputs.size());
    EXPECT_EQ(std::memcmp(got.outputs.data(), big.outputs.data(), big.outputs.size() * 4), 0);
  }
  ASSERT_TRUE(c.send(proto::Goodbye{"done"}, deadline_in(1s)));
}

TEST_P(FrameConnectionTest, ManyRequestsInFlightFromSeveralSendersAnsweredOutOfOrder) {
  testing::StreamPair p = testing::connected_pair(GetParam());
  std::jthread server([&] { testing::serve_echo(*p.b, 30s); });
  FrameConnection c(std::move(p.a));
  const int kSenders = 4, kPerSender = 250;

  std::vector<uint64_t> order;
  std::map<uint64_t, std::vector<float>> answers;
  std::thread reader([&] {
    while (answers.size() < kSenders * kPerSender) {
      NetResult<proto::Message> m = c.receive(deadline_in(10s));
      if (!m) {
        ADD_FAILURE() << m.error().message;
        return;
      }
      auto& r = std::get<proto::ExpertResponse>(*m);
      order.push_back(r.request_id);
      answers[r.request_id] = r.outputs;
    }
  });
  std::vector<std::thread> senders;
  for (int s = 0; s < kSenders; ++s) {
    senders.emplace_back([&, s] {
      for (int i = 0; i < kPerSender; ++i) {
        uint64_t id = 1 + uint64_t(s) * kPerSender + i;
        proto::ExpertRequest r{.request_id = id, .layer = 0, .act_type = GgmlType::F32, .act_row_bytes = 16,
                               .row_expert_counts = {2}, .expert_ids = {uint32_t(id % 97), uint32_t(id % 89)},
                               .activations = std::vector<uint8_t>(16, uint8_t(id))};
        ASSERT_TRUE(c.send(r, deadline_in(10s)));
      }
    });
  }
  for (auto& t : senders) t.join();
  reader.join();
  ASSERT_EQ(answers.size(), size_t(kSenders * kPerSender));
  for (const auto& [id, outputs] : answers) {
    EXPECT_EQ(outputs, (std::vector<float>{float(id % 97), float(id % 89)})) << id;
  }
  size_t inversions = 0;
  for (size_t i = 1; i < order.size(); ++i) inversions += order[i] < order[i - 1];
  EXPECT_GT(inversions, 10u) << "answers should come back out of order";
  ASSERT_TRUE(c.send(proto::Goodbye{}, deadline_in(1s)));
}

TEST_P(FrameConnectionTest, ReadTimeoutKeepsAPartialFrame) {
  testing::StreamPair p = testing::connected_pair(GetParam());
  FrameConnection c(std::move(p.a));
  std::vector<uint8_t> bytes = proto::encode_message(proto::Ping{42});
  ASSERT_TRUE(p.b->write_all(std::span(bytes).first(5), deadline_in(1s)));
  NetResult<proto::Message> early = c.receive(deadline_in(100ms));
  ASSERT_FALSE(early);
  EXPECT_EQ(early.error().kind, NetErrorKind::TIMEOUT);
  EXPECT_FALSE(c.broken());
  ASSERT_TRUE(p.b->write_all(std::span(bytes).subspan(5), deadline_in(1s)));
  NetResult<proto::Message> m = c.receive(deadline_in(1s));
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(std::get<proto::Ping>(*m).nonce, 42u);
}

TEST_P(FrameConnectionTest, PeerClosingBetweenFramesIsClosedInsideAFrameIsTruncated) {
  {
    testing::StreamPair p = testing::connected_pair(GetParam());
    FrameConnection c(std::move(p.a));
    ASSERT_TRUE(p.b->write_all(proto::encode_message(proto::Pong{1}), deadline_in(1s)));
    p.b->close();
    ASSERT_TRUE(c.receive(deadline_in(1s)));
    NetResult<proto::Message> m = c.receive(deadline_in(1s));
    ASSERT_FALSE(m);
    EXPECT_EQ(m.error().kind, NetErrorKind::CLOSED);
    EXPECT_TRUE(c.broken());
  }
  {
    testing::StreamPair p = testing::connected_pair(GetParam());
    FrameConnection c(std::move(p.a));
    std::vector<uint8_t> bytes = proto::encode_message(proto::Pong{1});
    ASSERT_TRUE(p.b->write_all(std::span(bytes).first(bytes.size() - 1), deadline_in(1s)));
    p.b->close();
    NetResult<proto::Message> m = c.receive(deadline_in(1s));
    ASSERT_FALSE(m);
    EXPECT_EQ(m.error().kind, NetErrorKind::PROTOCOL);
    EXPECT_EQ(m.error().proto, proto::ProtoErrorKind::TRUNCATED);
  }
}

TEST_P(FrameConnectionTest, SendOverThePeersLimitSendsNothing) {
  testing::StreamPair p = testing::connected_pair(GetParam());
  FrameConnection a(std::move(p.a)), b(std::move(p.b));
  a.set_peer_max_payload_bytes(1000);
  proto::ExpertResponse big{.request_id = 1, .n_outputs = 1, .n_embd = 1000, .outputs = {}};
  big.outputs.assign(1000, 1.f);
  NetStatus s = a.send(big, deadline_in(1s));
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().kind, NetErrorKind::TOO_LARGE);
  EXPECT_FALSE(a.broken());
  ASSERT_TRUE(a.send(proto::Ping{9}, deadline_in(1s)));
  NetResult<proto::Message> m = b.receive(deadline_in(1s));
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(std::get<proto::Ping>(*m).nonce, 9u);
}

// Runs the handshake on both ends at once.
std::pair<NetResult<proto::Hello>, NetResult<proto::Hello>> both_handshake(
    Transport t, proto::Hello backbone, proto::Hello worker, ConnectionOptions worker_options = {}) {
  testing::StreamPair p = testing::connected_pair(t);
  FrameConnection a(std::move(p.a)), b(std::move(p.b), worker_options);
  auto w = std::async(std::launch::async, [&] { return handshake(b, worker, deadline_in(5s)); });
  NetResult<proto::Hello> mine = handshake(a, backbone, deadline_in(5s));
  return {std::move(mine), w.get()};
}

TEST_P(FrameConnectionTest, HandshakeExchangesHellosAndLimits) {
  testing::StreamPair p = testing::connected_pair(GetParam());
  FrameConnection a(std::move(p.a)), b(std::move(p.b), {.max_payload_bytes = 1 << 20});
  auto w = std::async(std::launch::async, [&] { return handshake(b, hello(proto::Role::WORKER), deadline_in(5s)); });
  NetResult<proto::Hello> seen_by_backbone = handshake(a, hello(proto::Role::BACKBONE), deadline_in(5s));
  NetResult<proto::Hello> seen_by_worker = w.get();
  ASSERT_TRUE(seen_by_backbone) << seen_by_backbone.error().message;
  ASSERT_TRUE(seen_by_worker) << seen_by_worker.error().message;
  EXPECT_EQ(seen_by_backbone->holdings, hello(proto::Role::WORKER).holdings);
  EXPECT_EQ(seen_by_backbone->label, "worker");
  EXPECT_EQ(seen_by_worker->role, proto::Role::BACKBONE);
  EXPECT_EQ(a.peer_max_payload_bytes(), 1u << 20);
  EXPECT_EQ(b.peer_max_payload_bytes(), proto::kDefaultMaxPayloadBytes);
  // The connection carries requests afterwards.
  ASSERT_TRUE(a.send(proto::Ping{5}, deadline_in(1s)));
  NetResult<proto::Message> m = b.receive(deadline_in(1s));
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(std::get<proto::Ping>(*m).nonce, 5u);
}

TEST_P(FrameConnectionTest, HandshakeMismatchesAreRefusedOnBothSidesWithTheReason) {
  struct Case {
    const char* name;
    void (*spoil)(proto::Hello&);
    proto::RefuseReason reason;
  };
  const Case cases[] = {
      {"version", [](proto::Hello& h) { h.version = proto::kProtocolVersion + 1; }, proto::RefuseReason::VERSION},
      {"kernel abi", [](proto::Hello& h) { h.fingerprint.kernel_abi = 99; }, proto::RefuseReason::FINGERPRINT},
      {"model", [](proto::Hello& h) { h.model[0] ^= 1; }, proto::RefuseReason::MODEL},
      {"role", [](proto::Hello& h) { h.role = proto::Role::BACKBONE; }, proto::RefuseReason::ROLE},
  };
  for (const Case& k : cases) {
    proto::Hello worker = hello(proto::Role::WORKER);
    k.spoil(worker);
    auto [b, w] = both_handshake(GetParam(), hello(proto::Role::BACKBONE), worker);
    ASSERT_FALSE(b) << k.name;
    ASSERT_FALSE(w) << k.name;
    EXPECT_EQ(b.error().kind, NetErrorKind::REFUSED) << k.name << ": " << b.error().message;
    EXPECT_EQ(w.error().kind, NetErrorKind::REFUSED) << k.name << ": " << w.error().message;
    EXPECT_EQ(b.error().refuse, k.reason) << k.name << ": " << b.error().message;
    EXPECT_EQ(w.error().refuse, k.reason) << k.name << ": " << w.error().message;
  }
}

TEST_P(FrameConnectionTest, OneSidedRefusalReachesTheAcceptingSide) {
  // The worker accepts the backbone, the backbone refuses the worker's tiny frame limit: the worker
  // learns why from the REFUSE that follows its HELLO_ACK.
  auto [b, w] = both_handshake(GetParam(), hello(proto::Role::BACKBONE), hello(proto::Role::WORKER),
                               {.max_payload_bytes = 1000});
  ASSERT_FALSE(b);
  ASSERT_FALSE(w);
  EXPECT_EQ(b.error().refuse, proto::RefuseReason::LIMITS) << b.error().message;
  EXPECT_EQ(w.error().kind, NetErrorKind::REFUSED) << w.error().message;
  EXPECT_EQ(w.error().refuse, proto::RefuseReason::LIMITS) << w.error().message;
  EXPECT_NE(w.error().message.find("refused us"), std::string::npos) << w.error().message;
}

TEST_P(FrameConnectionTest, FirstFrameNotAHelloIsRefused) {
  testing::StreamPair p = testing::connected_pair(GetParam());
  FrameConnection worker(std::move(p.b)), rogue(std::move(p.a));
  auto w = std::async(std::launch::async, [&] { return handshake(worker, hello(proto::Role::WORKER), deadline_in(5s)); });
  ASSERT_TRUE(rogue.send(proto::Ping{1}, deadline_in(1s)));
  NetResult<proto::Hello> r = w.get();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().kind, NetErrorKind::REFUSED);
  EXPECT_EQ(r.error().refuse, proto::RefuseReason::BAD_HELLO);
  // The rogue peer reads the worker's HELLO, then the REFUSE naming what it sent.
  ASSERT_TRUE(rogue.receive(deadline_in(1s)));
  NetResult<proto::Message> refuse = rogue.receive(deadline_in(1s));
  ASSERT_TRUE(refuse) << refuse.error().message;
  EXPECT_NE(std::get<proto::Refuse>(*refuse).message.find("PING"), std::string::npos);
}

TEST_P(FrameConnectionTest, HandshakeWithASilentPeerTimesOut) {
  testing::StreamPair p = testing::connected_pair(GetParam());
  FrameConnection c(std::move(p.a));
  auto start = Clock::now();
  NetResult<proto::Hello> r = handshake(c, hello(proto::Role::BACKBONE), start + 200ms);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().kind, NetErrorKind::TIMEOUT);
  EXPECT_LT(Clock::now() - start, 3s);
}

INSTANTIATE_TEST_SUITE_P(AllTransports, FrameConnectionTest, ::testing::Values(Transport::PIPE, Transport::TCP),
                         testing::transport_name);

}  // namespace
}  // namespace essaim::net
