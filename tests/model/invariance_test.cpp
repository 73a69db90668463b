// docs/invariants.md invariant 2 on whole models: logits are bit-identical (memcmp) whether the prompt goes
// through in one batch, in chunks of 1, 3 or 7 tokens, or one token at a time with the KV cache; whether
// 1 or 2 threads run it; whether the last row comes from an ALL or a LAST pass; and a cached decode step
// equals recomputing the whole prefix from scratch. Run on the llama.cpp fixtures (F32 and Q4_K/Q8_0
// weights) with both KV cache types.
#include <gtest/gtest.h>

#include <cstring>

#include "core/thread_pool.h"
#include "model_test_util.h"

namespace essaim {
namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Param {
  const char* model;
  KvType kv;
};

class Invariance : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    model = test::load_or_die(test::fixture(std::string(GetParam().model) + ".gguf"));
    ASSERT_TRUE(model);
    tokens = test::fixture_tokens();
    reference = test::eval_logits(*model, tokens, {.batch = 0, .threads = 1, .kv_type = GetParam().kv});
    ASSERT_EQ(reference.size(), tokens.size() * size_t(model->info().n_vocab));
  }
  std::unique_ptr<Model> model;
  std::vector<int32_t> tokens;
  std::vector<float> reference;  // one batch, one thread
};

TEST_P(Invariance, ChunkedPrefillIsBitIdentical) {
  for (size_t batch : {size_t(1), size_t(3), size_t(7), tokens.size()}) {
    const std::vector<float> got = test::eval_logits(*model, tokens, {.batch = batch, .threads = 1, .kv_type = GetParam().kv});
    EXPECT_TRUE(same_bits(got, reference)) << "batch " << batch;
  }
}

TEST_P(Invariance, ThreadCountDoesNotChangeABit) {
  for (size_t batch : {size_t(1), tokens.size()}) {
    const std::vector<float> got = test::eval_logits(*model, tokens, {.batch = batch, .threads = 2, .kv_type = GetParam().kv});
    EXPECT_TRUE(same_bits(got, reference)) << "2 threads, batch " << batch;
  }
}

TEST_P(Invariance, CachedDecodeEqualsFullRecomputation) {
  // Row n-1 of the reference is a cached step (positions < n-1 came from the cache in the batch=1 runs);
  // here the prefix 0..n-1 is recomputed from an empty cache in one pass, asking only for the last row.
  const size_t V = size_t(model->info().n_vocab);
  ThreadPool pool(2);
  LocalExpertExecutor experts(model->expert_store(), &pool);
  for (size_t n = 1; n <= tokens.size(); n += 5) {
    SequenceCache cache = model->new_cache({.kv_type = GetParam().kv, .n_ctx = int32_t(n)});
    std::vector<float> last(V);
    ASSERT_TRUE(model->forward({.tokens = std::span<const int32_t>(tokens).first(n), .cache = &cache,
                                .experts = &experts, .pool = &pool, .logits_mode = LogitsMode::LAST, .logits = last})
                    .is_ok());
    EXPECT_EQ(std::memcmp(last.data(), reference.data() + (n - 1) * V, V * sizeof(float)), 0) << "prefix " << n;
    EXPECT_EQ(cache.n_past(), int32_t(n));
  }
}

TEST_P(Invariance, ResetStartsAFreshSequence) {
  const size_t V = size_t(model->info().n_vocab);
  ThreadPool pool(1);
  LocalExpertExecutor experts(model->expert_store(), &pool);
  SequenceCache cache = model->new_cache({.kv_type = GetParam().kv, .n_ctx = 64});
  std::vector<float> logits(tokens.size() * V);
  const ForwardArgs args{.tokens = tokens, .cache = &cache, .experts = &experts, .pool = &pool,
                         .logits_mode = LogitsMode::ALL, .logits = logits};
  ASSERT_TRUE(model->forward(args).is_ok());
  ASSERT_TRUE(model->forward({.tokens = std::span<const int32_t>(tokens).first(3), .cache = &cache, .experts = &experts,
                              .pool = &pool, .logits_mode = LogitsMode::NONE}).is_ok());
  EXPECT_EQ(cache.n_past(), int32_t(tokens.size() + 3));
  cache.reset();
  EXPECT_EQ(cache.n_past(), 0);
  ASSERT_TRUE(model->forward(args).is_ok());
  EXPECT_TRUE(same_bits(logits, reference));
}

TEST_P(Invariance, BadInputIsAnErrorAndLeavesTheCacheAlone) {
  ThreadPool pool(1);
  LocalExpertExecutor experts(model->expert_store(), &pool);
  SequenceCache cache = model->new_cache({.kv_type = GetParam().kv, .n_ctx = 8});
  std::vector<float> logits(size_t(model->info().n_vocab));
  const std::vector<int32_t> bad = {1, 2, model->info().n_vocab};
  Status s = model->forward({.tokens = bad, .cache = &cache, .experts = &experts, .pool = &pool,
                             .logits_mode = LogitsMode::LAST, .logits = logits});
  EXPECT_NE(s.message().find("token id 279 is outside the vocabulary"), std::string::npos) << s.message();
  EXPECT_EQ(cache.n_past(), 0);
  const std::vector<int32_t> nine(9, 5);
  s = model->forward({.tokens = nine, .cache = &cache, .experts = &experts, .pool = &pool,
                      .logits_mode = LogitsMode::LAST, .logits = logits});
  EXPECT_NE(s.message().find("context full"), std::string::npos) << s.message();
  EXPECT_EQ(cache.n_past(), 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Invariance,
                         ::testing::Values(Param{"qwen3moe-small-f32", KvType::F16},
                                           Param{"qwen3moe-small-q4k", KvType::F16},
                                           Param{"qwen3moe-small-q4k", KvType::F32}),
                         [](const auto& info) {
                           return std::string(info.param.model[15] == 'f' ? "F32" : "Q4K") +
                                  (info.param.kv == KvType::F16 ? "_kv_f16" : "_kv_f32");
                         });

}  // namespace
}  // namespace essaim
