// Identity by content (docs/protocol.md, WEIGHTS): a worker serving slices of a same-shaped model with
// other weights (synth with another seed: same layout, same model identity) is refused at the handshake,
// never paired, and the backbone's logits stay the monolithic ones because it computes every expert
// locally. The backbone's expert digests are cached beside its file and hashed lazily.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "backbone/weights_check.h"
#include "backbone_test_util.h"
#include "slice/expert_digest.h"

namespace essaim::backbone::testing {
namespace {

// The backbone's model with another seed: same shapes, types, metadata and hence model identity.
struct OtherWeights {
  std::string path;
  std::unique_ptr<GgufFile> file;
  MoeLayout moe;
  std::string slice(uint32_t layer, uint32_t first, uint32_t count) const {
    const std::string out = path + ".L" + std::to_string(layer) + ".E" + std::to_string(first) + "+" +
                            std::to_string(count) + ".gguf";
    Result<OutFile> f = expert_slice_file(*file, moe, {.layer_first = layer, .expert_first = first, .expert_count = count});
    EXPECT_TRUE(f.is_ok()) << f.status().message();
    EXPECT_TRUE(write_out_file(*f, out, /*hash=*/false).is_ok());
    return out;
  }
};

OtherWeights other_weights(const SwarmModel& m) {
  OtherWeights o;
  o.path = m.dir + "/other-seed.gguf";
  Result<SynthPlan> plan = synth_plan({.arch = m.spec.arch, .preset = SynthPreset::TINY, .types = m.spec.types,
                                       .seed = 2, .threads = 2});
  EXPECT_TRUE(plan.is_ok());
  EXPECT_TRUE(synth_write(*plan, o.path).is_ok());
  Result<GgufFile> f = GgufFile::open(o.path);
  EXPECT_TRUE(f.is_ok());
  o.file = std::make_unique<GgufFile>(std::move(*f));
  Result<MoeLayout> moe = moe_layout(*o.file);
  EXPECT_TRUE(moe.is_ok());
  o.moe = std::move(*moe);
  return o;
}

TEST(WeightsCheck, SlicesOfAnotherSeedAreRefusedNeverPairedAndLogitsStayMonolithic) {
  const SwarmModel& m = SwarmModel::get({.types = SynthTypeMix::Q4_K_M});
  OtherWeights other = other_weights(m);
  ASSERT_EQ(other.moe.source_model, m.identity) << "the premise: the layout hash cannot tell them apart";
  const uint32_t layer = m.moe_layers.front();
  const std::vector<int32_t> tokens = m.tokens(8, 3);
  const std::vector<float> mono = mono_logits(m, tokens);

  PipeWorker wrong({other.slice(layer, 0, 3)});
  PipeWorker right({m.slice(layer, 0, 3)});
  DispatchOptions options = patient_options();
  Result<PeerCheck> check = weights_check(m.model->file(), m.dir + "/digests.json");
  ASSERT_TRUE(check.is_ok()) << check.status().message();
  options.link.policy.check_peer = *check;
  ThreadPool pool(2);
  std::unique_ptr<RemoteExpertExecutor> ex = RemoteExpertExecutor::create(
      m.model->expert_store(), m.identity, {wrong.endpoint("wrong"), right.endpoint("right")}, &pool, options);
  EXPECT_EQ(ex->wait_connected(net::deadline_in(10s)), 1u);

  expect_same_bits(eval_logits(m, tokens, *ex), mono, "with a wrong-weights worker refused");
  const DispatchStats s = ex->stats();
  ASSERT_EQ(s.workers.size(), 2u);
  EXPECT_FALSE(s.workers[0].connected);
  EXPECT_EQ(s.workers[0].pairs_served, 0u) << s.to_json();
  EXPECT_NE(s.workers[0].last_error.find("refused (WEIGHTS)"), std::string::npos) << s.workers[0].last_error;
  EXPECT_NE(s.workers[0].last_error.find("the slice holding experts 0-2 of layer " + std::to_string(layer) +
                                         " has other weights than this backbone's model"),
            std::string::npos)
      << s.workers[0].last_error;
  EXPECT_TRUE(s.workers[1].connected);
  EXPECT_GT(s.workers[1].pairs_served, 0u) << s.to_json();
  // The worker counts the refusal too (either side refused: by reason), once its connection thread has read
  // the backbone's REFUSE, which may come after the backbone has moved on: waited for, within a bound.
  const auto refused_at_worker = [&] { return wrong.stats().handshakes_refused[size_t(proto::RefuseReason::WEIGHTS)]; };
  for (int i = 0; i < 200 && refused_at_worker() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  EXPECT_GE(refused_at_worker(), 1u);
  EXPECT_EQ(wrong.stats().handshakes_ok, 0u);
}

TEST(WeightsCheck, TheDispatcherOfALoadedModelChecksByDefault) {
  // What `essaim run/eval --worker` builds: remote_executor_for_model, against an essaim-worker process.
  const SwarmModel& m = SwarmModel::get({.types = SynthTypeMix::Q4_K_M});
  OtherWeights other = other_weights(m);
  const uint32_t layer = m.moe_layers.front();
  WorkerProcess wrong({other.slice(layer, 0, m.n_expert)});
  ASSERT_TRUE(wrong.ok());
  ExpertMap map;
  map.workers.push_back({.address = wrong.address(), .label = {}, .holdings = std::nullopt});
  ThreadPool pool(2);
  Result<std::unique_ptr<RemoteExpertExecutor>> ex = remote_executor_for_model(*m.model, map, &pool, patient_options());
  ASSERT_TRUE(ex.is_ok()) << ex.status().message();
  EXPECT_EQ((*ex)->connected(), 0u);
  const std::vector<int32_t> tokens = m.tokens(6, 5);
  expect_same_bits(eval_logits(m, tokens, **ex), mono_logits(m, tokens), "wrong weights over TCP");
  const DispatchStats s = (*ex)->stats();
  EXPECT_EQ(s.pairs_remote, 0u) << s.to_json();
  EXPECT_NE(s.workers[0].last_error.find("refused (WEIGHTS)"), std::string::npos) << s.workers[0].last_error;
  EXPECT_TRUE(std::filesystem::exists(m.path + ".essaim-digests.json"));  // the cache, beside the model
}

TEST(WeightsCheck, DigestsAreCachedBesideTheFileAndHashedOnlyForClaimedExperts) {
  const SwarmModel& m = SwarmModel::get({.types = SynthTypeMix::Q4_K_M});
  const std::string cache = m.dir + "/digest-cache-test.json";
  std::filesystem::remove(cache);
  Result<MoeLayout> moe = moe_layout(m.model->file());
  ASSERT_TRUE(moe.is_ok());
  const uint32_t layer = m.moe_layers.back();
  Sha256Digest first{};
  {
    auto c = ExpertDigestCache::open(m.model->file(), *moe, cache);
    ASSERT_TRUE(c.is_ok());
    Result<Sha256Digest> d = (*c)->holding(layer, 1, 2);
    ASSERT_TRUE(d.is_ok()) << d.status().message();
    first = *d;
    EXPECT_EQ((*c)->experts_hashed(), 2u);  // lazily: only the two claimed
    ASSERT_TRUE((*c)->holding(layer, 1, 1).is_ok());
    EXPECT_EQ((*c)->experts_hashed(), 2u);  // already known
    EXPECT_FALSE((*c)->holding(layer, m.n_expert - 1, 2).is_ok());  // beyond the experts
  }
  ASSERT_TRUE(std::filesystem::exists(cache));
  {
    auto c = ExpertDigestCache::open(m.model->file(), *moe, cache);
    ASSERT_TRUE(c.is_ok());
    Result<Sha256Digest> d = (*c)->holding(layer, 1, 2);
    ASSERT_TRUE(d.is_ok());
    EXPECT_EQ(*d, first);
    EXPECT_EQ((*c)->experts_hashed(), 0u);  // from the file
  }
  // The same digest as a slice records for those experts: what a worker announces.
  Result<ExpertSlice> s = ExpertSlice::open(m.slice(layer, 1, 2));
  ASSERT_TRUE(s.is_ok());
  EXPECT_EQ(holding_digest(s->recorded_digests(layer)), first);
  // A cache written for another file (other size/mtime) is ignored, not believed.
  std::string text;
  {
    std::ifstream in(cache);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t at = text.find("\"mtime_ns\":");
  ASSERT_NE(at, std::string::npos);
  text.insert(at + 11, "1");
  std::ofstream(cache) << text;
  auto c = ExpertDigestCache::open(m.model->file(), *moe, cache);
  ASSERT_TRUE(c.is_ok());
  ASSERT_TRUE((*c)->holding(layer, 1, 2).is_ok());
  EXPECT_EQ((*c)->experts_hashed(), 2u);
}

}  // namespace
}  // namespace essaim::backbone::testing
