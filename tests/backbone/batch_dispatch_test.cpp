// Batched steps (Model::forward_batch) through the dispatcher to `essaim-worker` processes over TCP: several
// sequences — a batched prefill of prompts of different lengths, a mixed step of decode rows and prefill
// chunks, then decode steps of all sequences at once — give the logits of the monolithic run of each
// sequence alone, bit for bit; and each MoE layer of a step sends each worker ONE request for the whole
// batch (exactly one where the worker holds an expert the step's rows chose, none otherwise), which is what
// makes many sequences share each round trip.
#include <gtest/gtest.h>

#include <cstring>

#include "backbone_test_util.h"

namespace essaim::backbone::testing {
namespace {

// Records the expert ids of every layer call, passing it on.
class RecordingExecutor final : public ExpertExecutor {
 public:
  explicit RecordingExecutor(ExpertExecutor& inner) : inner_(inner) {}
  Status compute(const ExpertBatch& b, std::span<float> out) override {
    calls.push_back({b.layer, std::vector<int32_t>(b.ids.begin(), b.ids.end())});
    return inner_.compute(b, out);
  }
  struct Call {
    int32_t layer;
    std::vector<int32_t> ids;
  };
  std::vector<Call> calls;

 private:
  ExpertExecutor& inner_;
};

int32_t argmax(std::span<const float> row) {
  size_t best = 0;
  for (size_t i = 1; i < row.size(); ++i)
    if (row[i] > row[best]) best = i;
  return int32_t(best);
}

struct Step {
  std::vector<std::vector<int32_t>> tokens;  // [n_seq][T_i]
  std::vector<LogitsMode> modes;             // [n_seq]
};

// Runs one step on `caches` through `ex`: as one forward_batch, or forward() on each sequence in turn.
// Returns the logits of every sequence.
std::vector<std::vector<float>> run_step(const Model& m, const Step& s, std::vector<SequenceCache>& caches,
                                         ExpertExecutor& ex, ThreadPool* pool, bool batch) {
  const size_t V = size_t(m.info().n_vocab);
  std::vector<std::vector<float>> logits(s.tokens.size());
  std::vector<BatchItem> items;
  for (size_t i = 0; i < s.tokens.size(); ++i) {
    const size_t n = s.modes[i] == LogitsMode::ALL ? s.tokens[i].size() : s.modes[i] == LogitsMode::LAST ? 1 : 0;
    logits[i].assign(n * V, 0.0f);
    items.push_back({.tokens = s.tokens[i], .cache = &caches[i], .logits_mode = s.modes[i], .logits = logits[i]});
  }
  if (batch) {
    const Status st = m.forward_batch({.items = items, .experts = &ex, .pool = pool});
    EXPECT_TRUE(st.is_ok()) << st.message();
  } else {
    for (const BatchItem& it : items) {
      const Status st = m.forward({.tokens = it.tokens, .cache = it.cache, .experts = &ex, .pool = pool,
                                   .logits_mode = it.logits_mode, .logits = it.logits});
      EXPECT_TRUE(st.is_ok()) << st.message();
    }
  }
  return logits;
}

class BatchDispatch : public ::testing::TestWithParam<ModelSpec> {};

TEST_P(BatchDispatch, BatchedStepsThroughWorkerProcessesEqualMonolithicAndSendOneRequestPerWorkerPerLayer) {
  const SwarmModel& m = SwarmModel::get(GetParam());
  constexpr uint32_t kWorkers = 2;
  WorkerSwarm swarm = start_worker_swarm(m, kWorkers);
  ASSERT_TRUE(swarm.ok());
  const ExpertMap& map = swarm.map;
  ThreadPool pool(2);
  Result<std::unique_ptr<RemoteExpertExecutor>> remote =
      RemoteExpertExecutor::create(m.model->expert_store(), m.identity, map, &pool, patient_options());
  ASSERT_TRUE(remote.is_ok()) << remote.status().message();
  ASSERT_EQ((*remote)->wait_connected(net::deadline_in(30s)), kWorkers) << (*remote)->stats().to_json();
  LocalExpertExecutor local(m.model->expert_store(), &pool);

  constexpr size_t kSeq = 4;
  const std::vector<Step> fixed = {
      {{m.tokens(5, 1), m.tokens(9, 2), m.tokens(1, 3), m.tokens(3, 4)},  // batched prefill
       {LogitsMode::LAST, LogitsMode::LAST, LogitsMode::ALL, LogitsMode::NONE}},
      {{m.tokens(1, 5), m.tokens(4, 6), m.tokens(1, 7), m.tokens(6, 8)},  // decode rows and prefill chunks
       {LogitsMode::LAST, LogitsMode::ALL, LogitsMode::LAST, LogitsMode::LAST}}};
  std::vector<SequenceCache> mono_caches, swarm_caches;
  for (size_t i = 0; i < kSeq; ++i) {
    mono_caches.push_back(m.model->new_cache({.n_ctx = 64}));
    swarm_caches.push_back(m.model->new_cache({.n_ctx = 64}));
  }
  RecordingExecutor recording(**remote);
  const DispatchStats before = (*remote)->stats();
  const size_t V = size_t(m.model->info().n_vocab);
  constexpr size_t n_steps = 5;  // the two above, then three greedy decode steps of all sequences at once
  std::vector<std::vector<float>> last;
  for (size_t si = 0; si < n_steps; ++si) {
    Step s;
    if (si < fixed.size()) {
      s = fixed[si];
    } else {
      for (size_t i = 0; i < kSeq; ++i) {
        s.tokens.push_back({argmax(std::span<const float>(last[i]).last(V))});
        s.modes.push_back(LogitsMode::LAST);
      }
    }
    const std::vector<std::vector<float>> want = run_step(*m.model, s, mono_caches, local, &pool, false);
    last = run_step(*m.model, s, swarm_caches, recording, &pool, true);
    for (size_t i = 0; i < kSeq; ++i) {
      EXPECT_EQ(last[i].size(), want[i].size());
      if (!want[i].empty())  // LogitsMode::NONE gives none (and memcmp may not see a null pointer)
        expect_same_bits(last[i], want[i], "step " + std::to_string(si) + " sequence " + std::to_string(i));
    }
  }

  // One executor call per MoE layer per step, and per call one request to each worker that holds an expert
  // the call's rows chose.
  const DispatchStats after = (*remote)->stats();
  ASSERT_EQ(recording.calls.size(), n_steps * m.moe_layers.size());
  EXPECT_EQ(after.layer_calls - before.layer_calls, recording.calls.size());
  std::vector<uint64_t> want_requests(kWorkers, 0);
  std::vector<uint64_t> want_layer_requests(after.layers.size(), 0);
  for (const RecordingExecutor::Call& c : recording.calls)
    for (uint32_t p = 0; p < kWorkers; ++p) {
      const int32_t first = int32_t(m.n_expert * p / kWorkers), end = int32_t(m.n_expert * (p + 1) / kWorkers);
      bool any = false;
      for (int32_t id : c.ids) any = any || (id >= first && id < end);
      want_requests[p] += any ? 1 : 0;
      want_layer_requests[size_t(c.layer)] += any ? 1 : 0;
    }
  for (uint32_t p = 0; p < kWorkers; ++p) {
    EXPECT_EQ(after.workers[p].requests - before.workers[p].requests, want_requests[p]) << after.to_json();
    EXPECT_GT(want_requests[p], n_steps) << "every worker serves most layer calls";
  }
  for (size_t il = 0; il < after.layers.size(); ++il)
    EXPECT_EQ(after.layers[il].requests - (il < before.layers.size() ? before.layers[il].requests : 0),
              want_layer_requests[il])
        << "layer " << il;
  EXPECT_EQ(after.pairs_remote - before.pairs_remote, after.pairs - before.pairs) << after.to_json();
  EXPECT_EQ(after.fallbacks(), 0u) << after.to_json();
}

INSTANTIATE_TEST_SUITE_P(Models, BatchDispatch,
                         ::testing::Values(ModelSpec{SynthArch::QWEN3MOE, SynthTypeMix::Q4_K_M},
                                           ModelSpec{SynthArch::QWEN35MOE, SynthTypeMix::Q4_K_M}),
                         [](const auto& info) { return spec_name(info.param); });

}  // namespace
}  // namespace essaim::backbone::testing
