// The backbone never waits forever and never takes a wrong answer (docs/invariants.md invariant 5): workers that
// stall, close, answer garbage bytes, answer the wrong shape, answer typed errors, answer ids that were
// never asked, or answer wrong numbers (caught by the audit), are all survived with the monolithic logits,
// each layer call within the deadline plus the local compute. The misbehaving peer is a small server built
// from proto/ and net/ here: it completes a real handshake, then misbehaves in one way.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>

#include "backbone_test_util.h"
#include "slice/gguf_slice.h"
#include "slice/out_file.h"
#include "kernels/kernel_traits.h"
#include "net/frame_connection.h"

namespace essaim::backbone::testing {
namespace {

enum class Misbehaviour {
  STALL,          // reads requests, never answers
  CLOSE,          // closes the connection on the first request
  GARBAGE,        // answers with bytes that are not a frame (unknown type byte)
  TRUNCATED,      // answers a RESPONSE frame whose payload does not decode
  WRONG_SHAPE,    // a well-formed response with one output too many
  ERROR_ANSWER,   // ERROR UNKNOWN_EXPERT for every request
  WRONG_ID,       // a well-formed response to a request id never sent (then nothing)
  WRONG_VALUES,   // the right shape, random numbers: only an audit can tell
};

const char* name(Misbehaviour b) {
  switch (b) {
    case Misbehaviour::STALL: return "stall";
    case Misbehaviour::CLOSE: return "close";
    case Misbehaviour::GARBAGE: return "garbage";
    case Misbehaviour::TRUNCATED: return "truncated";
    case Misbehaviour::WRONG_SHAPE: return "wrong_shape";
    case Misbehaviour::ERROR_ANSWER: return "error_answer";
    case Misbehaviour::WRONG_ID: return "wrong_id";
    case Misbehaviour::WRONG_VALUES: return "wrong_values";
  }
  return "?";
}

// A test double of a misbehaving worker: claims every expert of every MoE layer of the model.
class BadWorker {
 public:
  BadWorker(const SwarmModel& m, Misbehaviour how, proto::ModelId model) : how_(how) {
    hello_.role = proto::Role::WORKER;
    hello_.fingerprint = {.kernel_abi = kKernelAbiVersion, .isa_class = std::string(isa_name(kernels_isa()))};
    hello_.model = model;
    hello_.label = std::string("bad:") + name(how);
    for (uint32_t l : m.moe_layers) hello_.holdings.push_back({l, 0, m.n_expert});
    auto hub = std::make_unique<net::PipeHub>();
    hub_ = hub.get();
    server_ = std::make_unique<net::StreamServer>(std::move(hub), [this](net::ByteStream& s) { serve(s); });
  }
  ~BadWorker() { server_->stop(); }

  DispatchEndpoint endpoint() {
    return DispatchEndpoint{.name = std::string("bad-") + name(how_),
                            .connect = [this](net::Deadline) -> net::NetResult<std::unique_ptr<net::ByteStream>> {
                              return hub_->connect();
                            },
                            .declared = std::nullopt};
  }
  uint64_t requests_seen() const { return requests_.load(); }

 private:
  void serve(net::ByteStream& stream) {
    net::FrameConnection c(stream);
    if (!net::handshake(c, hello_, net::deadline_in(10s))) return;
    std::mt19937_64 rng(42);
    for (;;) {
      net::NetResult<proto::Message> m = c.receive(net::kNoDeadline);
      if (!m) return;
      auto* req = std::get_if<proto::ExpertRequest>(&*m);
      if (req == nullptr) continue;
      ++requests_;
      const uint32_t E = 256;  // every tiny preset's n_embd
      proto::ExpertResponse resp;
      resp.request_id = req->request_id;
      resp.n_outputs = uint32_t(req->n_pairs());
      resp.n_embd = E;
      std::vector<uint8_t> raw;
      switch (how_) {
        case Misbehaviour::STALL: continue;
        case Misbehaviour::CLOSE: c.close(); return;
        case Misbehaviour::GARBAGE:
          raw.resize(64);
          for (uint8_t& b : raw) b = uint8_t(rng());
          raw[0] = 0xEE;  // not a frame type
          (void)c.send_raw(raw, net::deadline_in(5s));
          continue;
        case Misbehaviour::TRUNCATED:
          proto::append_frame_header(proto::FrameType::EXPERT_RESPONSE, 5, raw);
          raw.insert(raw.end(), {1, 2, 3, 4, 5});
          (void)c.send_raw(raw, net::deadline_in(5s));
          continue;
        case Misbehaviour::WRONG_SHAPE:
          resp.n_outputs += 1;
          resp.outputs.assign(size_t(resp.n_outputs) * E, 0.5f);
          break;
        case Misbehaviour::ERROR_ANSWER:
          (void)c.send(proto::ExpertError{.request_id = req->request_id, .code = proto::ErrorCode::UNKNOWN_EXPERT,
                                          .message = "I lied about my holdings"},
                       net::deadline_in(5s));
          continue;
        case Misbehaviour::WRONG_ID:
          resp.request_id += 1000;
          resp.outputs.assign(size_t(resp.n_outputs) * E, 0.5f);
          break;
        case Misbehaviour::WRONG_VALUES: {
          std::normal_distribution<float> normal(0.0f, 1.0f);
          resp.outputs.resize(size_t(resp.n_outputs) * E);
          for (float& v : resp.outputs) v = normal(rng);
          break;
        }
      }
      if (!c.send(resp, net::deadline_in(5s))) return;
    }
  }

  Misbehaviour how_;
  proto::Hello hello_;
  net::PipeHub* hub_ = nullptr;
  std::unique_ptr<net::StreamServer> server_;
  std::atomic<uint64_t> requests_{0};
};

struct FaultCase {
  Misbehaviour how;
  FallbackReason expected;
  uint32_t audit_every = 0;
};

void PrintTo(const FaultCase& c, std::ostream* os) { *os << name(c.how); }

class DispatchFault : public ::testing::TestWithParam<FaultCase> {};

constexpr auto kTimeout = 150ms;
// Local compute of a tiny layer takes well under a millisecond; the slack covers a loaded machine.
constexpr double kSlackSeconds = 2.0;

TEST_P(DispatchFault, TheResultIsTheMonolithicOneWithinTheDeadline) {
  const FaultCase fc = GetParam();
  const SwarmModel& m = SwarmModel::get({SynthArch::QWEN3MOE, SynthTypeMix::Q4_K_M});
  const std::vector<int32_t> tokens = m.tokens(8, 13);
  ThreadPool pool(2);
  LocalExpertExecutor local(m.model->expert_store(), &pool);
  const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + 4);
  const std::vector<int32_t> want_tokens = greedy(m, prompt, 6, local);

  // The bad worker is preferred for everything; a good worker is a full replica behind it, so pairs go
  // to the good one only while the bad one's session is down.
  BadWorker bad(m, fc.how, m.identity);
  PipeWorker good(m.split_experts(1)[0]);
  DispatchOptions o;
  o.timeout = kTimeout;
  o.audit_every = fc.audit_every;
  o.link.connect_timeout = 10s;
  o.link.backoff_initial = 20ms;
  o.link.backoff_max = 200ms;
  auto ex = RemoteExpertExecutor::create(m.model->expert_store(), m.identity, {bad.endpoint(), good.endpoint("good")},
                                         &pool, o);
  ASSERT_EQ(ex->wait_connected(net::deadline_in(30s)), 2u);
  EXPECT_FALSE(ex->may_fail()) << "a local copy answers whatever the workers do";

  expect_same_bits(eval_logits(m, tokens, *ex), mono_logits(m, tokens), name(fc.how));
  EXPECT_EQ(greedy(m, prompt, 6, *ex), want_tokens) << name(fc.how);

  const DispatchStats s = ex->stats();
  EXPECT_GT(bad.requests_seen(), 0u) << "the bad worker was never asked";
  EXPECT_GT(s.fallback_pairs[size_t(fc.expected)], 0u) << "expected fallbacks for " << fallback_reason_name(fc.expected)
                                                        << ": " << s.to_json();
  EXPECT_EQ(s.workers[0].pairs_served, 0u) << "a bad answer was accepted: " << s.to_json();
  EXPECT_GT(s.workers[0].failures, 0u);
  EXPECT_LT(s.max_call_seconds, std::chrono::duration<double>(kTimeout).count() + kSlackSeconds) << s.to_json();
  EXPECT_EQ(s.pairs, s.pairs_remote + s.pairs_local + s.pairs_fallback) << s.to_json();
}

INSTANTIATE_TEST_SUITE_P(
    Peers, DispatchFault,
    ::testing::Values(FaultCase{Misbehaviour::STALL, FallbackReason::TIMEOUT},
                      FaultCase{Misbehaviour::CLOSE, FallbackReason::DISCONNECTED},
                      FaultCase{Misbehaviour::GARBAGE, FallbackReason::PROTOCOL},
                      FaultCase{Misbehaviour::TRUNCATED, FallbackReason::PROTOCOL},
                      FaultCase{Misbehaviour::WRONG_SHAPE, FallbackReason::BAD_RESPONSE},
                      FaultCase{Misbehaviour::ERROR_ANSWER, FallbackReason::ERROR_RESPONSE},
                      FaultCase{Misbehaviour::WRONG_ID, FallbackReason::TIMEOUT},
                      FaultCase{Misbehaviour::WRONG_VALUES, FallbackReason::AUDIT_MISMATCH, /*audit_every=*/1}),
    [](const auto& info) { return std::string(name(info.param.how)); });

// The audit is what stands between a lying worker and the logits: without it, wrong numbers get through.
// (This is also what shows the peer above really answers, and that the test could fail.)
TEST(DispatchAudit, WithoutTheAuditWrongNumbersReachTheLogits) {
  const SwarmModel& m = SwarmModel::get({SynthArch::QWEN3MOE, SynthTypeMix::Q4_K_M});
  const std::vector<int32_t> tokens = m.tokens(8, 13);
  BadWorker bad(m, Misbehaviour::WRONG_VALUES, m.identity);
  ThreadPool pool(2);
  auto ex = RemoteExpertExecutor::create(m.model->expert_store(), m.identity, {bad.endpoint()}, &pool,
                                         patient_options());
  ASSERT_EQ(ex->wait_connected(net::deadline_in(30s)), 1u);
  const std::vector<float> got = eval_logits(m, tokens, *ex);
  const std::vector<float> want = mono_logits(m, tokens);
  EXPECT_NE(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
  EXPECT_GT(ex->stats().workers[0].pairs_served, 0u);
}

TEST(DispatchHandshake, AWorkerOfAnotherModelIsRefusedAndEverythingRunsLocally) {
  const SwarmModel& m = SwarmModel::get({SynthArch::QWEN3MOE, SynthTypeMix::Q4_K_M});
  proto::ModelId other = m.identity;
  other[0] ^= 1;
  BadWorker stranger(m, Misbehaviour::STALL, other);
  ThreadPool pool(2);
  auto ex = RemoteExpertExecutor::create(m.model->expert_store(), m.identity, {stranger.endpoint()}, &pool,
                                         patient_options());
  EXPECT_EQ(ex->wait_connected(net::deadline_in(30s)), 0u);
  const std::vector<int32_t> tokens = m.tokens(6, 2);
  expect_same_bits(eval_logits(m, tokens, *ex), mono_logits(m, tokens));
  const DispatchStats s = ex->stats();
  EXPECT_EQ(stranger.requests_seen(), 0u);
  EXPECT_EQ(s.pairs_local, s.pairs);
  EXPECT_NE(s.workers[0].last_error.find("MODEL"), std::string::npos) << s.workers[0].last_error;
}

TEST(DispatchHandshake, AnUnreachableWorkerNeverDelaysALayerCall) {
  const SwarmModel& m = SwarmModel::get({SynthArch::QWEN3MOE, SynthTypeMix::Q4_K_M});
  ThreadPool pool(2);
  DispatchEndpoint nowhere{.name = "nowhere",
                           .connect = [](net::Deadline d) -> net::NetResult<std::unique_ptr<net::ByteStream>> {
                             std::this_thread::sleep_until(std::min(d, net::deadline_in(3s)));
                             return net::net_error(net::NetErrorKind::TIMEOUT, "connect timed out");
                           },
                           .declared = std::vector<proto::Holding>{{m.moe_layers.front(), 0, m.n_expert}}};
  DispatchOptions o = patient_options();
  o.timeout = 5s;
  auto ex = RemoteExpertExecutor::create(m.model->expert_store(), m.identity, {std::move(nowhere)}, &pool, o);
  const std::vector<int32_t> tokens = m.tokens(6, 4);
  expect_same_bits(eval_logits(m, tokens, *ex, 1), mono_logits(m, tokens));
  const DispatchStats s = ex->stats();
  // Declared but down: a fallback (UNAVAILABLE), computed at once without waiting for the connect.
  EXPECT_GT(s.fallback_pairs[size_t(FallbackReason::UNAVAILABLE)], 0u) << s.to_json();
  EXPECT_LT(s.max_call_seconds, 1.5) << "a layer call waited for the connect: " << s.to_json();
  EXPECT_EQ(s.requests, 0u);
}

// Logits [n][V] of one forward over all tokens, or the forward's error.
Result<std::vector<float>> forward_all(const Model& model, std::span<const int32_t> tokens, ExpertExecutor& ex) {
  ThreadPool pool(2);
  SequenceCache cache = model.new_cache({.kv_type = KvType::F16, .n_ctx = int32_t(tokens.size())});
  std::vector<float> logits(tokens.size() * size_t(model.info().n_vocab));
  ESSAIM_RETURN_IF_ERROR(model.forward({.tokens = tokens, .cache = &cache, .experts = &ex, .pool = &pool,
                                        .logits_mode = LogitsMode::ALL, .logits = logits}));
  return logits;
}

class LeanFault : public ::testing::TestWithParam<FaultCase> {};

// Without a local copy, every misbehaviour of the preferred worker is survived by the other replica: a
// failed answer is asked of it, a late one (no history: half the deadline) is hedged to it. The logits are
// the monolithic ones and no answer of the bad worker is used.
TEST_P(LeanFault, AnotherReplicaAnswersWithTheMonolithicBits) {
  const FaultCase fc = GetParam();
  const SwarmModel& m = SwarmModel::get({SynthArch::QWEN3MOE, SynthTypeMix::Q4_K_M});
  const std::unique_ptr<Model> lean = backbone_only_model(m);
  ASSERT_NE(lean, nullptr);
  const std::vector<int32_t> tokens = m.tokens(8, 13);
  ThreadPool pool(2);
  BadWorker bad(m, fc.how, m.identity);
  PipeWorker good(m.split_experts(1)[0]);
  DispatchOptions o;  // map order (the bad one first), hedging off: the lean path forces it
  o.timeout = 400ms;
  o.link.connect_timeout = 10s;
  o.link.backoff_initial = 20ms;
  o.link.backoff_max = 200ms;
  auto ex = RemoteExpertExecutor::create(lean->expert_store(), m.identity, {bad.endpoint(), good.endpoint("good")},
                                         &pool, o);
  ASSERT_EQ(ex->wait_connected(net::deadline_in(30s)), 2u);
  for (int round = 0; round < 2; ++round) {  // the second after the bad worker reconnected (or not)
    Result<std::vector<float>> got = forward_all(*lean, tokens, *ex);
    ASSERT_TRUE(got) << name(fc.how) << ": " << got.status().message();
    expect_same_bits(*got, mono_logits(m, tokens), name(fc.how));
  }
  const DispatchStats s = ex->stats();
  EXPECT_GT(bad.requests_seen(), 0u) << "the bad worker was never asked";
  EXPECT_EQ(s.workers[0].pairs_served, 0u) << "a bad answer was accepted: " << s.to_json();
  EXPECT_GT(s.hedges + s.pairs_retried, 0u) << s.to_json();
  EXPECT_EQ(s.calls_failed, 0u) << s.to_json();
  EXPECT_EQ(s.audits, 0u) << "nothing to audit against";
  EXPECT_LT(s.max_call_seconds, 0.4 + kSlackSeconds) << s.to_json();
}

INSTANTIATE_TEST_SUITE_P(
    Peers, LeanFault,
    ::testing::Values(FaultCase{Misbehaviour::STALL, FallbackReason::TIMEOUT},
                      FaultCase{Misbehaviour::CLOSE, FallbackReason::DISCONNECTED},
                      FaultCase{Misbehaviour::GARBAGE, FallbackReason::PROTOCOL},
                      FaultCase{Misbehaviour::TRUNCATED, FallbackReason::PROTOCOL},
                      FaultCase{Misbehaviour::WRONG_SHAPE, FallbackReason::BAD_RESPONSE},
                      FaultCase{Misbehaviour::ERROR_ANSWER, FallbackReason::ERROR_RESPONSE},
                      FaultCase{Misbehaviour::WRONG_ID, FallbackReason::TIMEOUT}),
    [](const auto& info) { return std::string(name(info.param.how)); });

// The bad worker alone: no replica answers, so every call fails with the layer and experts named, within
// the deadline, and the caches are left as they were (the forward is all-or-nothing).
TEST_P(LeanFault, WithNoReplicaLeftTheCallFailsNamingLayerAndExperts) {
  const FaultCase fc = GetParam();
  const SwarmModel& m = SwarmModel::get({SynthArch::QWEN3MOE, SynthTypeMix::Q4_K_M});
  const std::unique_ptr<Model> lean = backbone_only_model(m);
  ASSERT_NE(lean, nullptr);
  ThreadPool pool(2);
  BadWorker bad(m, fc.how, m.identity);
  DispatchOptions o;
  o.timeout = 300ms;
  o.link.connect_timeout = 10s;
  auto ex = RemoteExpertExecutor::create(lean->expert_store(), m.identity, {bad.endpoint()}, &pool, o);
  ASSERT_EQ(ex->wait_connected(net::deadline_in(30s)), 1u);
  EXPECT_TRUE(ex->may_fail()) << "without a local copy a call fails when no replica answers";
  const std::vector<int32_t> tokens = m.tokens(4, 5);
  const auto t0 = std::chrono::steady_clock::now();
  Result<std::vector<float>> got = forward_all(*lean, tokens, *ex);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(got) << name(fc.how);
  const std::string msg = got.status().message();  // a copy: status() returns by value
  EXPECT_NE(msg.find("layer 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expert"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no copy of the experts"), std::string::npos) << msg;
  EXPECT_LT(secs, 0.3 + kSlackSeconds) << msg;
  EXPECT_EQ(ex->stats().calls_failed, 1u) << ex->stats().to_json();
}

// A session the dispatcher failed is closed at once but ended by the link's reader thread a moment later.
// In between it is not live: a lean backbone asking "another replica" after a worker failed had picked
// that worker's closing session and failed the whole layer ("connection to pipe#… is closed"; under load,
// LeanFault above failed that way 2 runs in 10).
TEST(WorkerLinkSession, AFailedSessionIsNotLiveWhileItCloses) {
  const SwarmModel& m = SwarmModel::get({SynthArch::QWEN3MOE, SynthTypeMix::Q4_K_M});
  PipeWorker w(m.split_experts(1)[0]);
  DispatchEndpoint e = w.endpoint("w");
  proto::Hello mine;
  mine.role = proto::Role::BACKBONE;
  mine.fingerprint = {.kernel_abi = kKernelAbiVersion, .isa_class = std::string(isa_name(kernels_isa()))};
  std::copy(m.identity.begin(), m.identity.end(), mine.model.begin());
  LinkOptions o;
  o.backoff_initial = 10s;  // no new session during the checks
  o.backoff_max = 10s;
  WorkerLink link(LinkEndpoint{.name = e.name, .connect = std::move(e.connect)}, mine, o);
  ASSERT_TRUE(link.wait_first_attempt(net::deadline_in(30s)));
  for (int round = 0; round < 20 && link.session() == nullptr; ++round) std::this_thread::sleep_for(10ms);
  const std::shared_ptr<LinkSession> s = link.session();
  ASSERT_NE(s, nullptr);
  link.fail(*s, FallbackReason::TIMEOUT, "given up on by the test");
  EXPECT_EQ(link.session(), nullptr) << "a failed session must not be handed out while it closes";
}

}  // namespace
}  // namespace essaim::backbone::testing
