// Trust: the adaptive audit (backbone/audit_policy.h). A real worker core whose answers pass through a
// proxy that flips one exponent bit of every 3rd EXPERT_RESPONSE — a liar only an exact comparison can
// catch — is caught within the documented number of audits, dropped from the dispatch for good, and the
// tokens and logits equal the monolithic run. The schedule's numbers are checked as documented.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>

#include "backbone/audit_policy.h"
#include "backbone_test_util.h"
#include "proto/frame.h"

namespace essaim::backbone::testing {
namespace {

// Passes a worker's bytes through, flipping an exponent bit of the last output float of every `every`th
// EXPERT_RESPONSE frame (frames: 1 type byte, 8-byte little-endian payload length, payload).
class LyingStream final : public net::ByteStream {
 public:
  LyingStream(std::unique_ptr<net::ByteStream> inner, uint32_t every, std::atomic<uint64_t>* lies)
      : inner_(std::move(inner)), every_(every), lies_(lies) {}

  net::NetResult<size_t> read_some(std::span<uint8_t> buf, net::Deadline deadline) override {
    net::NetResult<size_t> n = inner_->read_some(buf, deadline);
    if (!n) return n;
    for (size_t i = 0; i < *n; ++i) step(buf[i]);
    return n;
  }
  net::NetStatus write_all(std::span<const uint8_t> bytes, net::Deadline deadline) override {
    return inner_->write_all(bytes, deadline);
  }
  void close() override { inner_->close(); }
  std::string peer_name() const override { return "liar(" + inner_->peer_name() + ")"; }

 private:
  void step(uint8_t& b) {
    if (header_fill_ < proto::kFrameHeaderBytes) {
      header_[header_fill_++] = b;
      if (header_fill_ == proto::kFrameHeaderBytes) {
        std::memcpy(&left_, header_ + 1, sizeof(left_));
        lie_ = header_[0] == uint8_t(proto::FrameType::EXPERT_RESPONSE) && ++responses_ % every_ == 0;
        if (left_ == 0) header_fill_ = 0;
      }
      return;
    }
    // The last float's top byte is the payload's last: its bit 0 is an exponent bit (the value x4 or /4).
    if (lie_ && left_ == 1) {
      b ^= 1;
      ++*lies_;
    }
    if (--left_ == 0) header_fill_ = 0;
  }

  std::unique_ptr<net::ByteStream> inner_;
  const uint32_t every_;
  std::atomic<uint64_t>* lies_;
  uint8_t header_[proto::kFrameHeaderBytes] = {};
  size_t header_fill_ = 0;
  uint64_t left_ = 0;
  uint64_t responses_ = 0;
  bool lie_ = false;
};

DispatchEndpoint lying(DispatchEndpoint honest, uint32_t every, std::atomic<uint64_t>* lies) {
  Connector inner = std::move(honest.connect);
  honest.name = "liar";
  honest.connect = [inner, every, lies](net::Deadline d) -> net::NetResult<std::unique_ptr<net::ByteStream>> {
    net::NetResult<std::unique_ptr<net::ByteStream>> s = inner(d);
    if (!s) return s;
    return std::unique_ptr<net::ByteStream>(std::make_unique<LyingStream>(std::move(*s), every, lies));
  };
  return honest;
}

TEST(AuditPolicy, TheDocumentedSchedule) {
  const AuditOptions o{.adaptive = true};
  EXPECT_EQ(AuditPolicy::interval(0, o), 1u);
  EXPECT_EQ(AuditPolicy::interval(3, o), 1u);
  EXPECT_EQ(AuditPolicy::interval(4, o), 2u);
  EXPECT_EQ(AuditPolicy::interval(8, o), 4u);
  EXPECT_EQ(AuditPolicy::interval(24, o), 64u);
  EXPECT_EQ(AuditPolicy::interval(1000, o), 64u);
  // An honest worker's first answers are all audited, then ever fewer; over 10 000 answers the audits
  // are 24 (the ramp, 252 answers) + (10000 - 252) / 64 = 176.
  AuditPolicy p(1, o);
  uint64_t audits = 0;
  for (int i = 0; i < 10'000; ++i) {
    if (p.should_audit(0)) {
      ++audits;
      p.record(0, true);
    }
    if (i == 3) EXPECT_EQ(audits, 4u);
  }
  EXPECT_EQ(audits, 24u + (10'000u - 252u) / 64u);
  p.record(0, false);
  EXPECT_TRUE(p.dropped(0));
  // Fixed mode: every Nth answer of the dispatcher, as --worker-audit N always did.
  AuditPolicy f(2, {.every = 3});
  EXPECT_FALSE(f.should_audit(0));
  EXPECT_FALSE(f.should_audit(1));
  EXPECT_TRUE(f.should_audit(0));
}

TEST(Audit, ALiarIsCaughtWithinThreeAuditsDroppedAndTheTokensNeverChange) {
  const SwarmModel& m = SwarmModel::get({SynthArch::QWEN3MOE, SynthTypeMix::Q4_K_M});
  ThreadPool pool(2);
  LocalExpertExecutor local(m.model->expert_store(), &pool);
  const std::vector<int32_t> tokens = m.tokens(8, 21);
  const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + 4);
  const std::vector<int32_t> want = greedy(m, prompt, 8, local);

  // The liar is first in map order (preferred for everything); an honest full replica stands behind it.
  std::atomic<uint64_t> lies{0};
  PipeWorker liar(m.split_experts(1)[0]);
  PipeWorker honest(m.split_experts(1)[0]);
  DispatchOptions o = patient_options();
  o.adaptive_audit = true;
  auto ex = RemoteExpertExecutor::create(m.model->expert_store(), m.identity,
                                         {lying(liar.endpoint("liar"), 3, &lies), honest.endpoint("honest")}, &pool, o);
  ASSERT_EQ(ex->wait_connected(net::deadline_in(30s)), 2u);

  EXPECT_EQ(greedy(m, prompt, 8, *ex), want) << "the tokens changed";
  expect_same_bits(eval_logits(m, tokens, *ex), mono_logits(m, tokens), "logits after the drop");
  const DispatchStats s = ex->stats();
  EXPECT_GE(lies.load(), 1u);
  EXPECT_EQ(s.workers[0].audits_failed, 1u) << s.to_json();
  // A new worker has every answer audited: the 3rd answer is the first lie and the 3rd audit.
  EXPECT_LE(s.workers[0].audits, 3u) << s.to_json();
  EXPECT_EQ(s.workers[0].requests, 3u) << "asked again after the drop: " << s.to_json();
  EXPECT_GT(s.workers[1].pairs_served, 0u) << "the honest replica took over: " << s.to_json();
  EXPECT_GT(s.fallback_pairs[size_t(FallbackReason::AUDIT_MISMATCH)], 0u);
}

// Without audits the same liar's flipped bits reach the logits: the proxy really lies, and the test above
// could fail.
TEST(Audit, WithoutAuditsTheLieReachesTheLogits) {
  const SwarmModel& m = SwarmModel::get({SynthArch::QWEN3MOE, SynthTypeMix::Q4_K_M});
  ThreadPool pool(2);
  const std::vector<int32_t> tokens = m.tokens(8, 21);
  std::atomic<uint64_t> lies{0};
  PipeWorker liar(m.split_experts(1)[0]);
  auto ex = RemoteExpertExecutor::create(m.model->expert_store(), m.identity, {lying(liar.endpoint("liar"), 1, &lies)},
                                         &pool, patient_options());
  ASSERT_EQ(ex->wait_connected(net::deadline_in(30s)), 1u);
  const std::vector<float> got = eval_logits(m, tokens, *ex);
  const std::vector<float> want = mono_logits(m, tokens);
  EXPECT_GT(lies.load(), 0u);
  EXPECT_NE(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace essaim::backbone::testing
