// The scheduler with speculative decoding (docs/speculative.md): 8 concurrent speculating sequences — greedy
// and seeded sampling, prompts chunked into steps shared with the others' K+1 verification rows, K adapting
// per sequence — each get exactly the tokens the same request gets alone without speculation; an EOG id, a
// full context and max_tokens end a sequence where plain decoding ends it; the counters add up.
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>

#include "backbone_test_util.h"
#include "serve/scheduler.h"
#include "sequence_collector.h"

namespace essaim::serve {
namespace {

using namespace std::chrono_literals;
using backbone::testing::ModelSpec;
using backbone::testing::SwarmModel;

using testing::Collector;

// Counts the executor calls per layer (one per layer per forward: the batching the scheduler promises).
class CountingExecutor final : public ExpertExecutor {
 public:
  explicit CountingExecutor(ExpertExecutor& inner) : inner_(inner) {}
  Status compute(const ExpertBatch& batch, std::span<float> out) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (calls_.size() <= size_t(batch.layer)) calls_.resize(size_t(batch.layer) + 1);
      ++calls_[size_t(batch.layer)];
    }
    return inner_.compute(batch, out);
  }
  bool may_fail() const override { return inner_.may_fail(); }
  uint64_t calls(int32_t layer) {
    std::lock_guard<std::mutex> lock(mu_);
    return size_t(layer) < calls_.size() ? calls_[size_t(layer)] : 0;
  }

 private:
  ExpertExecutor& inner_;
  std::mutex mu_;
  std::vector<uint64_t> calls_;
};

struct Outcome {
  std::vector<TokenId> tokens;
  FinishReason reason = FinishReason::NONE;
  bool operator==(const Outcome&) const = default;
};

SequenceRequest request(const SwarmModel& m, int i, int max_tokens) {
  SequenceRequest r{.prompt = m.tokens(size_t(4 + 3 * i), uint64_t(40 + i)), .max_tokens = max_tokens,
                    .sampling = {}, .eog = {}};
  r.sampling.temperature = i % 2 ? 0.8f : 0.0f;  // odd: seeded sampling
  r.sampling.seed = uint32_t(1000 + i);
  return r;
}

// Each request alone, plain decoding (no speculation), one sequence at a time.
Outcome alone(const SwarmModel& m, const SequenceRequest& r, ExpertExecutor& ex, ThreadPool& pool, int32_t n_ctx) {
  Scheduler sched(*m.model, &ex, &pool, {.parallel = 1, .batch_tokens = 512, .queue_capacity = 4, .cache = {.n_ctx = n_ctx}});
  Collector c;
  EXPECT_TRUE(sched.submit(r, c.sink()).handle);
  EXPECT_TRUE(c.wait());
  return {c.tokens, c.reason};
}

class SchedulerSpeculative : public ::testing::TestWithParam<ModelSpec> {};

TEST_P(SchedulerSpeculative, EightConcurrentSpeculatingSequencesEqualEachAlone) {
  const SwarmModel& m = SwarmModel::get(GetParam());
  ASSERT_TRUE(m.model->has_nextn());
  ThreadPool pool(2);
  LocalExpertExecutor local(m.model->expert_store(), &pool);
  constexpr int kSeqs = 8, kGen = 24;
  constexpr int32_t kCtx = 256;
  std::vector<SequenceRequest> requests;
  for (int i = 0; i < kSeqs; ++i) requests.push_back(request(m, i, kGen));
  requests[5].max_tokens = 3;  // ends inside a round
  std::vector<Outcome> want;
  for (const SequenceRequest& r : requests) want.push_back(alone(m, r, local, pool, kCtx));
  EXPECT_GT(std::set<TokenId>(want[1].tokens.begin(), want[1].tokens.end()).size(), 3u);  // sampling varies

  CountingExecutor counting(local);
  Scheduler sched(*m.model, &counting, &pool,
                  {.parallel = kSeqs, .batch_tokens = 16, .queue_capacity = 8, .cache = {.n_ctx = kCtx},
                   .spec = {.draft_max = 4, .draft_min = 1, .adaptive = true}});
  std::vector<Collector> got(kSeqs);
  for (int i = 0; i < kSeqs; ++i) ASSERT_TRUE(sched.submit(requests[size_t(i)], got[size_t(i)].sink()).handle);
  uint64_t generated = 0;
  for (int i = 0; i < kSeqs; ++i) {
    ASSERT_TRUE(got[size_t(i)].wait());
    EXPECT_EQ((Outcome{got[size_t(i)].tokens, got[size_t(i)].reason}), want[size_t(i)]) << "sequence " << i;
    generated += want[size_t(i)].tokens.size();
  }
  // The last step's counters are added after its final events went out: wait (bounded) for them.
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (sched.stats().generated_tokens < generated && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  const SchedulerStats s = sched.stats();
  EXPECT_EQ(s.generated_tokens, generated);
  EXPECT_GT(s.spec_rounds, 0u);
  EXPECT_GE(s.spec_drafted, s.spec_rounds);  // at least one draft each (draft_min 1)
  EXPECT_EQ(s.spec_tokens, s.spec_accepted + s.spec_rounds);
  if (!GetParam().file.empty()) EXPECT_GT(s.spec_accepted, 0u);  // the trained head drafts for real
  // One executor call per main layer per step for every sequence's rows; the MTP block's (layer n_layer) at
  // most K = 4 per step however many sequences draft (they go through it together).
  const int32_t n_layer = m.model->info().n_layer;
  EXPECT_EQ(counting.calls(0), s.steps);
  EXPECT_EQ(counting.calls(n_layer - 1), s.steps);
  EXPECT_GT(counting.calls(n_layer), 0u);
  EXPECT_LE(counting.calls(n_layer), 4 * s.steps);
  EXPECT_LT(counting.calls(n_layer), s.spec_drafted);  // fewer calls than drafts: batched across sequences
}

TEST_P(SchedulerSpeculative, ContextFullAndEndOfGenerationEndWherePlainDecodingEnds) {
  const SwarmModel& m = SwarmModel::get(GetParam());
  ThreadPool pool(1);
  LocalExpertExecutor local(m.model->expert_store(), &pool);
  // A context of prompt + 6: the rounds near the end have less room than K.
  SequenceRequest full = request(m, 0, 50);
  const int32_t n_ctx = int32_t(full.prompt.size()) + 6;
  // An EOG id: a token greedy decoding emits at its 4th step.
  SequenceRequest eog = request(m, 2, 20);
  const Outcome plain_eog = alone(m, eog, local, pool, 256);
  ASSERT_GE(plain_eog.tokens.size(), 4u);
  eog.eog = {plain_eog.tokens[3]};
  const Outcome want_full = alone(m, full, local, pool, n_ctx), want_eog = alone(m, eog, local, pool, 256);
  EXPECT_EQ(want_full.reason, FinishReason::LENGTH);
  EXPECT_EQ(want_eog.reason, FinishReason::STOP);
  for (int32_t k : {1, 3}) {
    for (const auto& [r, ctx, want] : {std::tuple{full, n_ctx, want_full}, std::tuple{eog, 256, want_eog}}) {
      Scheduler sched(*m.model, &local, &pool,
                      {.parallel = 2, .batch_tokens = 64, .queue_capacity = 4, .cache = {.n_ctx = ctx},
                       .spec = {.draft_max = k}});
      Collector c;
      ASSERT_TRUE(sched.submit(r, c.sink()).handle);
      ASSERT_TRUE(c.wait());
      EXPECT_EQ((Outcome{c.tokens, c.reason}), want) << "K=" << k << " n_ctx " << ctx;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, SchedulerSpeculative,
                         ::testing::Values(ModelSpec{.arch = SynthArch::QWEN35MOE, .nextn = 1},
                                           ModelSpec{.file = std::string(ESSAIM_SOURCE_DIR) +
                                                             "/models/kjv-moe-q4_k_m.gguf"}),
                         [](const auto& info) { return backbone::testing::spec_name(info.param); });

}  // namespace
}  // namespace essaim::serve
