// The prompt cache (serve/prompt_cache.h): a prompt resumed from a cached prefix gives the logits of every
// later position — its own remaining prompt positions and every generated one — bit for bit as the same
// prompt computed from scratch in one chunk, on qwen3moe (attention K/V only), qwen35moe (Gated DeltaNet
// checkpoints + attention) and the trained qwen35moe model, for shared prefixes on and off checkpoint
// positions; the scheduler's batches mixing resumed and fresh sequences give each its tokens alone; entries
// leave least recently used first within the budget.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "backbone/remote_executor.h"
#include "backbone_test_util.h"
#include "serve/prompt_cache.h"
#include "serve/scheduler.h"
#include "sequence_collector.h"

namespace essaim::serve {
namespace {

using backbone::testing::ModelSpec;
using backbone::testing::SwarmModel;
using testing::Collector;

// Logits of positions [restored, prompt end) and of each of n greedy tokens after the prompt, in that order.
struct Prefill {
  size_t restored = 0;
  std::vector<float> logits;
  std::vector<TokenId> tokens;
};

// `prompt` through the cache's protocol, as the scheduler drives it: restored from the longest cached prefix,
// the rest in chunks of at most `chunk` tokens cut at checkpoint positions, then n greedy tokens one by one.
Prefill run_through(const SwarmModel& m, PromptCache& pc, const std::vector<TokenId>& prompt, size_t chunk, int n) {
  ThreadPool pool(2);
  LocalExpertExecutor local(m.model->expert_store(), &pool);
  const size_t V = size_t(m.model->info().n_vocab);
  SequenceCache cache = m.model->new_cache({.kv_type = KvType::F16, .n_ctx = int32_t(prompt.size()) + n});
  PromptCache::Recording rec;
  Prefill run;
  size_t done = run.restored = pc.begin(prompt, cache, rec);
  EXPECT_EQ(size_t(cache.n_past()), done);
  std::vector<float> logits;
  while (done < prompt.size()) {
    const size_t k = std::min(chunk, pc.chunk_end(rec, done, prompt.size()) - done);
    logits.assign(k * V, 0.0f);
    const Status s = m.model->forward({.tokens = std::span(prompt).subspan(done, k), .cache = &cache,
                                       .experts = &local, .pool = &pool, .logits_mode = LogitsMode::ALL,
                                       .logits = logits});
    EXPECT_TRUE(s.is_ok()) << s.message();
    run.logits.insert(run.logits.end(), logits.begin(), logits.end());
    done += k;
    pc.prefilled(rec, prompt, cache);
  }
  for (int i = 0; i < n; ++i) {
    const auto last = run.logits.end() - ptrdiff_t(V);
    const TokenId id = TokenId(std::max_element(last, run.logits.end()) - last);
    run.tokens.push_back(id);
    logits.assign(V, 0.0f);
    const Status s = m.model->forward({.tokens = std::span<const TokenId>(&id, 1), .cache = &cache, .experts = &local,
                                       .pool = &pool, .logits_mode = LogitsMode::LAST, .logits = logits});
    EXPECT_TRUE(s.is_ok()) << s.message();
    run.logits.insert(run.logits.end(), logits.begin(), logits.end());
  }
  return run;
}

// The same prompt computed from scratch in one forward (no cache).
Prefill uncached(const SwarmModel& m, const std::vector<TokenId>& prompt, int n) {
  PromptCache off({.budget_bytes = 0});
  return run_through(m, off, prompt, prompt.size(), n);
}

// `base` for its first `shared` tokens, then `tail` other tokens (the first differs from base's next one).
std::vector<TokenId> sharing(const SwarmModel& m, const std::vector<TokenId>& base, size_t shared, size_t tail,
                             uint64_t seed) {
  std::vector<TokenId> p(base.begin(), base.begin() + ptrdiff_t(shared));
  std::vector<TokenId> more = m.tokens(tail, seed);
  const TokenId V = TokenId(m.model->info().n_vocab);
  if (shared < base.size() && !more.empty() && more[0] == base[shared]) more[0] = (more[0] + 1) % V;
  p.insert(p.end(), more.begin(), more.end());
  return p;
}

struct Case {
  ModelSpec spec;
  int32_t interval;     // checkpoint_interval
  size_t base;          // the cached prompt's length
  size_t chunk;         // prefill chunk of the cached runs
  std::vector<size_t> shared;  // prefixes the later prompts share with it
};

std::string case_name(const Case& c) { return backbone::testing::spec_name(c.spec); }

void PrintTo(const Case& c, std::ostream* os) { *os << case_name(c) << " interval " << c.interval; }

class PromptCacheExact : public ::testing::TestWithParam<Case> {};

// Where the cache lets a prompt resume: its shared prefix less its last token; with recurrent layers, down
// to the cached prompt's last checkpoint within that (multiples of the interval, and its length − 1).
size_t expected_resume(const Case& c, bool recurrent, size_t common, size_t prompt_size) {
  const size_t limit = std::min(common, prompt_size - 1);
  if (!recurrent) return limit;
  size_t best = 0;
  for (size_t n = 1; n < c.base; ++n)
    if ((n % size_t(c.interval) == 0 || n + 1 == c.base) && n <= limit) best = n;
  return best;
}

TEST_P(PromptCacheExact, ResumedPromptsGiveTheUncachedLogitsBitForBit) {
  const Case& c = GetParam();
  const SwarmModel& m = SwarmModel::get(c.spec);
  const bool recurrent = m.model->info().recurrent_state_bytes > 0;
  const size_t V = size_t(m.model->info().n_vocab);
  constexpr int kGen = 4;
  const std::vector<TokenId> base = m.tokens(c.base, 11);
  PromptCache pc({.budget_bytes = -1, .checkpoint_interval = c.interval});
  const Prefill first = run_through(m, pc, base, c.chunk, kGen);
  EXPECT_EQ(first.restored, 0u);
  std::set<size_t> resumed_at;
  for (size_t shared : c.shared) {
    SCOPED_TRACE("shared prefix " + std::to_string(shared));
    // shared == base: the same prompt again; base + 1: the whole prompt and more after it.
    const std::vector<TokenId> prompt =
        shared == c.base ? base : sharing(m, base, std::min(shared, c.base), 23, 100 + shared);
    const size_t common = std::min(shared, c.base);
    const Prefill want = uncached(m, prompt, kGen);
    const Prefill got = run_through(m, pc, prompt, c.chunk, kGen);
    ASSERT_EQ(got.restored, expected_resume(c, recurrent, common, prompt.size()));
    resumed_at.insert(got.restored);
    EXPECT_EQ(got.tokens, want.tokens);
    ASSERT_EQ(want.logits.size(), (prompt.size() + kGen) * V);
    const std::span<const float> tail = std::span(want.logits).subspan(got.restored * V);
    backbone::testing::expect_same_bits(got.logits, tail, "logits from the resumed position on");
  }
  EXPECT_GE(resumed_at.size(), 3u);  // the prefixes resumed at different positions (0 among them, a miss)
  const PromptCacheStats s = pc.stats();
  EXPECT_GT(s.hits, 0u);
  EXPECT_GT(s.tokens_reused, 0u);
}

INSTANTIATE_TEST_SUITE_P(
    Models, PromptCacheExact,
    ::testing::Values(
        // Attention only: any prefix resumes (checkpoint_interval has no effect).
        Case{.spec = {}, .interval = 16, .base = 70, .chunk = 9, .shared = {0, 5, 16, 33, 69, 70, 71}},
        // Gated DeltaNet: on a checkpoint (16, 48), between (33: from 32), before the first (5: a miss), the
        // whole prompt (70: from 69, its last checkpoint), the prompt and more (71).
        Case{.spec = {.arch = SynthArch::QWEN35MOE}, .interval = 16, .base = 70, .chunk = 9,
             .shared = {0, 5, 16, 33, 48, 69, 70, 71}},
        // The trained model at the server's interval: prompts of 600 tokens prefilled in steps of 128.
        Case{.spec = {.file = std::string(ESSAIM_SOURCE_DIR) + "/models/kjv-moe-q4_k_m.gguf"}, .interval = 256,
             .base = 600, .chunk = 128, .shared = {100, 256, 300, 599, 600, 601}}),
    [](const auto& info) { return case_name(info.param); });

// A prompt of n tokens prefilled into `pc` in one chunk (as far as checkpoints allow): its entry.
void fill(const SwarmModel& m, PromptCache& pc, const std::vector<TokenId>& prompt) {
  run_through(m, pc, prompt, prompt.size(), 0);
}

bool resumes(const SwarmModel& m, PromptCache& pc, const std::vector<TokenId>& prompt) {
  SequenceCache cache = m.model->new_cache({.kv_type = KvType::F16, .n_ctx = int32_t(prompt.size()) + 1});
  PromptCache::Recording rec;
  return pc.begin(prompt, cache, rec) > 0;
}

TEST(PromptCacheBudget, EntriesLeaveLeastRecentlyUsedFirst) {
  const SwarmModel& m = SwarmModel::get({});
  std::vector<std::vector<TokenId>> p;
  for (uint64_t i = 0; i < 4; ++i) {
    p.push_back(m.tokens(40, 200 + i));
    p.back()[0] = TokenId(i);  // no two share even a first token
  }
  PromptCache probe({.budget_bytes = -1});
  fill(m, probe, p[0]);
  const uint64_t entry = probe.stats().bytes;
  ASSERT_GT(entry, 40u * sizeof(TokenId));  // K/V rows and the tokens
  PromptCache pc({.budget_bytes = int64_t(entry * 5 / 2)});  // two entries fit, not three
  fill(m, pc, p[0]);
  fill(m, pc, p[1]);
  fill(m, pc, p[2]);  // p[0] leaves
  PromptCacheStats s = pc.stats();
  EXPECT_EQ(s.evictions, 1u);
  EXPECT_EQ(s.entries, 2u);
  EXPECT_LE(s.bytes, entry * 5 / 2);
  EXPECT_FALSE(resumes(m, pc, p[0]));
  EXPECT_TRUE(resumes(m, pc, p[1]));  // p[1] is now the most recently used
  fill(m, pc, p[3]);                  // so p[2] leaves
  EXPECT_TRUE(resumes(m, pc, p[1]));
  EXPECT_FALSE(resumes(m, pc, p[2]));
  s = pc.stats();
  EXPECT_EQ(s.evictions, 2u);
  EXPECT_EQ(s.hits, 2u);
  EXPECT_EQ(s.misses, 2u + 4u);  // p[2] and p[0] probed, and each fill's own lookup

  PromptCache tiny({.budget_bytes = int64_t(entry / 2)});
  fill(m, tiny, p[0]);
  EXPECT_EQ(tiny.stats().too_large, 1u);
  EXPECT_EQ(tiny.stats().entries, 0u);
  EXPECT_EQ(tiny.stats().bytes, 0u);
}

TEST(PromptCacheBudget, CheckpointsOfASharedPrefixAreHeldOnce) {
  const SwarmModel& m = SwarmModel::get({.arch = SynthArch::QWEN35MOE});
  const std::vector<TokenId> a = m.tokens(40, 300);  // checkpoints at 16, 32, 39
  PromptCache pc({.budget_bytes = -1, .checkpoint_interval = 16});
  fill(m, pc, a);
  EXPECT_EQ(pc.stats().checkpoints, 3u);
  const uint64_t one = pc.stats().bytes;
  fill(m, pc, sharing(m, a, 35, 20, 301));  // resumes at 32 with a's 16 and 32; its own: 48, 54
  const PromptCacheStats s = pc.stats();
  EXPECT_EQ(s.entries, 2u);
  EXPECT_EQ(s.checkpoints, 5u);
  EXPECT_LT(s.bytes, 2 * one);
  fill(m, pc, a);  // the same prompt again (from 39): replaces its older entry
  EXPECT_EQ(pc.stats().entries, 2u);
  EXPECT_EQ(pc.stats().replaced, 1u);
  EXPECT_EQ(pc.stats().checkpoints, 5u);
}

TEST(PromptCacheBudget, APrefillSkipsACheckpointItsEntryCouldNotHold) {
  const SwarmModel& m = SwarmModel::get({.arch = SynthArch::QWEN35MOE});
  const std::vector<TokenId> a = m.tokens(70, 500);  // checkpoints at 16, 32, 48, 64, 69
  PromptCache probe({.budget_bytes = -1, .checkpoint_interval = 16});
  fill(m, probe, a);
  ASSERT_EQ(probe.stats().checkpoints, 5u);
  uint64_t checkpoint = 0;
  const SequenceCache fresh = m.model->new_cache({.n_ctx = 8});
  for (int32_t il = 0; il < fresh.n_layers(); ++il)
    if (const auto* r = std::get_if<RecurrentState>(&fresh.layer(il)))
      checkpoint += (r->conv.size() + r->state.size()) * sizeof(float);
  ASSERT_GT(checkpoint, 0u);
  // Room for the entry with four checkpoints, not five: the last (69) is skipped, the entry kept.
  PromptCache pc({.budget_bytes = int64_t(probe.stats().bytes - checkpoint), .checkpoint_interval = 16});
  fill(m, pc, a);
  PromptCacheStats s = pc.stats();
  EXPECT_EQ(s.checkpoints_skipped, 1u);
  EXPECT_EQ(s.entries, 1u);
  EXPECT_EQ(s.checkpoints, 4u);
  EXPECT_EQ(s.pending_bytes, 0u);
  EXPECT_LE(s.bytes, uint64_t(pc.stats().budget_bytes));
  SequenceCache cache = m.model->new_cache({.n_ctx = 128});
  PromptCache::Recording rec;
  EXPECT_EQ(pc.begin(sharing(m, a, 70, 10, 501), cache, rec), 64u);  // from the last checkpoint it took
  EXPECT_EQ(pc.stats().pending_bytes, 0u);  // the checkpoints it resumed with are the entry's: held, not pending
}

// The scheduler with the cache on gives every sequence exactly the tokens it gets with the cache off, greedy
// and seeded, while a batch mixes sequences resumed from cached prefixes with fresh ones.
class SchedulerPromptCache : public ::testing::TestWithParam<ModelSpec> {};

// The two waves through one scheduler (the second submitted once the first is done): every sequence's tokens.
std::vector<std::vector<TokenId>> serve_all(const Model& model, ExpertExecutor& experts, ThreadPool& pool,
                                            const std::vector<SequenceRequest>& first,
                                            const std::vector<SequenceRequest>& then, PromptCacheOptions cache,
                                            SchedulerStats* stats, SpecOptions spec = {.draft_max = 0}) {
  Scheduler sched(model, &experts, &pool,
                  {.parallel = 4, .batch_tokens = 16, .queue_capacity = 64, .cache = {.n_ctx = 256}, .spec = spec,
                   .prompt_cache = cache});
  std::vector<std::vector<TokenId>> out;
  for (const auto* wave : {&first, &then}) {
    std::vector<Collector> got(wave->size());
    for (size_t i = 0; i < wave->size(); ++i) EXPECT_TRUE(sched.submit((*wave)[i], got[i].sink()).handle);
    for (Collector& c : got) {
      EXPECT_TRUE(c.wait());
      EXPECT_EQ(c.reason, FinishReason::LENGTH) << c.error;
      out.push_back(c.tokens);
    }
  }
  *stats = sched.stats();
  return out;
}

// Two waves: two prompts, then four resumed from them (40 of a, 20 of b, a again, all of a and more) mixed
// with three fresh ones; greedy and seeded.
struct Waves {
  std::vector<SequenceRequest> first, then;
};
Waves waves(const SwarmModel& m) {
  const std::vector<TokenId> a = m.tokens(60, 400), b = m.tokens(45, 401);
  const auto req = [](std::vector<TokenId> prompt, float temperature) {
    return SequenceRequest{.prompt = std::move(prompt), .max_tokens = 8,
                           .sampling = {.temperature = temperature, .seed = 5}, .eog = {}};
  };
  return {{req(a, 0), req(b, 0.8f)},
          {req(sharing(m, a, 40, 30, 410), 0), req(m.tokens(50, 411), 0), req(sharing(m, b, 20, 25, 412), 0.8f),
           req(a, 0.8f), req(m.tokens(33, 413), 0.8f), req(sharing(m, a, 60, 17, 414), 0), req(m.tokens(20, 415), 0)}};
}

TEST_P(SchedulerPromptCache, ABatchMixingResumedAndFreshSequencesGivesEachItsTokensAlone) {
  const SwarmModel& m = SwarmModel::get(GetParam());
  const Waves w = waves(m);
  ThreadPool pool(2);
  LocalExpertExecutor local(m.model->expert_store(), &pool);
  SchedulerStats off_stats, on_stats;
  const auto want = serve_all(*m.model, local, pool, w.first, w.then, {.budget_bytes = 0}, &off_stats);
  const auto got =
      serve_all(*m.model, local, pool, w.first, w.then, {.budget_bytes = -1, .checkpoint_interval = 16}, &on_stats);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << "sequence " << i;
  EXPECT_EQ(got[0], backbone::testing::greedy(m, w.first[0].prompt, 8, local));
  EXPECT_EQ(off_stats.prompt_cache.hits + off_stats.prompt_cache.misses, 0u);
  EXPECT_GE(on_stats.prompt_cache.hits, 4u);
  EXPECT_GT(on_stats.prompt_cache.tokens_reused, 100u);
}

// The same waves with the experts on two essaim-worker processes, dispatched from a backbone file (no local
// copy: every expert row comes from a worker; the recurrent states advance aside and are swapped in): with
// the cache on, every sequence gets the monolithic tokens without it.
TEST_P(SchedulerPromptCache, OverWorkerProcessesResumedSequencesGiveTheMonolithicTokens) {
  const SwarmModel& m = SwarmModel::get(GetParam());
  const Waves w = waves(m);
  ThreadPool pool(2);
  LocalExpertExecutor local(m.model->expert_store(), &pool);
  SchedulerStats off_stats, on_stats;
  const auto want = serve_all(*m.model, local, pool, w.first, w.then, {.budget_bytes = 0}, &off_stats);
  backbone::testing::WorkerSwarm swarm = backbone::testing::start_worker_swarm(m, 2);
  ASSERT_TRUE(swarm.ok());
  std::unique_ptr<Model> backbone = backbone::testing::backbone_only_model(m);
  ASSERT_TRUE(backbone);
  Result<std::unique_ptr<backbone::RemoteExpertExecutor>> remote = backbone::RemoteExpertExecutor::create(
      backbone->expert_store(), m.identity, swarm.map, &pool, backbone::testing::patient_options());
  ASSERT_TRUE(remote.is_ok()) << remote.status().message();
  ASSERT_EQ((*remote)->wait_connected(net::deadline_in(std::chrono::seconds(30))), 2u);
  const auto got = serve_all(*backbone, **remote, pool, w.first, w.then,
                             {.budget_bytes = -1, .checkpoint_interval = 16}, &on_stats);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << "sequence " << i;
  EXPECT_GE(on_stats.prompt_cache.hits, 4u);
  EXPECT_GT((*remote)->stats().pairs_remote, 0u);
  EXPECT_EQ((*remote)->stats().pairs_fallback, 0u);
}

// Speculating sequences (--draft-max) resume too: their entries keep the prompt's hidden rows, which the MTP
// block drafts from, and their streams stay those of plain decoding without the cache.
class SchedulerPromptCacheSpec : public ::testing::TestWithParam<ModelSpec> {};

TEST_P(SchedulerPromptCacheSpec, SpeculatingSequencesResumeAndKeepThePlainStream) {
  const SwarmModel& m = SwarmModel::get(GetParam());
  ASSERT_TRUE(m.model->has_nextn());
  const Waves w = waves(m);
  ThreadPool pool(2);
  LocalExpertExecutor local(m.model->expert_store(), &pool);
  SchedulerStats plain_stats, on_stats;
  const auto plain = serve_all(*m.model, local, pool, w.first, w.then, {.budget_bytes = 0}, &plain_stats);
  const auto got = serve_all(*m.model, local, pool, w.first, w.then, {.budget_bytes = -1, .checkpoint_interval = 16},
                             &on_stats, {.draft_max = 3, .adaptive = true});
  ASSERT_EQ(got.size(), plain.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], plain[i]) << "sequence " << i;
  EXPECT_GE(on_stats.prompt_cache.hits, 4u);
  EXPECT_GT(on_stats.spec_drafted, 0u);
}

// The stream above cannot tell whether the hidden rows a speculating sequence resumes with are right
// (speculation keeps the stream whatever the drafts), so: they are the rows an uncached prefill computes,
// bit for bit; and an entry stored without them never serves a speculating sequence.
TEST(PromptCacheHidden, ASpeculatingSequenceResumesWithTheComputedHiddenRows) {
  const SwarmModel& m = SwarmModel::get({.file = std::string(ESSAIM_SOURCE_DIR) + "/models/kjv-moe-q4_k_m.gguf"});
  const size_t E = size_t(m.model->info().n_embd), V = size_t(m.model->info().n_vocab);
  ThreadPool pool(2);
  LocalExpertExecutor local(m.model->expert_store(), &pool);
  std::vector<float> logits(V);
  // The prompt through the cache's protocol with every row's hidden state, as the scheduler runs it.
  const auto prefill = [&](PromptCache& pc, const std::vector<TokenId>& p, std::vector<float>& hidden) {
    SequenceCache cache = m.model->new_cache({.kv_type = KvType::F16, .n_ctx = 128});
    PromptCache::Recording rec;
    hidden.assign(p.size() * E, 0.0f);
    size_t done = pc.begin(p, cache, rec, hidden);
    const size_t restored = done;
    while (done < p.size()) {
      const size_t k = std::min<size_t>(7, pc.chunk_end(rec, done, p.size()) - done);
      const bool last = done + k == p.size();
      const BatchItem item{.tokens = std::span(p).subspan(done, k), .cache = &cache,
                           .logits_mode = last ? LogitsMode::LAST : LogitsMode::NONE,
                           .logits = last ? std::span<float>(logits) : std::span<float>(),
                           .hidden = std::span(hidden).subspan(done * E, k * E)};
      EXPECT_TRUE(m.model->forward_batch({.items = std::span(&item, 1), .experts = &local, .pool = &pool}).is_ok());
      done += k;
      pc.prefilled(rec, p, cache, hidden);
    }
    return restored;
  };
  const std::vector<TokenId> a = m.tokens(40, 600), b = sharing(m, a, 40, 10, 601);
  std::vector<float> want_b, got_b, scratch;
  PromptCache off({.budget_bytes = 0});
  prefill(off, b, want_b);
  PromptCache pc({.budget_bytes = -1, .checkpoint_interval = 16});
  EXPECT_EQ(prefill(pc, a, scratch), 0u);
  EXPECT_EQ(prefill(pc, b, got_b), 39u);  // a's last checkpoint
  backbone::testing::expect_same_bits(got_b, want_b, "hidden rows of the resumed prompt");

  PromptCache plain({.budget_bytes = -1, .checkpoint_interval = 16});
  fill(m, plain, a);  // stored by a plain sequence: no hidden rows
  EXPECT_EQ(prefill(plain, b, scratch), 0u);
  EXPECT_EQ(plain.stats().misses, 2u);
}

INSTANTIATE_TEST_SUITE_P(Models, SchedulerPromptCacheSpec,
                         ::testing::Values(ModelSpec{.arch = SynthArch::QWEN35MOE, .nextn = 1},
                                           ModelSpec{.file = std::string(ESSAIM_SOURCE_DIR) +
                                                             "/models/kjv-moe-q4_k_m.gguf"}),
                         [](const auto& info) { return backbone::testing::spec_name(info.param); });

INSTANTIATE_TEST_SUITE_P(Models, SchedulerPromptCache,
                         ::testing::Values(ModelSpec{}, ModelSpec{.arch = SynthArch::QWEN35MOE}),
                         [](const auto& info) { return backbone::testing::spec_name(info.param); });

}  // namespace
}  // namespace essaim::serve
