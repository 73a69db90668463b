// Structured output in the scheduler, on the trained model: constrained sequences in one batch with free ones
// get exactly the tokens each gets alone (greedy and seeded), the same in a speculating scheduler (drafts
// verified under the grammar's mask), and each answer is JSON that satisfies its schema (tests/text's checker).
#include <gtest/gtest.h>

#include <cstdio>

#include "backbone_test_util.h"
#include "gguf/gguf_file.h"
#include "../text/json_schema_check.h"
#include "sequence_collector.h"
#include "serve/scheduler.h"
#include "text/json_schema_grammar.h"
#include "text/tokenizer.h"

namespace essaim::serve {
namespace {

using backbone::testing::SwarmModel;
using testing::Collector;
using ojson = nlohmann::ordered_json;

const std::string kTrained = std::string(ESSAIM_SOURCE_DIR) + "/models/kjv-moe-q4_k_m.gguf";

// Bounded in every part, so that each answer ends (with the end-of-generation id once the grammar is complete).
const char* const kSchema = R"({"type":"object","properties":{
    "book":{"type":"string","maxLength":12},"chapter":{"type":"integer"},
    "verses":{"type":"array","items":{"type":"string","maxLength":16},"minItems":1,"maxItems":2},
    "when":{"type":"string","format":"date"},"kind":{"enum":["law","poetry","gospel",null]}},
    "required":["book","chapter","verses"],"additionalProperties":false})";

struct Fixture {
  const SwarmModel& m = SwarmModel::get({.file = kTrained});
  Tokenizer tok = load_tokenizer();
  std::shared_ptr<const TokenTrie> trie = std::make_shared<const TokenTrie>(tok);
  std::shared_ptr<const Grammar> grammar = json_schema_grammar(ojson::parse(kSchema), {}).value();

  static Tokenizer load_tokenizer() {
    auto f = GgufFile::open(kTrained);
    EXPECT_TRUE(f.is_ok());
    auto v = vocab_from_gguf(*f);
    EXPECT_TRUE(v.is_ok());
    return std::move(Tokenizer::create(std::move(*v))).value();
  }
  SequenceRequest request(size_t i, bool constrained) const {
    SequenceRequest r{.prompt = tok.encode("<|im_start|>user\nAnd God said, let there be light " + std::to_string(i) +
                                           "<|im_end|>\n<|im_start|>assistant\n"),
                      .max_tokens = 400,
                      .sampling = i % 2 ? SamplerParams{.temperature = 0} : SamplerParams{.temperature = 0.9f, .seed = uint32_t(40 + i)},
                      .eog = tok.eog_ids()};
    if (constrained) r.grammar = grammar, r.trie = trie;
    return r;
  }
};

struct Outcome {
  std::vector<TokenId> tokens;
  FinishReason reason;
  bool operator==(const Outcome&) const = default;
};

std::vector<Outcome> run(Scheduler& sched, const std::vector<SequenceRequest>& reqs) {
  std::vector<Collector> got(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_TRUE(sched.submit(reqs[i], got[i].sink()).handle);
  std::vector<Outcome> out;
  for (Collector& c : got) {
    EXPECT_TRUE(c.wait());
    EXPECT_TRUE(c.error.empty()) << c.error;
    out.push_back({c.tokens, c.reason});
  }
  return out;
}

TEST(SchedulerGrammar, ConstrainedInABatchEqualsAloneAndValidates) {
  const Fixture f;
  ThreadPool pool(2);
  LocalExpertExecutor local(f.m.model->expert_store(), &pool);
  std::vector<SequenceRequest> reqs;
  for (size_t i = 0; i < 6; ++i) reqs.push_back(f.request(i, /*constrained=*/i != 2 && i != 5));
  std::vector<Outcome> alone;
  {
    Scheduler sched(*f.m.model, &local, &pool, {.parallel = 1, .cache = {.n_ctx = 512}});
    for (const SequenceRequest& r : reqs) alone.push_back(run(sched, {r})[0]);
  }
  Scheduler batched(*f.m.model, &local, &pool, {.parallel = 6, .batch_tokens = 24, .cache = {.n_ctx = 512}});
  EXPECT_EQ(run(batched, reqs), alone);
  // Speculating: every sequence drafts, constrained ones sample each verified row under the grammar's mask;
  // every stream is the same, and constrained sequences alone verified drafts too.
  Scheduler spec(*f.m.model, &local, &pool, {.parallel = 6, .cache = {.n_ctx = 512}, .spec = {.draft_max = 3}});
  EXPECT_EQ(run(spec, reqs), alone);
  Scheduler spec_constrained(*f.m.model, &local, &pool, {.parallel = 6, .cache = {.n_ctx = 512}, .spec = {.draft_max = 3}});
  std::vector<SequenceRequest> constrained;
  std::vector<Outcome> constrained_alone;
  for (size_t i = 0; i < reqs.size(); ++i)
    if (reqs[i].grammar) constrained.push_back(reqs[i]), constrained_alone.push_back(alone[i]);
  EXPECT_EQ(run(spec_constrained, constrained), constrained_alone);
  const SchedulerStats st = spec_constrained.stats();
  EXPECT_GT(st.spec_rounds, 0u);
  std::printf("constrained, speculating: %llu rounds, %llu of %llu drafts accepted\n", (unsigned long long)st.spec_rounds,
              (unsigned long long)st.spec_accepted, (unsigned long long)st.spec_drafted);
  std::set<std::string> answers;
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (!reqs[i].grammar) continue;
    ASSERT_EQ(alone[i].reason, FinishReason::STOP) << "sequence " << i << ": " << f.tok.decode(alone[i].tokens);
    const std::string text = f.tok.decode(alone[i].tokens);
    const ojson v = ojson::parse(text, nullptr, false);
    ASSERT_FALSE(v.is_discarded()) << text;
    EXPECT_EQ(test::schema_check(v, ojson::parse(kSchema)), "") << text;
    answers.insert(text);
  }
  EXPECT_GT(answers.size(), 2u);  // the prompts and seeds gave different answers
}

TEST(SchedulerGrammar, ARejectedForcedTokenEndsTheSequenceWithAnError) {
  const Fixture f;
  ThreadPool pool(1);
  LocalExpertExecutor local(f.m.model->expert_store(), &pool);
  Scheduler sched(*f.m.model, &local, &pool, {.parallel = 2, .cache = {.n_ctx = 512}});
  Collector c;
  SubmitResult r = sched.submit(f.request(1, true), c.sink());
  ASSERT_TRUE(r.handle);
  r.handle->force(f.tok.encode("nope"));  // not JSON: the grammar refuses it
  ASSERT_TRUE(c.wait());
  EXPECT_EQ(c.reason, FinishReason::ERROR);
  EXPECT_NE(c.error.find("structured output"), std::string::npos) << c.error;
  SequenceRequest no_trie = f.request(1, true);
  no_trie.trie = nullptr;
  EXPECT_EQ(sched.submit(no_trie, [](const SequenceEvent&) {}).error, SubmitError::BAD_REQUEST);
}

}  // namespace
}  // namespace essaim::serve
