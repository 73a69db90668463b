// Model::forward_batch (several sequences in one step) against forward() on each sequence in turn, for both
// architectures on tiny synth files (F32 and Q4_K_M) with 1 and 2 threads: a mixed step — a decode row,
// prefill chunks of different lengths, sequences at different n_past, every LogitsMode — gives bit-identical
// logits (memcmp), and so do the batched decode steps after it; each MoE layer makes exactly one executor
// call over all rows; a step that fails (bad token, shared cache, no room, executor error mid-step) changes
// no cache.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "model/model.h"
#include "synth/synth.h"
#include "temp_dir.h"

namespace essaim {
namespace {

struct Spec {
  SynthArch arch;
  SynthTypeMix types;
  size_t threads;
};
std::string spec_name(const Spec& s) {
  return std::string(s.arch == SynthArch::QWEN3MOE ? "qwen3moe_" : "qwen35moe_") +
         (s.types == SynthTypeMix::F32 ? "f32_" : "q4km_") + std::to_string(s.threads) + "t";
}
void PrintTo(const Spec& s, std::ostream* os) { *os << spec_name(s); }

// One tiny synth model per (arch, types), written and loaded once per test program.
const Model& tiny_model(SynthArch arch, SynthTypeMix types) {
  static std::unique_ptr<Model> models[2][2];
  std::unique_ptr<Model>& m = models[arch == SynthArch::QWEN3MOE ? 0 : 1][types == SynthTypeMix::F32 ? 0 : 1];
  if (!m) {
    const std::string path = std::string(ESSAIM_BINARY_DIR) + "/batch_test_" +
                             spec_name({arch, types, 0}) + ".gguf";
    Result<SynthPlan> plan = synth_plan({.arch = arch, .preset = SynthPreset::TINY, .types = types, .seed = 5});
    EXPECT_TRUE(plan.is_ok()) << plan.status().message();
    // ctest runs every test case as its own process, several at once: each writes its own file and
    // renames it into place, so no process ever maps a file another one is still writing.
    const std::string part = essaim::testing::make_temp_file_beside(path);
    Result<SynthSummary> s = synth_write(*plan, part);
    EXPECT_TRUE(s.is_ok()) << s.status().message();
    std::filesystem::rename(part, path);
    Result<std::unique_ptr<Model>> r = load_model(path);
    EXPECT_TRUE(r.is_ok()) << r.status().message();
    m = std::move(*r);
  }
  return *m;
}

// Seeded tokens in the vocabulary; different seeds give different sequences.
std::vector<int32_t> tokens(size_t n, uint32_t seed, int32_t n_vocab) {
  std::vector<int32_t> t(n);
  uint32_t x = seed * 2654435761u + 12345u;
  for (int32_t& v : t) {
    x = x * 1664525u + 1013904223u;
    v = int32_t((x >> 8) % uint32_t(n_vocab));
  }
  return t;
}

// Counts executor calls and rows per call, passing them on to the real local executor. It says it may fail
// (the model then keeps recurrent states aside until a step succeeds) unless told it cannot.
class CountingExecutor final : public ExpertExecutor {
 public:
  CountingExecutor(ExpertExecutor& inner, int32_t fail_at_layer = -1, bool may_fail = true)
      : inner_(inner), fail_at_(fail_at_layer), may_fail_(may_fail) {}
  Status compute(const ExpertBatch& b, std::span<float> out) override {
    calls.push_back({b.layer, b.n_rows});
    if (b.layer == fail_at_) return Status::error("injected executor failure");
    return inner_.compute(b, out);
  }
  bool may_fail() const override { return may_fail_; }
  struct Call {
    int32_t layer;
    int64_t rows;
  };
  std::vector<Call> calls;

 private:
  ExpertExecutor& inner_;
  int32_t fail_at_;
  bool may_fail_;
};

size_t n_out(LogitsMode m, size_t n) { return m == LogitsMode::ALL ? n : m == LogitsMode::LAST ? 1 : 0; }

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// What a failed step must not change: n_past, every KV cache's length, every recurrent state's bits.
struct CacheSnapshot {
  int32_t n_past;
  std::vector<int32_t> kv_sizes;
  std::vector<std::vector<float>> recurrent;
  bool operator==(const CacheSnapshot&) const = default;
};
CacheSnapshot snapshot(const SequenceCache& c) {
  CacheSnapshot s{c.n_past(), {}, {}};
  for (int32_t il = 0; il < c.n_layers(); ++il) {
    if (const KvCache* kv = std::get_if<KvCache>(&c.layer(il))) s.kv_sizes.push_back(kv->size());
    if (const RecurrentState* r = std::get_if<RecurrentState>(&c.layer(il))) {
      s.recurrent.push_back(r->conv);
      s.recurrent.push_back(r->state);
    }
  }
  return s;
}

int32_t argmax(std::span<const float> row) {
  size_t best = 0;
  for (size_t i = 1; i < row.size(); ++i)
    if (row[i] > row[best]) best = i;
  return int32_t(best);
}

class ForwardBatch : public ::testing::TestWithParam<Spec> {
 protected:
  void SetUp() override {
    model = &tiny_model(GetParam().arch, GetParam().types);
    V = size_t(model->info().n_vocab);
    pool = std::make_unique<ThreadPool>(GetParam().threads);
    local = std::make_unique<LocalExpertExecutor>(model->expert_store(), pool.get());
  }
  // Sequences at different n_past: 5, 9, 0, 1 and 12 tokens already in the cache.
  std::vector<SequenceCache> prefilled(const std::vector<size_t>& past, int32_t n_ctx = 64) {
    std::vector<SequenceCache> caches;
    for (size_t i = 0; i < past.size(); ++i) {
      caches.push_back(model->new_cache({.n_ctx = n_ctx}));
      if (past[i] == 0) continue;
      const std::vector<int32_t> t = tokens(past[i], uint32_t(100 + i), int32_t(V));
      EXPECT_TRUE(model->forward({.tokens = t, .cache = &caches.back(), .experts = local.get(), .pool = pool.get(),
                                  .logits_mode = LogitsMode::NONE, .logits = {}}).is_ok());
    }
    return caches;
  }
  size_t moe_layers() const { return size_t(model->info().n_layer); }  // every synth layer is MoE

  const Model* model = nullptr;
  size_t V = 0;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<LocalExpertExecutor> local;
};

const std::vector<size_t> kPast = {5, 9, 0, 1, 12};
const std::vector<size_t> kChunk = {1, 4, 7, 3, 1};  // decode row, prefill chunks, decode row
const std::vector<LogitsMode> kModes = {LogitsMode::LAST, LogitsMode::ALL, LogitsMode::LAST, LogitsMode::NONE,
                                        LogitsMode::ALL};

TEST_P(ForwardBatch, MixedStepAndLaterDecodeEqualSequentialForward) {
  std::vector<SequenceCache> batched = prefilled(kPast), sequential = prefilled(kPast);
  const size_t S = kPast.size();
  std::vector<std::vector<int32_t>> chunk(S);
  std::vector<std::vector<float>> got(S), want(S);
  std::vector<BatchItem> items;
  for (size_t i = 0; i < S; ++i) {
    chunk[i] = tokens(kChunk[i], uint32_t(200 + i), int32_t(V));
    got[i].assign(n_out(kModes[i], kChunk[i]) * V, -1.0f);
    want[i].assign(got[i].size(), -2.0f);
  }
  for (size_t i = 0; i < S; ++i)
    items.push_back({.tokens = chunk[i], .cache = &batched[i], .logits_mode = kModes[i], .logits = got[i]});
  CountingExecutor counting(*local);
  ASSERT_TRUE(model->forward_batch({.items = items, .experts = &counting, .pool = pool.get()}).is_ok());
  // One executor call per MoE layer, in layer order, over every row of the step.
  ASSERT_EQ(counting.calls.size(), moe_layers());
  for (size_t il = 0; il < counting.calls.size(); ++il) {
    EXPECT_EQ(counting.calls[il].layer, int32_t(il));
    EXPECT_EQ(counting.calls[il].rows, 1 + 4 + 7 + 3 + 1);
  }
  for (size_t i = 0; i < S; ++i) {
    ASSERT_TRUE(model->forward({.tokens = chunk[i], .cache = &sequential[i], .experts = local.get(),
                                .pool = pool.get(), .logits_mode = kModes[i], .logits = want[i]}).is_ok());
    EXPECT_TRUE(same_bits(got[i], want[i])) << "item " << i;
    EXPECT_EQ(batched[i].n_past(), sequential[i].n_past());
  }
  // The logits vary between items (the comparison above compares something).
  EXPECT_FALSE(std::memcmp(got[0].data(), got[2].data(), V * sizeof(float)) == 0);

  // Greedy decode of all sequences together, one row each, from the batched logits.
  std::vector<int32_t> next(S);
  for (size_t i = 0; i < S; ++i) next[i] = tokens(1, uint32_t(300 + i), int32_t(V))[0];
  for (int step = 0; step < 4; ++step) {
    items.clear();
    for (size_t i = 0; i < S; ++i) {
      got[i].assign(V, 0.0f);
      items.push_back({.tokens = std::span(&next[i], 1), .cache = &batched[i], .logits_mode = LogitsMode::LAST,
                       .logits = got[i]});
    }
    ASSERT_TRUE(model->forward_batch({.items = items, .experts = local.get(), .pool = pool.get()}).is_ok());
    for (size_t i = 0; i < S; ++i) {
      want[i].assign(V, 0.0f);
      ASSERT_TRUE(model->forward({.tokens = std::span(&next[i], 1), .cache = &sequential[i], .experts = local.get(),
                                  .pool = pool.get(), .logits_mode = LogitsMode::LAST, .logits = want[i]}).is_ok());
      EXPECT_TRUE(same_bits(got[i], want[i])) << "step " << step << " item " << i;
      next[i] = argmax(got[i]);
    }
  }
}

TEST_P(ForwardBatch, ForwardIsAOneItemBatch) {
  std::vector<SequenceCache> a = prefilled({3}), b = prefilled({3});
  const std::vector<int32_t> t = tokens(6, 9, int32_t(V));
  std::vector<float> got(6 * V), want(6 * V);
  const BatchItem item{.tokens = t, .cache = &a[0], .logits_mode = LogitsMode::ALL, .logits = got};
  CountingExecutor counting(*local);
  ASSERT_TRUE(model->forward_batch({.items = std::span(&item, 1), .experts = &counting, .pool = pool.get()}).is_ok());
  ASSERT_TRUE(model->forward({.tokens = t, .cache = &b[0], .experts = local.get(), .pool = pool.get(),
                              .logits_mode = LogitsMode::ALL, .logits = want}).is_ok());
  EXPECT_TRUE(same_bits(got, want));
  EXPECT_EQ(counting.calls.size(), moe_layers());
}

// A failed step leaves every cache exactly as it was, and the sequences continue as if it never happened.
class ForwardBatchErrors : public ForwardBatch {
 protected:
  void expect_failure_changes_nothing(std::vector<BatchItem> items, std::vector<SequenceCache>& caches,
                                      ExpertExecutor& ex, const std::string& message_part) {
    std::vector<CacheSnapshot> before;
    for (const SequenceCache& c : caches) before.push_back(snapshot(c));
    const Status s = model->forward_batch({.items = items, .experts = &ex, .pool = pool.get()});
    ASSERT_FALSE(s.is_ok());
    EXPECT_NE(s.message().find(message_part), std::string::npos) << s.message();
    for (size_t i = 0; i < caches.size(); ++i) EXPECT_TRUE(snapshot(caches[i]) == before[i]) << "cache " << i;
  }
};

TEST_P(ForwardBatchErrors, BadTokenInItemThreeChangesNoCache) {
  std::vector<SequenceCache> caches = prefilled(kPast), reference = prefilled(kPast);
  std::vector<std::vector<int32_t>> chunk(kPast.size());
  std::vector<std::vector<float>> logits(kPast.size());
  std::vector<BatchItem> items;
  for (size_t i = 0; i < kPast.size(); ++i) {
    chunk[i] = tokens(kChunk[i], uint32_t(200 + i), int32_t(V));
    logits[i].resize(n_out(kModes[i], kChunk[i]) * V);
  }
  chunk[3][1] = int32_t(V);  // one past the vocabulary
  for (size_t i = 0; i < kPast.size(); ++i)
    items.push_back({.tokens = chunk[i], .cache = &caches[i], .logits_mode = kModes[i], .logits = logits[i]});
  expect_failure_changes_nothing(items, caches, *local, "batch item 3: token id");

  // Decoding on continues exactly as on caches that never saw the failed step.
  for (size_t i = 0; i < kPast.size(); ++i) {
    const std::vector<int32_t> t = tokens(2, uint32_t(400 + i), int32_t(V));
    std::vector<float> got(2 * V), want(2 * V);
    ASSERT_TRUE(model->forward({.tokens = t, .cache = &caches[i], .experts = local.get(), .pool = pool.get(),
                                .logits_mode = LogitsMode::ALL, .logits = got}).is_ok());
    ASSERT_TRUE(model->forward({.tokens = t, .cache = &reference[i], .experts = local.get(), .pool = pool.get(),
                                .logits_mode = LogitsMode::ALL, .logits = want}).is_ok());
    EXPECT_TRUE(same_bits(got, want)) << "item " << i;
  }
}

TEST_P(ForwardBatchErrors, SharedCacheIsRefused) {
  std::vector<SequenceCache> caches = prefilled({4, 2});
  const std::vector<int32_t> t = tokens(1, 1, int32_t(V));
  std::vector<float> l0(V), l1(V), l2(V);
  expect_failure_changes_nothing({{.tokens = t, .cache = &caches[0], .logits = l0},
                                  {.tokens = t, .cache = &caches[1], .logits = l1},
                                  {.tokens = t, .cache = &caches[0], .logits = l2}},
                                 caches, *local, "batch items 0 and 2 use the same cache");
}

TEST_P(ForwardBatchErrors, NoRoomOrNoTokensIsRefusedUpFront) {
  std::vector<SequenceCache> caches = prefilled({4, 6}, 8);
  const std::vector<int32_t> one = tokens(1, 1, int32_t(V)), three = tokens(3, 2, int32_t(V));
  std::vector<float> l0(V), l1(V);
  expect_failure_changes_nothing({{.tokens = one, .cache = &caches[0], .logits = l0},
                                  {.tokens = three, .cache = &caches[1], .logits = l1}},
                                 caches, *local, "batch item 1: ");
  expect_failure_changes_nothing({{.tokens = one, .cache = &caches[0], .logits = l0},
                                  {.tokens = {}, .cache = &caches[1], .logits_mode = LogitsMode::NONE, .logits = {}}},
                                 caches, *local, "batch item 1: no tokens");
  CountingExecutor counting(*local);
  const Status s = model->forward_batch({.items = {}, .experts = &counting, .pool = pool.get()});
  EXPECT_FALSE(s.is_ok());
  EXPECT_TRUE(counting.calls.empty());
}

TEST_P(ForwardBatchErrors, ExecutorFailureMidStepChangesNoCache) {
  ASSERT_GE(moe_layers(), 2u);
  std::vector<SequenceCache> caches = prefilled(kPast);
  std::vector<std::vector<int32_t>> chunk(kPast.size());
  std::vector<std::vector<float>> logits(kPast.size());
  std::vector<BatchItem> items;
  for (size_t i = 0; i < kPast.size(); ++i) {
    chunk[i] = tokens(kChunk[i], uint32_t(200 + i), int32_t(V));
    logits[i].resize(n_out(kModes[i], kChunk[i]) * V);
  }
  for (size_t i = 0; i < kPast.size(); ++i)
    items.push_back({.tokens = chunk[i], .cache = &caches[i], .logits_mode = kModes[i], .logits = logits[i]});
  CountingExecutor failing(*local, int32_t(moe_layers()) - 1);  // the last layer: every other one has run
  expect_failure_changes_nothing(items, caches, failing, "injected executor failure");
  EXPECT_EQ(failing.calls.size(), moe_layers());
}

// The local executor cannot fail, so recurrent states advance in place under it and aside under an executor
// that may fail: both give the same bits, step after step, prefill chunks and decode rows alike.
TEST_P(ForwardBatch, StatesAdvancedInPlaceOrAsideGiveTheSameBits) {
  ASSERT_FALSE(local->may_fail());
  std::vector<SequenceCache> in_place = prefilled({0, 3}), aside = prefilled({0, 3});
  CountingExecutor may_fail(*local);
  for (size_t step = 0; step < 4; ++step) {
    const size_t n = step == 0 ? 5 : 1;
    for (size_t i = 0; i < 2; ++i) {
      const std::vector<int32_t> t = tokens(n, uint32_t(500 + 10 * step + i), int32_t(V));
      std::vector<float> got(n * V), want(n * V, 1.0f);
      ASSERT_TRUE(model->forward({.tokens = t, .cache = &in_place[i], .experts = local.get(), .pool = pool.get(),
                                  .logits_mode = LogitsMode::ALL, .logits = got}).is_ok());
      ASSERT_TRUE(model->forward({.tokens = t, .cache = &aside[i], .experts = &may_fail, .pool = pool.get(),
                                  .logits_mode = LogitsMode::ALL, .logits = want}).is_ok());
      EXPECT_TRUE(same_bits(got, want)) << "step " << step << " item " << i;
      EXPECT_TRUE(snapshot(in_place[i]) == snapshot(aside[i])) << "step " << step << " item " << i;
    }
  }
}

// An executor that said it cannot fail and fails anyway: where states had advanced in place (recurrent
// layers) the sequences are reset and the error says so; a model without them rolls back as ever.
TEST_P(ForwardBatchErrors, ExecutorThatCannotFailButDoesResetsSequencesItCouldNotRollBack) {
  std::vector<SequenceCache> caches = prefilled({5, 2});
  std::vector<CacheSnapshot> before;
  for (const SequenceCache& c : caches) before.push_back(snapshot(c));
  const std::vector<int32_t> t = tokens(1, 7, int32_t(V));
  std::vector<float> l0(V), l1(V);
  CountingExecutor failing(*local, int32_t(moe_layers()) - 1, /*may_fail=*/false);
  const std::vector<BatchItem> items = {{.tokens = t, .cache = &caches[0], .logits = l0},
                                        {.tokens = t, .cache = &caches[1], .logits = l1}};
  const Status s = model->forward_batch({.items = items, .experts = &failing, .pool = pool.get()});
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("injected executor failure"), std::string::npos) << s.message();
  const bool recurrent = GetParam().arch == SynthArch::QWEN35MOE;
  for (size_t i = 0; i < caches.size(); ++i) {
    if (recurrent) {
      EXPECT_EQ(caches[i].n_past(), 0) << "cache " << i;
      EXPECT_TRUE(snapshot(caches[i]) == snapshot(model->new_cache({.n_ctx = 64}))) << "cache " << i;
    } else {
      EXPECT_TRUE(snapshot(caches[i]) == before[i]) << "cache " << i;
    }
  }
  if (recurrent) {
    EXPECT_NE(s.message().find("were reset"), std::string::npos) << s.message();
  }
}

const std::vector<Spec> kSpecs = [] {
  std::vector<Spec> v;
  for (SynthArch a : {SynthArch::QWEN3MOE, SynthArch::QWEN35MOE})
    for (SynthTypeMix t : {SynthTypeMix::F32, SynthTypeMix::Q4_K_M})
      for (size_t th : {size_t(1), size_t(2)}) v.push_back({a, t, th});
  return v;
}();

INSTANTIATE_TEST_SUITE_P(Models, ForwardBatch, ::testing::ValuesIn(kSpecs),
                         [](const auto& info) { return spec_name(info.param); });
INSTANTIATE_TEST_SUITE_P(Models, ForwardBatchErrors, ::testing::ValuesIn(kSpecs),
                         [](const auto& info) { return spec_name(info.param); });

}  // namespace
}  // namespace essaim
