// Speculative decoding over the swarm (docs/speculative.md): 3 `essaim-worker` processes each hold a third of
// every MoE layer's experts, the MTP block's layer included (the slicer cuts it like any layer); the backbone
// runs from the backbone file (no expert bytes: every pair is remote). Greedy and seeded-sampling streams
// with K = 1..4 equal plain decoding on one node token for token, on the trained model of models/ and on a
// synth qwen35moe with an MTP block; and the drafts cut the main stack's layer calls per token.
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>

#include "backbone_test_util.h"
#include "model/speculative.h"
#include "text/sampler.h"

namespace essaim::backbone::testing {
namespace {

constexpr uint32_t kWorkers = 3;

SamplerParams sampling(bool greedy) {
  SamplerParams p;
  p.temperature = greedy ? 0.0f : 0.8f;
  p.seed = 5;
  return p;
}

std::vector<int32_t> plain(const Model& m, ExpertExecutor& ex, ThreadPool& pool, std::span<const int32_t> prompt,
                           int n, bool greedy) {
  SequenceCache cache = m.new_cache({});
  Sampler sampler(sampling(greedy));
  std::vector<float> logits(size_t(m.info().n_vocab));
  EXPECT_TRUE(m.forward({.tokens = prompt, .cache = &cache, .experts = &ex, .pool = &pool,
                         .logits_mode = LogitsMode::LAST, .logits = logits}).is_ok());
  std::vector<int32_t> out;
  while (int(out.size()) < n) {
    out.push_back(sampler.sample(logits));
    sampler.accept(out.back());
    EXPECT_TRUE(m.forward({.tokens = std::span(&out.back(), 1), .cache = &cache, .experts = &ex, .pool = &pool,
                           .logits_mode = LogitsMode::LAST, .logits = logits}).is_ok());
  }
  return out;
}

std::vector<int32_t> speculative(const Model& m, ExpertExecutor& ex, ThreadPool& pool, std::span<const int32_t> prompt,
                                 int n, bool greedy, int32_t k, SpecStats* stats, ExpertExecutor* draft_ex = nullptr) {
  SpecSequence seq(m, {}, {.draft_max = k});
  Sampler sampler(sampling(greedy));
  std::vector<float> logits(size_t(m.info().n_vocab)), hidden(prompt.size() * size_t(m.info().n_embd));
  const BatchItem first{.tokens = prompt, .cache = &seq.cache(), .logits = logits, .hidden = hidden};
  EXPECT_TRUE(m.forward_batch({.items = std::span(&first, 1), .experts = &ex, .pool = &pool}).is_ok());
  const auto sample = [&](std::span<const float> l) {
    const int32_t id = sampler.sample(l);
    sampler.accept(id);
    return id;
  };
  std::vector<int32_t> out{sample(logits)};
  seq.start(prompt, hidden, out[0]);
  while (int(out.size()) < n) {
    SpecSequence* one[] = {&seq};
    const Status d = spec_draft(m, one, draft_ex ? draft_ex : &ex, &pool);
    EXPECT_TRUE(d.is_ok()) << d.message();
    const BatchItem item = seq.verify_item();
    EXPECT_TRUE(m.forward_batch({.items = std::span(&item, 1), .experts = &ex, .pool = &pool}).is_ok());
    for (int32_t t : seq.accept(sample)) out.push_back(t);
  }
  out.resize(size_t(n));
  *stats = seq.stats();
  return out;
}

class SpeculativeSwarm : public ::testing::TestWithParam<ModelSpec> {};

TEST_P(SpeculativeSwarm, StreamOverThreeWorkerProcessesEqualsPlainDecodingOnOneNode) {
  if (!GetParam().file.empty()) ASSERT_TRUE(std::filesystem::exists(GetParam().file)) << GetParam().file;
  const SwarmModel& m = SwarmModel::get(GetParam());
  ASSERT_TRUE(m.model->has_nextn());
  EXPECT_EQ(m.moe_layers.back(), uint32_t(m.model->info().n_layer));  // the MTP block's experts are sliced too
  WorkerSwarm swarm = start_worker_swarm(m, kWorkers);
  ASSERT_TRUE(swarm.ok());
  const ExpertMap& map = swarm.map;
  std::unique_ptr<Model> backbone = backbone_only_model(m);
  ASSERT_TRUE(backbone && backbone->has_nextn());
  ThreadPool pool(2);
  Result<std::unique_ptr<RemoteExpertExecutor>> remote =
      RemoteExpertExecutor::create(backbone->expert_store(), m.identity, map, &pool, patient_options());
  ASSERT_TRUE(remote.is_ok()) << remote.status().message();
  ASSERT_EQ((*remote)->wait_connected(net::deadline_in(30s)), kWorkers) << (*remote)->stats().to_json();
  LocalExpertExecutor local(m.model->expert_store(), &pool);

  const std::vector<int32_t> prompt = m.tokens(9, 3);
  constexpr int n = 24;
  for (bool greedy : {true, false}) {
    const std::vector<int32_t> want = plain(*m.model, local, pool, prompt, n, greedy);
    const uint64_t calls0 = (*remote)->stats().layer_calls;
    EXPECT_EQ(plain(*backbone, **remote, pool, prompt, n, greedy), want);
    const uint64_t plain_calls = (*remote)->stats().layer_calls - calls0;
    for (int32_t k = 1; k <= 4; ++k) {
      SpecStats stats;
      const uint64_t before = (*remote)->stats().layer_calls;
      EXPECT_EQ(speculative(*backbone, **remote, pool, prompt, n, greedy, k, &stats), want)
          << (greedy ? "greedy" : "sampled") << " K=" << k;
      const uint64_t calls = (*remote)->stats().layer_calls - before;
      // Each round: one call per main layer (all K+1 rows) + K calls of the MTP block.
      const uint64_t n_layer = uint64_t(m.model->info().n_layer);
      EXPECT_EQ(calls, (1 + uint64_t(stats.rounds)) * n_layer + uint64_t(stats.rounds) * uint64_t(k))
          << "K=" << k;
      if (greedy && !GetParam().file.empty() && k <= 2) EXPECT_LT(calls, plain_calls) << "K=" << k;
    }
  }
  // The MTP block's experts computed on a backbone holding them (`--draft-experts backbone`): the same drafts
  // (the same bits as the workers'), so the same rounds, and no layer call for them.
  Result<std::unique_ptr<RemoteExpertExecutor>> full =
      RemoteExpertExecutor::create(m.model->expert_store(), m.identity, map, &pool, patient_options());
  ASSERT_TRUE(full.is_ok()) << full.status().message();
  ASSERT_EQ((*full)->wait_connected(net::deadline_in(30s)), kWorkers);
  for (bool greedy : {true, false}) {
    SpecStats swarm_drafts, local_drafts;
    const std::vector<int32_t> a = speculative(*m.model, **full, pool, prompt, n, greedy, 3, &swarm_drafts);
    const uint64_t before = (*full)->stats().layer_calls;
    EXPECT_EQ(speculative(*m.model, **full, pool, prompt, n, greedy, 3, &local_drafts, &local), a);
    EXPECT_EQ(local_drafts.rounds, swarm_drafts.rounds);
    EXPECT_EQ(local_drafts.accepted, swarm_drafts.accepted);
    EXPECT_EQ((*full)->stats().layer_calls - before, (1 + uint64_t(local_drafts.rounds)) * uint64_t(m.model->info().n_layer));
  }
  const DispatchStats s = (*remote)->stats();
  EXPECT_EQ(s.pairs_remote, s.pairs) << s.to_json();
  EXPECT_EQ(s.fallbacks(), 0u) << s.to_json();
}

INSTANTIATE_TEST_SUITE_P(Models, SpeculativeSwarm,
                         ::testing::Values(ModelSpec{.arch = SynthArch::QWEN35MOE, .nextn = 1},
                                           ModelSpec{.file = std::string(ESSAIM_SOURCE_DIR) +
                                                             "/models/kjv-moe-q4_k_m.gguf"}),
                         [](const auto& info) {
                           std::string name = spec_name(info.param);
                           for (char& c : name)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name;
                         });

}  // namespace
}  // namespace essaim::backbone::testing
