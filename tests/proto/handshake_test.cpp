// The handshake's decision: compatible peers pass, each mismatch is refused with its own reason and a
// message naming both sides.
#include "proto/handshake.h"

#include <gtest/gtest.h>

#include "test_messages.h"

namespace essaim::proto {
namespace {

struct Pair {
  Hello backbone, worker;
};
Pair compatible_pair() {
  std::mt19937_64 rng(77);
  Pair p{testing::sample_hello(rng, Role::BACKBONE), testing::sample_hello(rng, Role::WORKER)};
  p.worker.model = p.backbone.model;
  return p;
}

TEST(Handshake, CompatiblePeersAcceptEachOther) {
  Pair p = compatible_pair();
  EXPECT_FALSE(check_hello(p.backbone, p.worker));
  EXPECT_FALSE(check_hello(p.worker, p.backbone));
}

TEST(Handshake, VersionMismatchRefused) {
  Pair p = compatible_pair();
  p.worker.version = kProtocolVersion + 1;
  std::optional<Refuse> r = check_hello(p.backbone, p.worker);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->reason, RefuseReason::VERSION);
  EXPECT_NE(r->message.find("v" + std::to_string(kProtocolVersion + 1)), std::string::npos) << r->message;
}

TEST(Handshake, FutureVersionHelloDecodesFarEnoughToRefuse) {
  // A HELLO of the next version: the frozen prefix (magic, version) followed by a layout this one does not
  // know; and one of v1, whose holdings carry no digests.
  for (uint8_t v : {uint8_t(kProtocolVersion + 1), uint8_t(1)}) {
  std::vector<uint8_t> payload = {'E', 'S', 'S', 'M', v, 0, 0xFF, 0xEE, 0xDD};
  ProtoResult<Message> m = decode_message(FrameType::HELLO, payload);
  ASSERT_TRUE(m) << m.error().message;
  const Hello& theirs = std::get<Hello>(*m);
  EXPECT_EQ(theirs.version, v);
  std::optional<Refuse> r = check_hello(compatible_pair().backbone, theirs);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->reason, RefuseReason::VERSION);
  }
}

TEST(Handshake, PeerCheckRunsLastAndItsRefusalIsSent) {
  Pair p = compatible_pair();
  int calls = 0;
  HandshakePolicy policy{.check_peer = [&](const Hello& theirs) -> std::optional<Refuse> {
    ++calls;
    if (theirs.holdings.empty()) return std::nullopt;
    return Refuse{RefuseReason::WEIGHTS, "holding of layer " + std::to_string(theirs.holdings[0].layer)};
  }};
  ASSERT_FALSE(p.worker.holdings.empty());
  std::optional<Refuse> r = check_hello(p.backbone, p.worker, policy);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->reason, RefuseReason::WEIGHTS);
  EXPECT_EQ(calls, 1);
  // Not called when an earlier check refuses.
  p.worker.model[0] ^= 1;
  r = check_hello(p.backbone, p.worker, policy);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->reason, RefuseReason::MODEL);
  EXPECT_EQ(calls, 1);
}

TEST(Handshake, KernelAbiMismatchRefused) {
  Pair p = compatible_pair();
  p.worker.fingerprint.kernel_abi += 1;
  std::optional<Refuse> r = check_hello(p.backbone, p.worker);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->reason, RefuseReason::FINGERPRINT);
  EXPECT_NE(r->message.find("kernel ABI"), std::string::npos) << r->message;
}

TEST(Handshake, IsaClassComparedOnlyUnderStrictPolicy) {
  Pair p = compatible_pair();
  p.worker.fingerprint.isa_class = "neon";
  EXPECT_FALSE(check_hello(p.backbone, p.worker));
  std::optional<Refuse> r = check_hello(p.backbone, p.worker, {.require_same_isa = true});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->reason, RefuseReason::FINGERPRINT);
  EXPECT_NE(r->message.find("neon"), std::string::npos) << r->message;
}

TEST(Handshake, ModelMismatchRefused) {
  Pair p = compatible_pair();
  p.worker.model[31] ^= 1;
  std::optional<Refuse> r = check_hello(p.worker, p.backbone);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->reason, RefuseReason::MODEL);
  EXPECT_NE(r->message.find(model_id_hex(p.backbone.model).substr(0, 16)), std::string::npos) << r->message;
}

TEST(Handshake, SameRoleRefused) {
  Pair p = compatible_pair();
  std::optional<Refuse> r = check_hello(p.backbone, p.backbone);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->reason, RefuseReason::ROLE);
}

TEST(Handshake, TinyFrameLimitRefused) {
  Pair p = compatible_pair();
  p.worker.max_payload_bytes = 1000;
  std::optional<Refuse> r = check_hello(p.backbone, p.worker);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->reason, RefuseReason::LIMITS);
}

}  // namespace
}  // namespace essaim::proto
