// The backbone's hot-expert cache (docs/dispatch.md, "The hot-expert cache"): the experts the router picks
// most, counted per layer over a sliding window of recent steps, are fetched in the background from a
// source (the coordinator's slice server: backbone/slice_server_source.h), verified against the expert's
// content digest, kept in RAM within a byte budget and computed locally by the same LocalExpertExecutor
// kernels — exact by construction, since the bytes and the kernels are the same. The dispatcher computes
// the pairs whose expert is cached instead of sending them (DispatchOptions::hot_cache).
//
//   HotExpertCache cache(std::move(source), {.budget_bytes = 64 << 20, .expected_digest = digests});
//   cache.start();                                        // the background planner/fetcher
//   cache.observe(batch);                                 // every layer call: the router's picks
//   std::shared_ptr<const HotSnapshot> hot = cache.snapshot();
//   if (hot->holds(layer, expert)) ...                    // computed from hot->store()
//
// Parts testable on their own: ExpertUsageWindow (the counting) and choose_hot_set (budget, hysteresis).
// A download that does not hash to the expected digest, or whose shape is not the reference's, is refused,
// counted, and retried later with a doubling pause; it is never put in a snapshot. A snapshot is immutable:
// a layer call uses one snapshot throughout, and eviction publishes a new one (the old one lives on in the
// calls still using it).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backbone/dispatch_stats.h"
#include "core/status.h"
#include "slice/model_identity.h"
#include "moe/executor.h"

namespace essaim::backbone {

struct ExpertKey {
  int32_t layer = 0;
  int32_t expert = 0;
  auto operator<=>(const ExpertKey&) const = default;
};

// How often each expert of each layer was picked in the last `window_steps` layer calls of that layer.
// A step is one executor call of a layer (one decode step of the whole batch, or one prefill chunk).
class ExpertUsageWindow {
 public:
  explicit ExpertUsageWindow(uint32_t window_steps) : window_(window_steps == 0 ? 1 : window_steps) {}
  void record(int32_t layer, std::span<const int32_t> ids);  // ids < 0 are not picks
  uint64_t count(int32_t layer, int32_t expert) const;
  uint32_t steps(int32_t layer) const;  // steps in the window now (at most window_steps)
  // Every (layer, expert) with a non-zero count in the window.
  std::vector<std::pair<ExpertKey, uint64_t>> counts() const;

 private:
  struct Layer {
    std::deque<std::vector<std::pair<int32_t, uint32_t>>> steps;  // per step: (expert, picks)
    std::map<int32_t, uint64_t> totals;                          // over the steps in the window
  };
  uint32_t window_;
  std::vector<Layer> layers_;
};

struct HotCandidate {
  ExpertKey key;
  uint64_t count = 0;  // picks in the window
  uint64_t bytes = 0;  // what holding it costs
  bool held = false;
};

struct HotChoiceOptions {
  uint64_t budget_bytes = 0;
  // Hysteresis: a held expert competes with count × keep_bonus, so a colder newcomer must be picked that
  // much more often to take its place (a near tie never swaps back and forth).
  double keep_bonus = 1.5;
  uint64_t min_count = 2;  // an expert picked fewer times in the window is not worth a download
};

// The experts to hold: by score (count, × keep_bonus when held), greedily while they fit the budget; an
// expert that does not fit is skipped and a smaller one after it may still be taken. Ties: held first,
// then (layer, expert) order, so the choice is deterministic.
std::vector<ExpertKey> choose_hot_set(std::vector<HotCandidate> candidates, const HotChoiceOptions& options);

// One expert's bytes as fetched: its slabs concatenated in the digest's order (gate, up, down; a fused
// gate_up slab stands for gate then up: slice/expert_digest.h), and the tensors' formats.
struct FetchedExpert {
  struct Slab {
    GgmlType type = GgmlType::F32;
    int64_t cols = 0, rows = 0;  // ne[0], ne[1] of the *_exps tensor
    uint64_t offset = 0, bytes = 0;  // within `bytes` below
  };
  bool fused = false;          // slabs: [gate_up, down] instead of [gate, up, down]
  std::vector<Slab> slabs;
  std::vector<uint8_t> bytes;
  Sha256Digest recorded_digest{};  // what the source's own metadata says (the slice header)
};

// Where cached experts come from. Called from the cache's background thread only.
class HotExpertSource {
 public:
  virtual ~HotExpertSource() = default;
  // The bytes holding one expert of `layer` costs (what fetch would return), or an error.
  virtual Result<uint64_t> expert_bytes(int32_t layer, int32_t expert) = 0;
  virtual Result<FetchedExpert> fetch(int32_t layer, int32_t expert) = 0;
};

// The cached experts at one moment: an ExpertStore of one-expert ranges over owned bytes.
class HotSnapshot {
 public:
  bool holds(int32_t layer, int32_t expert) const { return store_.find(layer, expert) != nullptr; }
  const ExpertStore& store() const { return store_; }
  uint64_t bytes() const { return bytes_; }
  size_t size() const { return experts_.size(); }
  std::vector<ExpertKey> keys() const;

 private:
  friend class HotExpertCache;
  struct Entry;
  ExpertStore store_;
  std::map<ExpertKey, std::shared_ptr<const Entry>> experts_;
  uint64_t bytes_ = 0;
};

struct HotCacheOptions {
  uint64_t budget_bytes = 0;
  uint32_t window_steps = 64;
  HotChoiceOptions choice;  // budget_bytes is taken from above
  std::chrono::milliseconds replan{20};           // how often the background thread looks again
  std::chrono::milliseconds retry_after{500};     // first pause after a refused or failed fetch (doubles)
  std::chrono::milliseconds retry_max{30'000};
  // The digest an expert's bytes must hash to (holding_digest of its one expert digest, as
  // ExpertDigestCache::holding(layer, e, 1) gives). Unset: the digest the source recorded (the slice
  // header's), which trusts the coordinator's file for what the expert is.
  std::function<Result<Sha256Digest>(int32_t layer, int32_t expert)> expected_digest;
  // When set, a fetched expert must have this store's format for its layer (types, widths, activation):
  // the backbone's own layers.
  const ExpertStore* reference = nullptr;
  std::function<void(const std::string&)> log;  // refusals, evictions; may be null
};

class HotExpertCache {
 public:
  HotExpertCache(std::unique_ptr<HotExpertSource> source, HotCacheOptions options);
  ~HotExpertCache();  // stops the background thread
  HotExpertCache(const HotExpertCache&) = delete;
  HotExpertCache& operator=(const HotExpertCache&) = delete;

  void start();  // the background thread: plan(), then fetch() what is missing, every `replan`
  void observe(const ExpertBatch& batch);  // the router's picks of one layer call (cheap; never blocks on I/O)
  std::shared_ptr<const HotSnapshot> snapshot() const;
  void note_hits(uint64_t pairs);  // pairs the dispatcher served from a snapshot

  // One round of the background work, callable directly (tests): evicts what no longer earns its place,
  // then fetches, verifies and inserts the missing experts of the plan. Returns the snapshot's size.
  size_t step();
  HotCacheReport report() const;
  bool wait_for_experts(size_t n, std::chrono::milliseconds timeout) const;  // tests and benchmarks

 private:
  struct Backoff {
    std::chrono::steady_clock::time_point until{};
    std::chrono::milliseconds pause{0};
  };
  // Verifies, then publishes a new snapshot with it: true; false when it no longer fits the budget; an
  // error (a refusal) when the bytes or their format are not the expected ones.
  Result<bool> insert(ExpertKey key, FetchedExpert fetched);
  void publish(std::shared_ptr<HotSnapshot> next);
  void note_failure(ExpertKey key);
  // step()'s phases: the candidates, the eviction of what the plan drops, the fetches of what it adds.
  std::vector<HotCandidate> candidates(const HotSnapshot& now);
  void evict_unwanted(const HotSnapshot& now, const std::vector<ExpertKey>& want);
  void fetch_missing(const std::vector<ExpertKey>& want);
  void loop();

  std::unique_ptr<HotExpertSource> source_;
  const HotCacheOptions options_;

  mutable std::mutex window_mu_;
  ExpertUsageWindow window_;  // guarded by window_mu_

  mutable std::mutex snap_mu_;
  mutable std::condition_variable snap_cv_;
  std::shared_ptr<const HotSnapshot> snap_;  // guarded by snap_mu_
  HotCacheReport report_;                    // guarded by snap_mu_

  std::map<ExpertKey, Backoff> backoff_;  // the background thread's own
  std::map<int32_t, uint64_t> expert_bytes_;  // per layer, once known (the background thread's own)

  std::mutex wake_mu_;
  std::condition_variable wake_;
  bool stopping_ = false;  // guarded by wake_mu_
  std::thread thread_;
};

}  // namespace essaim::backbone
