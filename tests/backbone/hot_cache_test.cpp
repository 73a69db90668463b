// The hot-expert cache (backbone/hot_expert_cache.h, slice_server_source.h):
//   - the sliding-window counter against a brute-force recount of seeded router picks, as the window slides;
//   - the choice: budget respected, hottest first, hysteresis (a near tie does not swap, a clear win does);
//   - the real slice reader on real slice files (Range reads served from the files): with in-process
//     workers, the cached pairs are computed on the backbone and never sent, and the logits equal the
//     monolithic ones bit for bit; a download with one flipped byte is refused, counted, retried, never used;
//     a colder expert is evicted for a hotter one when the traffic moves.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "backbone/hot_expert_cache.h"
#include "backbone/slice_server_source.h"
#include "backbone_test_util.h"
#include "slice/expert_digest.h"

namespace essaim::backbone::testing {
namespace {

// ---- the window ----

TEST(HotExpertWindow, CountsEqualABruteForceRecountAsTheWindowSlides) {
  std::mt19937 rng(42);
  constexpr uint32_t W = 8, kExperts = 16, kK = 4;
  ExpertUsageWindow w(W);
  std::vector<std::vector<std::vector<int32_t>>> history(3);  // [layer][step] ids
  for (int step = 0; step < 40; ++step) {
    for (int32_t layer = 0; layer < 3; ++layer) {
      // Skewed: expert (layer + 1) picked in most rows, the rest uniform; some slots unrequested (-1).
      std::vector<int32_t> ids;
      const int rows = 1 + int(rng() % 5);
      for (int r = 0; r < rows * int(kK); ++r) {
        const uint32_t u = rng() % 10;
        ids.push_back(u == 0 ? -1 : u < 5 ? layer + 1 : int32_t(rng() % kExperts));
      }
      w.record(layer, ids);
      history[size_t(layer)].push_back(ids);
    }
    for (int32_t layer = 0; layer < 3; ++layer) {
      const auto& h = history[size_t(layer)];
      std::map<int32_t, uint64_t> want;
      for (size_t s = h.size() > W ? h.size() - W : 0; s < h.size(); ++s)
        for (int32_t id : h[s])
          if (id >= 0) ++want[id];
      for (uint32_t e = 0; e < kExperts; ++e)
        ASSERT_EQ(w.count(layer, int32_t(e)), want.count(int32_t(e)) ? want[int32_t(e)] : 0)
            << "step " << step << " layer " << layer << " expert " << e;
      EXPECT_EQ(w.steps(layer), std::min<uint32_t>(uint32_t(h.size()), W));
    }
  }
  // The top of each layer is its skewed expert, and counts() lists exactly the non-zero entries.
  for (int32_t layer = 0; layer < 3; ++layer) {
    int32_t top = -1;
    uint64_t best = 0;
    for (const auto& [k, n] : w.counts())
      if (k.layer == layer && n > best) best = n, top = k.expert;
    EXPECT_EQ(top, layer + 1);
  }
  for (const auto& [k, n] : w.counts()) EXPECT_GT(n, 0u);
}

TEST(HotExpertWindow, TheWindowForgetsOldPicks) {
  ExpertUsageWindow w(3);
  const std::vector<int32_t> a = {5, 5}, b = {7};
  w.record(0, a);
  for (int i = 0; i < 3; ++i) w.record(0, b);
  EXPECT_EQ(w.count(0, 5), 0u) << "a pick 4 steps ago is outside a 3-step window";
  EXPECT_EQ(w.count(0, 7), 3u);
  EXPECT_EQ(w.counts().size(), 1u);
}

// ---- the choice ----

TEST(HotExpertChoice, TheHottestThatFitTheBudget) {
  std::vector<HotCandidate> c;
  for (int32_t e = 0; e < 10; ++e) c.push_back({.key = {0, e}, .count = uint64_t(100 - 10 * e), .bytes = 100, .held = false});
  c.push_back({.key = {1, 0}, .count = 95, .bytes = 250, .held = false});  // hot but large
  const std::vector<ExpertKey> got = choose_hot_set(c, {.budget_bytes = 500, .keep_bonus = 1.5, .min_count = 2});
  uint64_t bytes = 0;
  for (const ExpertKey& k : got) bytes += k.layer == 1 ? 250 : 100;
  EXPECT_LE(bytes, 500u);
  // 100 (0,0), 95 (1,0: 250 B), 90 (0,1), 80 (0,2): 550 > 500, so (0,2) is skipped... and nothing else fits.
  const std::vector<ExpertKey> want = {{0, 0}, {1, 0}, {0, 1}};
  EXPECT_EQ(got, want);
  // Rarely picked experts are not worth a download, and a zero budget holds nothing.
  std::vector<HotCandidate> cold = {{.key = {0, 1}, .count = 1, .bytes = 10, .held = false}};
  EXPECT_TRUE(choose_hot_set(cold, {.budget_bytes = 100, .keep_bonus = 1.5, .min_count = 2}).empty());
  EXPECT_TRUE(choose_hot_set(c, {.budget_bytes = 0, .keep_bonus = 1.5, .min_count = 2}).empty());
}

TEST(HotExpertChoice, HysteresisKeepsAHeldExpertAgainstANearTie) {
  const HotChoiceOptions o{.budget_bytes = 100, .keep_bonus = 1.5, .min_count = 2};
  auto one = [&](uint64_t held_count, uint64_t new_count) {
    std::vector<HotCandidate> c = {{.key = {0, 1}, .count = held_count, .bytes = 100, .held = true},
                                   {.key = {0, 2}, .count = new_count, .bytes = 100, .held = false}};
    return choose_hot_set(c, o);
  };
  EXPECT_EQ(one(10, 12), (std::vector<ExpertKey>{{0, 1}})) << "12 < 1.5 × 10: the held one stays";
  EXPECT_EQ(one(10, 15), (std::vector<ExpertKey>{{0, 1}})) << "a tie at the bonus goes to the held one";
  EXPECT_EQ(one(10, 16), (std::vector<ExpertKey>{{0, 2}})) << "a clear winner takes the place";
  // Without hysteresis the same near tie would swap.
  std::vector<HotCandidate> c = {{.key = {0, 1}, .count = 10, .bytes = 100, .held = true},
                                 {.key = {0, 2}, .count = 12, .bytes = 100, .held = false}};
  EXPECT_EQ(choose_hot_set(c, {.budget_bytes = 100, .keep_bonus = 1.0, .min_count = 2}), (std::vector<ExpertKey>{{0, 2}}));
}

// ---- the cache on real slices ----

std::vector<uint8_t> read_range(const std::string& path, uint64_t offset, uint64_t length) {
  std::ifstream f(path, std::ios::binary);
  f.seekg(std::streamoff(offset));
  std::vector<uint8_t> b(length);
  f.read(reinterpret_cast<char*>(b.data()), std::streamsize(length));
  b.resize(size_t(f.gcount()));
  return b;
}

// One-expert slices of every MoE layer of the model: a catalogue of slices served from the files.
struct Catalogue {
  std::vector<SliceRef> slices;
  explicit Catalogue(const SwarmModel& m) {
    for (uint32_t l : m.moe_layers) {
      const std::string p = m.slice(l, 0, m.n_expert);
      slices.push_back({.layer = l, .expert_first = 0, .expert_count = m.n_expert, .target = p,
                        .bytes = uint64_t(std::filesystem::file_size(p))});
    }
  }
};

struct Digests {
  MoeLayout layout;
  std::unique_ptr<ExpertDigestCache> cache;
  explicit Digests(const SwarmModel& m) {
    layout = *moe_layout(m.model->file());
    Result<std::unique_ptr<ExpertDigestCache>> c = ExpertDigestCache::open(m.model->file(), layout, m.dir + "/hot-digests.json");
    EXPECT_TRUE(c.is_ok());
    cache = std::move(*c);
  }
};

// A source reading the real slice files, optionally damaging the bytes of one expert's reads.
std::unique_ptr<SliceServerSource> file_source(const SwarmModel& m, const Catalogue& cat,
                                               std::function<void(const std::string&, uint64_t, std::vector<uint8_t>&)> damage = {},
                                               uint64_t* reads = nullptr) {
  return std::make_unique<SliceServerSource>(
      m.identity, cat.slices, [damage, reads](const std::string& target, uint64_t offset, uint64_t length) -> Result<std::vector<uint8_t>> {
        std::vector<uint8_t> b = read_range(target, offset, length);
        if (reads) ++*reads;
        if (b.size() != length) return Status::error("short read");
        if (damage) damage(target, offset, b);
        return b;
      });
}

HotCacheOptions options_for(const SwarmModel& m, Digests& d, uint64_t budget) {
  HotCacheOptions o;
  o.budget_bytes = budget;
  o.window_steps = 16;
  o.retry_after = std::chrono::milliseconds(0);  // the test drives step() itself: retry at once
  o.expected_digest = [&d](int32_t layer, int32_t expert) { return d.cache->holding(uint32_t(layer), uint32_t(expert), 1); };
  o.reference = &m.model->expert_store();
  return o;
}

// The largest expert of any layer (the Q4_K_M mix gives some layers' experts more bytes than others').
uint64_t one_expert_bytes(const SwarmModel& m, const Catalogue& cat) {
  auto s = file_source(m, cat);
  uint64_t most = 0;
  for (uint32_t l : m.moe_layers) most = std::max(most, *s->expert_bytes(int32_t(l), 0));
  return most;
}

TEST(HotExpertCache, CachedPairsAreComputedHereNeverSentAndTheLogitsAreMonolithic) {
  const SwarmModel& m = SwarmModel::get({SynthArch::QWEN3MOE, SynthTypeMix::Q4_K_M});
  const Catalogue cat(m);
  Digests d(m);
  const uint64_t per_expert = one_expert_bytes(m, cat);
  // Room for 3 experts of the model's 2 × 6.
  HotExpertCache cache(file_source(m, cat), options_for(m, d, 3 * per_expert));
  PipeWorker w(m.split_experts(1)[0]);
  ThreadPool pool(2);
  DispatchOptions opts = patient_options();
  opts.hot_cache = &cache;
  auto ex = RemoteExpertExecutor::create(m.model->expert_store(), m.identity, {w.endpoint("w")}, &pool, opts);
  ASSERT_EQ(ex->wait_connected(net::deadline_in(10s)), 1u);

  const std::vector<int32_t> tokens = m.tokens(24);
  const std::vector<float> want = mono_logits(m, tokens);
  expect_same_bits(eval_logits(m, tokens, *ex, /*batch=*/1), want, "cold cache");
  EXPECT_EQ(ex->stats().pairs_cached, 0u) << "nothing fetched yet";
  EXPECT_EQ(cache.step(), 3u) << "three hot experts fit the budget";
  const HotCacheReport r = cache.report();
  EXPECT_EQ(r.fetches, 3u);
  EXPECT_EQ(r.refusals, 0u);
  EXPECT_GT(r.bytes_held, 2 * per_expert);
  EXPECT_LE(r.bytes_held, r.budget_bytes);

  const DispatchStats before = ex->stats();
  expect_same_bits(eval_logits(m, tokens, *ex, /*batch=*/1), want, "warm cache, one token at a time");
  expect_same_bits(eval_logits(m, tokens, *ex, /*batch=*/5), want, "warm cache, chunks of 5");
  const DispatchStats s = ex->stats();
  const uint64_t cached = s.pairs_cached - before.pairs_cached;
  EXPECT_GT(cached, 0u) << s.to_json();
  EXPECT_LT(cached, s.pairs - before.pairs) << "3 of 12 experts cannot serve every pair";
  EXPECT_EQ(s.pairs, s.pairs_remote + s.pairs_local + s.pairs_fallback + s.pairs_cached) << s.to_json();
  EXPECT_EQ(s.pairs_fallback, 0u) << s.to_json();
  EXPECT_EQ(cache.report().hits, s.pairs_cached);
  EXPECT_LE(s.calls_from_cache, s.layer_calls);
  // Never sent: the worker computed exactly the pairs the backbone accepted from it.
  uint64_t worker_pairs = 0;
  for (int i = 0; i < 200 && (worker_pairs = w.stats().pairs) != s.pairs_remote; ++i)
    std::this_thread::sleep_for(10ms);
  EXPECT_EQ(worker_pairs, s.pairs_remote);
}

TEST(HotExpertCache, ADamagedDownloadIsRefusedCountedRetriedAndNeverUsed) {
  const SwarmModel& m = SwarmModel::get({SynthArch::QWEN3MOE, SynthTypeMix::Q4_K_M});
  const Catalogue cat(m);
  Digests d(m);
  const uint64_t per_expert = one_expert_bytes(m, cat);
  // Every expert fits; every slab read of the first layer's slice gets one flipped byte (the header is the
  // read at offset 0, left intact).
  const std::string damaged = cat.slices.front().target;
  auto flip = [damaged](const std::string& target, uint64_t offset, std::vector<uint8_t>& b) {
    if (target == damaged && offset > 0 && !b.empty()) b[b.size() / 2] ^= 0x10;
  };
  HotExpertCache cache(file_source(m, cat, flip), options_for(m, d, 64 * per_expert));
  ThreadPool pool(2);
  PipeWorker w(m.split_experts(1)[0]);
  DispatchOptions opts = patient_options();
  opts.hot_cache = &cache;
  auto ex = RemoteExpertExecutor::create(m.model->expert_store(), m.identity, {w.endpoint("w")}, &pool, opts);
  ASSERT_EQ(ex->wait_connected(net::deadline_in(10s)), 1u);
  const std::vector<int32_t> tokens = m.tokens(24);
  const std::vector<float> want = mono_logits(m, tokens);
  expect_same_bits(eval_logits(m, tokens, *ex, 1), want, "cold");
  cache.step();
  const uint64_t refused_once = cache.report().refusals;
  EXPECT_GT(refused_once, 0u) << "the first layer's experts all arrive damaged";
  cache.step();
  EXPECT_GT(cache.report().refusals, refused_once) << "refused downloads are tried again later";
  EXPECT_NE(cache.report().last_refusal.find("damaged or altered"), std::string::npos) << cache.report().last_refusal;
  for (const ExpertKey& k : cache.snapshot()->keys())
    EXPECT_NE(uint32_t(k.layer), cat.slices.front().layer) << "a damaged expert was put in the cache";
  EXPECT_GT(cache.snapshot()->size(), 0u) << "the undamaged layer's experts are cached";
  expect_same_bits(eval_logits(m, tokens, *ex, 1), want, "with the refusals");
  EXPECT_GT(ex->stats().pairs_cached, 0u);
}

TEST(HotExpertCache, WhenTheTrafficMovesAColderExpertIsEvictedForAHotterOne) {
  const SwarmModel& m = SwarmModel::get({SynthArch::QWEN3MOE, SynthTypeMix::Q4_K_M});
  const Catalogue cat(m);
  Digests d(m);
  const uint64_t per_expert = one_expert_bytes(m, cat);
  HotCacheOptions o = options_for(m, d, 2 * per_expert);
  o.window_steps = 4;
  HotExpertCache cache(file_source(m, cat), o);
  const int32_t L = int32_t(m.moe_layers.front());
  auto picks = [&](std::vector<int32_t> ids) {
    for (int i = 0; i < 4; ++i) {
      ExpertBatch b{.layer = L, .n_rows = int64_t(ids.size()), .k = 1, .act_type = GgmlType::F32, .act = {}, .ids = ids};
      cache.observe(b);
    }
  };
  picks({0, 0, 0, 1, 1, 2});
  EXPECT_EQ(cache.step(), 2u);
  EXPECT_EQ(cache.snapshot()->keys(), (std::vector<ExpertKey>{{L, 0}, {L, 1}}));
  // Expert 2 now a bit hotter than 1: not enough to swap (hysteresis)...
  picks({0, 0, 0, 1, 1, 2, 2, 2});  // window: 1 picked 2×4 = 8, 2 picked 3×4 = 12 = 1.5 × 8: a tie stays
  cache.step();
  EXPECT_EQ(cache.snapshot()->keys(), (std::vector<ExpertKey>{{L, 0}, {L, 1}}));
  EXPECT_EQ(cache.report().evictions, 0u);
  // ...then clearly hotter: 1 is evicted, 2 fetched, and the budget holds throughout.
  picks({0, 0, 0, 2, 2, 2, 2});
  cache.step();
  EXPECT_EQ(cache.snapshot()->keys(), (std::vector<ExpertKey>{{L, 0}, {L, 2}}));
  EXPECT_EQ(cache.report().evictions, 1u);
  EXPECT_LE(cache.report().bytes_held, 2 * per_expert);
}

// Seeded mutations of a real slice file served as the coordinator's answer (bytes flipped anywhere, header
// included; truncations): every round ends with the experts refused or failed with a message, or cached —
// and whatever is cached computes exactly what the backbone's own copy computes, since only bytes hashing
// to the backbone's digest get in.
TEST(HotExpertCache, MutatedSliceFilesNeverPutOtherBytesInTheCache) {
  const SwarmModel& m = SwarmModel::get({SynthArch::QWEN3MOE, SynthTypeMix::Q4_K_M});
  const Catalogue cat(m);
  Digests d(m);
  const SliceRef& ref = cat.slices.front();
  const std::vector<uint8_t> original = read_range(ref.target, 0, ref.bytes);
  ASSERT_EQ(original.size(), ref.bytes);
  std::mt19937_64 rng(2024);
  uint64_t inserted = 0, refused = 0, failed = 0;
  for (int round = 0; round < 120; ++round) {
    std::vector<uint8_t> file = original;
    const int kind = int(rng() % 3);
    if (kind == 0) {  // a few bytes anywhere
      for (int i = 0, n = 1 + int(rng() % 4); i < n; ++i) file[rng() % file.size()] ^= uint8_t(1 + rng() % 255);
    } else if (kind == 1) {  // a byte of the header
      file[rng() % std::min<size_t>(file.size(), 4096)] ^= uint8_t(1 + rng() % 255);
    } else {  // truncated: the server's answers run short
      file.resize(rng() % file.size());
    }
    SliceRef served = ref;
    auto fetch = [&file](const std::string&, uint64_t offset, uint64_t length) -> Result<std::vector<uint8_t>> {
      if (offset > file.size() || length > file.size() - offset) return Status::error("416: past the end");
      return std::vector<uint8_t>(file.begin() + std::ptrdiff_t(offset), file.begin() + std::ptrdiff_t(offset + length));
    };
    HotCacheOptions o = options_for(m, d, 1u << 22);
    HotExpertCache cache(std::make_unique<SliceServerSource>(m.identity, std::vector<SliceRef>{served}, fetch), o);
    std::vector<int32_t> ids;
    for (uint32_t e = 0; e < m.n_expert; ++e) ids.insert(ids.end(), 2, int32_t(e));
    cache.observe(ExpertBatch{.layer = int32_t(ref.layer), .n_rows = int64_t(ids.size()), .k = 1,
                              .act_type = GgmlType::F32, .act = {}, .ids = ids});
    cache.step();
    const HotCacheReport r = cache.report();
    ASSERT_LE(r.bytes_held, r.budget_bytes);
    if (r.refusals > 0) {
      ASSERT_FALSE(r.last_refusal.empty());
    }
    inserted += r.experts_held;
    refused += r.refusals;
    failed += r.fetch_failures;
    // Whatever got in is the backbone's own expert, byte for byte.
    const std::shared_ptr<const HotSnapshot> snap = cache.snapshot();
    for (const ExpertKey& k : snap->keys()) {
      const ExpertLayer* mine = m.model->expert_store().find(k.layer, k.expert);
      const ExpertLayer* got = snap->store().find(k.layer, k.expert);
      ASSERT_NE(mine, nullptr);
      ASSERT_NE(got, nullptr);
      const int32_t j = k.expert - mine->expert_begin;
      const uint64_t gate = uint64_t(mine->gate.rows) * mine->gate.row_stride;
      ASSERT_EQ(std::memcmp(mine->gate.data + uint64_t(j) * mine->gate.expert_stride, got->gate.data, gate), 0)
          << "round " << round << ": other gate bytes cached for expert " << k.expert;
      const uint64_t down = uint64_t(mine->down.rows) * mine->down.row_stride;
      ASSERT_EQ(std::memcmp(mine->down.data + uint64_t(j) * mine->down.expert_stride, got->down.data, down), 0);
    }
  }
  EXPECT_GT(inserted, 0u) << "some mutations leave some experts intact";
  EXPECT_GT(refused, 0u) << "flipped slab bytes are refused";
  EXPECT_GT(failed, 0u) << "truncations and broken headers fail";
}

}  // namespace
}  // namespace essaim::backbone::testing
