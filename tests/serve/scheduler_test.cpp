// The scheduler at the token-id level: every sequence of a concurrent batch gets exactly the tokens the
// model gives it alone (greedy and seeded sampling), prompts join and leave mid-flight, cancellation and a
// failing step free their sequences without touching the others.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <set>
#include <mutex>

#include "backbone_test_util.h"
#include "serve/scheduler.h"
#include "sequence_collector.h"

namespace essaim::serve {
namespace {

using namespace std::chrono_literals;
using backbone::testing::SwarmModel;

using testing::Collector;

std::vector<TokenId> prompt_of(const SwarmModel& m, size_t n, uint64_t seed) { return m.tokens(n, seed); }

// Reference: the model's own forward(), one sequence, prompt at once then one token per step.
std::vector<TokenId> reference_greedy(const SwarmModel& m, const std::vector<TokenId>& prompt, int n) {
  ThreadPool pool(1);
  LocalExpertExecutor local(m.model->expert_store(), &pool);
  return backbone::testing::greedy(m, prompt, n, local);
}

// qwen3moe (attention KV) and qwen35moe (gated delta-net recurrent state + gated attention): per-sequence
// caches of both kinds.
class SchedulerExact : public ::testing::TestWithParam<backbone::testing::ModelSpec> {};

TEST_P(SchedulerExact, ConcurrentGreedyEqualsAloneAndTheReference) {
  const SwarmModel& m = SwarmModel::get(GetParam());
  ThreadPool pool(2);
  LocalExpertExecutor local(m.model->expert_store(), &pool);
  // parallel 5 with 12 sequences: some wait in the queue and join while others decode; batch_tokens 16 cuts
  // the longer prompts into chunks that share steps with decode rows.
  Scheduler sched(*m.model, &local, &pool, {.parallel = 5, .batch_tokens = 16, .queue_capacity = 64, .cache = {.n_ctx = 256}});
  constexpr int kSeqs = 12, kGen = 10;
  std::vector<std::vector<TokenId>> prompts;
  for (int i = 0; i < kSeqs; ++i) prompts.push_back(prompt_of(m, size_t(3 + 5 * i), uint64_t(100 + i)));
  std::vector<Collector> got(kSeqs);
  for (int i = 0; i < kSeqs; ++i) {
    SubmitResult r = sched.submit({.prompt = prompts[i], .max_tokens = kGen, .sampling = {.temperature = 0}, .eog = {}},
                                  got[i].sink());
    ASSERT_TRUE(r.handle) << r.message;
  }
  for (int i = 0; i < kSeqs; ++i) {
    ASSERT_TRUE(got[i].wait());
    EXPECT_EQ(got[i].reason, FinishReason::LENGTH);
    EXPECT_EQ(got[i].tokens, reference_greedy(m, prompts[i], kGen)) << "sequence " << i;
  }
  const SchedulerStats s = sched.stats();
  EXPECT_EQ(s.generated_tokens, uint64_t(kSeqs * kGen));
  EXPECT_GT(s.batch_sequences.count(), 0u);
  EXPECT_LT(s.steps, uint64_t(kSeqs * kGen));  // batching happened: fewer steps than tokens
}

INSTANTIATE_TEST_SUITE_P(Models, SchedulerExact,
                         ::testing::Values(backbone::testing::ModelSpec{},
                                           backbone::testing::ModelSpec{.arch = SynthArch::QWEN35MOE}),
                         [](const auto& info) { return backbone::testing::spec_name(info.param); });

TEST(Scheduler, SeededSamplingDoesNotDependOnTheBatch) {
  const SwarmModel& m = SwarmModel::get({});
  ThreadPool pool(1);
  LocalExpertExecutor local(m.model->expert_store(), &pool);
  const SamplerParams sampling{.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 1234};
  const std::vector<TokenId> prompt = prompt_of(m, 9, 5);
  std::vector<TokenId> alone;
  {
    Scheduler sched(*m.model, &local, &pool, {.parallel = 1, .cache = {.n_ctx = 128}});
    Collector c;
    ASSERT_TRUE(sched.submit({.prompt = prompt, .max_tokens = 20, .sampling = sampling, .eog = {}}, c.sink()).handle);
    ASSERT_TRUE(c.wait());
    alone = c.tokens;
  }
  ASSERT_EQ(alone.size(), 20u);
  // The draws vary (a seeded sampler that always gave one token would prove nothing).
  EXPECT_GT(std::set<TokenId>(alone.begin(), alone.end()).size(), 3u);
  Scheduler sched(*m.model, &local, &pool, {.parallel = 6, .batch_tokens = 7, .cache = {.n_ctx = 128}});
  std::vector<Collector> others(5);
  Collector target;
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(sched.submit({.prompt = prompt_of(m, size_t(4 + i), uint64_t(i)), .max_tokens = 15 + i,
                              .sampling = {.temperature = 0.9f, .seed = uint32_t(i)}, .eog = {}},
                             others[i].sink()).handle);
  }
  ASSERT_TRUE(sched.submit({.prompt = prompt, .max_tokens = 20, .sampling = sampling, .eog = {}}, target.sink()).handle);
  ASSERT_TRUE(target.wait());
  EXPECT_EQ(target.tokens, alone);
  for (Collector& c : others) ASSERT_TRUE(c.wait());
}

TEST(Scheduler, EndOfGenerationIdStopsWithoutBeingEmitted) {
  const SwarmModel& m = SwarmModel::get({});
  ThreadPool pool(1);
  LocalExpertExecutor local(m.model->expert_store(), &pool);
  const std::vector<TokenId> prompt = prompt_of(m, 6, 9);
  const std::vector<TokenId> ref = reference_greedy(m, prompt, 6);
  Scheduler sched(*m.model, &local, &pool, {.parallel = 2, .cache = {.n_ctx = 64}});
  Collector c;
  ASSERT_TRUE(sched.submit({.prompt = prompt, .max_tokens = 6, .sampling = {.temperature = 0}, .eog = {ref[3]}}, c.sink()).handle);
  ASSERT_TRUE(c.wait());
  EXPECT_EQ(c.reason, FinishReason::STOP);
  const auto first = std::find(ref.begin(), ref.end(), ref[3]);
  EXPECT_EQ(c.tokens, std::vector<TokenId>(ref.begin(), first));
}

// llama-server's ignore_eos: the eog id is never sampled, the sequence runs to max_tokens, and up to where the
// model first picks that id its tokens are the plain ones.
TEST(Scheduler, IgnoredEndOfGenerationIdIsNeverSampled) {
  const SwarmModel& m = SwarmModel::get({});
  ThreadPool pool(1);
  LocalExpertExecutor local(m.model->expert_store(), &pool);
  const std::vector<TokenId> prompt = prompt_of(m, 6, 9);
  const std::vector<TokenId> ref = reference_greedy(m, prompt, 6);
  Scheduler sched(*m.model, &local, &pool, {.parallel = 2, .cache = {.n_ctx = 64}});
  Collector c;
  ASSERT_TRUE(sched.submit({.prompt = prompt, .max_tokens = 6, .sampling = {.temperature = 0}, .eog = {ref[3]},
                            .ignore_eog = true},
                           c.sink()).handle);
  ASSERT_TRUE(c.wait());
  EXPECT_EQ(c.reason, FinishReason::LENGTH);
  ASSERT_EQ(c.tokens.size(), 6u);
  EXPECT_EQ(std::count(c.tokens.begin(), c.tokens.end(), ref[3]), 0);
  const size_t first = size_t(std::find(ref.begin(), ref.end(), ref[3]) - ref.begin());
  EXPECT_EQ(std::vector<TokenId>(c.tokens.begin(), c.tokens.begin() + long(first)),
            std::vector<TokenId>(ref.begin(), ref.begin() + long(first)));
  EXPECT_NE(c.tokens[first], ref[3]);
  EXPECT_EQ(sched.submit({.prompt = prompt, .max_tokens = 1, .eog = {m.model->info().n_vocab}}, {}).error,
            SubmitError::BAD_REQUEST);
}

TEST(Scheduler, RefusesBadRequestsAndAFullQueue) {
  const SwarmModel& m = SwarmModel::get({});
  ThreadPool pool(1);
  LocalExpertExecutor local(m.model->expert_store(), &pool);
  Scheduler sched(*m.model, &local, &pool, {.parallel = 1, .queue_capacity = 0, .cache = {.n_ctx = 32}});
  EXPECT_EQ(sched.submit({.prompt = {}, .max_tokens = 1}, {}).error, SubmitError::BAD_REQUEST);
  EXPECT_EQ(sched.submit({.prompt = prompt_of(m, 32, 1), .max_tokens = 1}, {}).error, SubmitError::BAD_REQUEST);
  EXPECT_EQ(sched.submit({.prompt = {-1}, .max_tokens = 1}, {}).error, SubmitError::BAD_REQUEST);
  EXPECT_EQ(sched.submit({.prompt = {m.model->info().n_vocab}, .max_tokens = 1}, {}).error, SubmitError::BAD_REQUEST);
  EXPECT_EQ(sched.submit({.prompt = {1}, .max_tokens = -3}, {}).error, SubmitError::BAD_REQUEST);
  // One slot, no waiting room: the first long request is taken, the second refused until the first leaves.
  Collector first;
  SubmitResult taken = sched.submit({.prompt = {1, 2}, .max_tokens = 25, .sampling = {.temperature = 0}}, first.sink());
  ASSERT_TRUE(taken.handle);
  EXPECT_EQ(sched.submit({.prompt = {1, 2}, .max_tokens = 1}, {}).error, SubmitError::QUEUE_FULL);
  ASSERT_TRUE(first.wait());
  EXPECT_EQ(sched.submit({.prompt = {1, 2}, .max_tokens = 1}, {}).error, SubmitError::NONE);
}

TEST(Scheduler, ContextFullEndsWithLength) {
  const SwarmModel& m = SwarmModel::get({});
  ThreadPool pool(1);
  LocalExpertExecutor local(m.model->expert_store(), &pool);
  Scheduler sched(*m.model, &local, &pool, {.parallel = 1, .cache = {.n_ctx = 16}});
  Collector c;
  ASSERT_TRUE(sched.submit({.prompt = prompt_of(m, 10, 3), .max_tokens = 100, .sampling = {.temperature = 0}}, c.sink()).handle);
  ASSERT_TRUE(c.wait());
  EXPECT_EQ(c.reason, FinishReason::LENGTH);
  EXPECT_EQ(c.tokens.size(), 7u);  // 10 prompt + 6 fed back = 16 positions, then a 7th sampled from the last row
}

// An executor that fails its calls while `failing` is set: the step fails, its sequences end with ERROR, the
// scheduler carries on with the next requests.
class SwitchableExecutor final : public ExpertExecutor {
 public:
  SwitchableExecutor(const ExpertStore& store, ThreadPool* pool) : local_(store, pool) {}
  Status compute(const ExpertBatch& batch, std::span<float> out) override {
    if (failing.load()) return Status::error("injected executor failure");
    return local_.compute(batch, out);
  }
  std::atomic<bool> failing{false};

 private:
  LocalExpertExecutor local_;
};

TEST(Scheduler, AFailedStepFailsItsSequencesOnly) {
  const SwarmModel& m = SwarmModel::get({});
  ThreadPool pool(1);
  SwitchableExecutor ex(m.model->expert_store(), &pool);
  Scheduler sched(*m.model, &ex, &pool, {.parallel = 4, .cache = {.n_ctx = 64}});
  ex.failing = true;
  std::vector<Collector> failed(3);
  for (Collector& c : failed)
    ASSERT_TRUE(sched.submit({.prompt = prompt_of(m, 5, 2), .max_tokens = 5, .sampling = {.temperature = 0}}, c.sink()).handle);
  for (Collector& c : failed) {
    ASSERT_TRUE(c.wait());
    EXPECT_EQ(c.reason, FinishReason::ERROR);
    EXPECT_NE(c.error.find("injected executor failure"), std::string::npos) << c.error;
  }
  ex.failing = false;
  Collector ok;
  const std::vector<TokenId> prompt = prompt_of(m, 5, 2);
  ASSERT_TRUE(sched.submit({.prompt = prompt, .max_tokens = 5, .sampling = {.temperature = 0}}, ok.sink()).handle);
  ASSERT_TRUE(ok.wait());
  EXPECT_EQ(ok.reason, FinishReason::LENGTH);
  EXPECT_EQ(ok.tokens, reference_greedy(m, prompt, 5));
  EXPECT_GE(sched.stats().failed_steps, 1u);
  EXPECT_EQ(sched.stats().finished[size_t(FinishReason::ERROR)], 3u);
}

TEST(Scheduler, CancelledSequenceLeavesAndOthersAreUntouched) {
  const SwarmModel& m = SwarmModel::get({});
  ThreadPool pool(1);
  LocalExpertExecutor local(m.model->expert_store(), &pool);
  Scheduler sched(*m.model, &local, &pool, {.parallel = 2, .cache = {.n_ctx = 512}});
  Collector victim, survivor;
  // Cancel from the sink once the victim has its third token (and the handle is known): it leaves at the
  // next step.
  auto handle_mu = std::make_shared<std::mutex>();
  auto handle = std::make_shared<std::shared_ptr<SequenceHandle>>();
  auto inner = victim.sink();
  SubmitResult r = sched.submit({.prompt = prompt_of(m, 4, 8), .max_tokens = 400, .sampling = {.temperature = 0}},
                                [inner, handle_mu, handle, n = 0](const SequenceEvent& e) mutable {
                                  inner(e);
                                  std::lock_guard<std::mutex> lock(*handle_mu);
                                  if (++n >= 3 && *handle) (*handle)->cancel();
                                });
  ASSERT_TRUE(r.handle);
  {
    std::lock_guard<std::mutex> lock(*handle_mu);
    *handle = r.handle;
  }
  const std::vector<TokenId> prompt = prompt_of(m, 7, 4);
  ASSERT_TRUE(sched.submit({.prompt = prompt, .max_tokens = 12, .sampling = {.temperature = 0}}, survivor.sink()).handle);
  ASSERT_TRUE(victim.wait());
  EXPECT_EQ(victim.reason, FinishReason::CANCELLED);
  EXPECT_LT(victim.tokens.size(), 400u);
  ASSERT_TRUE(survivor.wait());
  EXPECT_EQ(survivor.tokens, reference_greedy(m, prompt, 12));
}

}  // namespace
}  // namespace essaim::serve
