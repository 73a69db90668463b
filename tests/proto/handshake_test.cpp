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
  p.worker.version = 2;
  std::optional<Refuse> r = check_hello(p.backbone, p.worker);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->reason, RefuseReason::VERSION);
  EXPECT_NE(r->message.find("v2"), std::string::npos) << r->message;
}

TEST(Handshake, FutureVersionHelloDecodesFarEnoughToRefuse) {
  // A v2 HELLO: the frozen prefix (magic, version) followed by a layout v1 does not know.
  std::vector<uint8_t> payload = {'E', 'S', 'S', 'M', 2, 0, 0xFF, 0xEE, 0xDD};
  ProtoResult<Message> m = decode_message(FrameType::HELLO, payload);
  ASSERT_TRUE(m) << m.error().message;
  const Hello& theirs = std::get<Hello>(*m);
  EXPECT_EQ(theirs.version, 2);
  std::optional<Refuse> r = check_hello(compatible_pair().backbone, theirs);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->reason, RefuseReason::VERSION);
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
