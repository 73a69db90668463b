#include "backbone/hot_expert_cache.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "slice/expert_digest.h"

namespace essaim::backbone {
namespace {

using Clock = std::chrono::steady_clock;

std::string key_text(ExpertKey k) {
  return "layer " + std::to_string(k.layer) + " expert " + std::to_string(k.expert);
}

// The format a fetched expert must share with the reference layer: what the kernels read.
bool same_format(const ExpertMatrices& a, const ExpertMatrices& b) {
  return a.type == b.type && a.cols == b.cols && a.rows == b.rows && a.row_stride == b.row_stride;
}

}  // namespace

// ---- the window ----

void ExpertUsageWindow::record(int32_t layer, std::span<const int32_t> ids) {
  if (layer < 0) return;
  if (layers_.size() <= size_t(layer)) layers_.resize(size_t(layer) + 1);
  Layer& l = layers_[size_t(layer)];
  std::map<int32_t, uint32_t> step;
  for (int32_t id : ids)
    if (id >= 0) ++step[id];
  std::vector<std::pair<int32_t, uint32_t>> sparse(step.begin(), step.end());
  for (const auto& [e, n] : sparse) l.totals[e] += n;
  l.steps.push_back(std::move(sparse));
  while (l.steps.size() > window_) {
    for (const auto& [e, n] : l.steps.front()) {
      auto it = l.totals.find(e);
      if ((it->second -= n) == 0) l.totals.erase(it);
    }
    l.steps.pop_front();
  }
}

uint64_t ExpertUsageWindow::count(int32_t layer, int32_t expert) const {
  if (layer < 0 || size_t(layer) >= layers_.size()) return 0;
  const auto& t = layers_[size_t(layer)].totals;
  auto it = t.find(expert);
  return it == t.end() ? 0 : it->second;
}

uint32_t ExpertUsageWindow::steps(int32_t layer) const {
  if (layer < 0 || size_t(layer) >= layers_.size()) return 0;
  return uint32_t(layers_[size_t(layer)].steps.size());
}

std::vector<std::pair<ExpertKey, uint64_t>> ExpertUsageWindow::counts() const {
  std::vector<std::pair<ExpertKey, uint64_t>> out;
  for (size_t l = 0; l < layers_.size(); ++l)
    for (const auto& [e, n] : layers_[l].totals) out.push_back({ExpertKey{int32_t(l), e}, n});
  return out;
}

// ---- the choice ----

std::vector<ExpertKey> choose_hot_set(std::vector<HotCandidate> candidates, const HotChoiceOptions& options) {
  auto score = [&](const HotCandidate& c) { return double(c.count) * (c.held ? options.keep_bonus : 1.0); };
  std::sort(candidates.begin(), candidates.end(), [&](const HotCandidate& a, const HotCandidate& b) {
    const double sa = score(a), sb = score(b);
    if (sa != sb) return sa > sb;
    if (a.held != b.held) return a.held;
    return a.key < b.key;
  });
  std::vector<ExpertKey> chosen;
  uint64_t left = options.budget_bytes;
  for (const HotCandidate& c : candidates) {
    if (score(c) < double(options.min_count) || c.bytes == 0 || c.bytes > left) continue;
    left -= c.bytes;
    chosen.push_back(c.key);
  }
  return chosen;
}

// ---- snapshots ----

struct HotSnapshot::Entry {
  ExpertKey key;
  uint8_t* data = nullptr;  // 64-byte aligned, owned
  uint64_t bytes = 0;
  ExpertLayer layer;        // views into data: one expert, expert_begin = key.expert
  ~Entry() { std::free(data); }
};

std::vector<ExpertKey> HotSnapshot::keys() const {
  std::vector<ExpertKey> k;
  for (const auto& [key, e] : experts_) k.push_back(key);
  return k;
}

// ---- the cache ----

HotExpertCache::HotExpertCache(std::unique_ptr<HotExpertSource> source, HotCacheOptions options)
    : source_(std::move(source)), options_(std::move(options)), window_(options_.window_steps),
      snap_(std::make_shared<HotSnapshot>()) {
  report_.enabled = true;
  report_.budget_bytes = options_.budget_bytes;
}

HotExpertCache::~HotExpertCache() {
  {
    std::lock_guard lock(wake_mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void HotExpertCache::start() {
  if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
}

void HotExpertCache::loop() {
  std::unique_lock lock(wake_mu_);
  while (!stopping_) {
    lock.unlock();
    step();
    lock.lock();
    wake_.wait_for(lock, options_.replan, [&] { return stopping_; });
  }
}

void HotExpertCache::observe(const ExpertBatch& batch) {
  std::lock_guard lock(window_mu_);
  window_.record(batch.layer, batch.ids);
}

std::shared_ptr<const HotSnapshot> HotExpertCache::snapshot() const {
  std::lock_guard lock(snap_mu_);
  return snap_;
}

void HotExpertCache::note_hits(uint64_t pairs) {
  std::lock_guard lock(snap_mu_);
  report_.hits += pairs;
}

HotCacheReport HotExpertCache::report() const {
  std::lock_guard lock(snap_mu_);
  HotCacheReport r = report_;
  r.bytes_held = snap_->bytes();
  r.experts_held = snap_->size();
  return r;
}

bool HotExpertCache::wait_for_experts(size_t n, std::chrono::milliseconds timeout) const {
  std::unique_lock lock(snap_mu_);
  return snap_cv_.wait_for(lock, timeout, [&] { return snap_->size() >= n; });
}

void HotExpertCache::publish(std::shared_ptr<HotSnapshot> next) {
  {
    std::lock_guard lock(snap_mu_);
    snap_ = std::move(next);
  }
  snap_cv_.notify_all();
}

void HotExpertCache::note_failure(ExpertKey key) {
  Backoff& b = backoff_[key];
  b.pause = b.pause.count() == 0 ? options_.retry_after : std::min(options_.retry_max, b.pause * 2);
  b.until = Clock::now() + b.pause;
}

size_t HotExpertCache::step() {
  const std::shared_ptr<const HotSnapshot> now = snapshot();
  HotChoiceOptions choice = options_.choice;
  choice.budget_bytes = options_.budget_bytes;
  const std::vector<ExpertKey> want = choose_hot_set(candidates(*now), choice);
  evict_unwanted(*now, want);  // first, so the budget holds while the newcomers arrive
  fetch_missing(want);
  return snapshot()->size();
}

// The window's picked experts and the held ones (no longer picked: still candidates), with their bytes. An
// expert waiting out the pause after a refused or failed fetch is no candidate: its share of the budget goes
// to the next hottest meanwhile.
std::vector<HotCandidate> HotExpertCache::candidates(const HotSnapshot& now) {
  std::vector<std::pair<ExpertKey, uint64_t>> counts;
  {
    std::lock_guard lock(window_mu_);
    counts = window_.counts();
  }
  std::map<ExpertKey, uint64_t> by_key(counts.begin(), counts.end());
  for (const ExpertKey& k : now.keys()) by_key.emplace(k, 0);
  const Clock::time_point t = Clock::now();
  auto pausing = [&](ExpertKey k) {
    auto b = backoff_.find(k);
    return b != backoff_.end() && t < b->second.until;
  };
  std::vector<HotCandidate> out;
  for (const auto& [key, count] : by_key) {
    const bool held = now.holds(key.layer, key.expert);
    if (!held && pausing(key)) continue;
    uint64_t bytes = 0;
    if (auto it = expert_bytes_.find(key.layer); it != expert_bytes_.end()) {
      bytes = it->second;
    } else if (count >= options_.choice.min_count) {
      Result<uint64_t> b = source_->expert_bytes(key.layer, key.expert);  // the slice's header, once
      if (!b) {
        note_failure(key);
        std::lock_guard lock(snap_mu_);
        ++report_.fetch_failures;
        if (options_.log) options_.log("hot cache: " + key_text(key) + ": " + b.status().message());
        continue;
      }
      bytes = expert_bytes_[key.layer] = *b;
    }
    out.push_back({.key = key, .count = count, .bytes = bytes, .held = held});
  }
  return out;
}

// A new snapshot without the held experts the plan no longer wants.
void HotExpertCache::evict_unwanted(const HotSnapshot& now, const std::vector<ExpertKey>& want) {
  std::vector<ExpertKey> evict;
  for (const ExpertKey& k : now.keys())
    if (std::find(want.begin(), want.end(), k) == want.end()) evict.push_back(k);
  if (evict.empty()) return;
  auto next = std::make_shared<HotSnapshot>();
  for (const auto& [k, e] : now.experts_) {
    if (std::find(evict.begin(), evict.end(), k) != evict.end()) continue;
    (void)next->store_.add(k.layer, e->layer);  // it was added to a store before: cannot fail
    next->experts_.emplace(k, e);
    next->bytes_ += e->bytes;
  }
  publish(std::move(next));
  std::lock_guard lock(snap_mu_);
  report_.evictions += evict.size();
}

// The plan's missing experts, hottest first (want is in score order), each fetched, verified and inserted.
void HotExpertCache::fetch_missing(const std::vector<ExpertKey>& want) {
  for (const ExpertKey& k : want) {
    {
      std::unique_lock lock(wake_mu_);
      if (stopping_) break;
    }
    if (snapshot()->holds(k.layer, k.expert)) continue;
    Result<FetchedExpert> f = source_->fetch(k.layer, k.expert);
    if (!f) {
      note_failure(k);
      std::lock_guard lock(snap_mu_);
      ++report_.fetch_failures;
      if (options_.log) options_.log("hot cache: fetching " + key_text(k) + ": " + f.status().message());
      continue;
    }
    const uint64_t got = f->bytes.size();
    Result<bool> in = insert(k, std::move(*f));
    if (!in) {
      note_failure(k);
      std::lock_guard lock(snap_mu_);
      ++report_.refusals;
      report_.last_refusal = key_text(k) + ": " + in.status().message();
      if (options_.log) options_.log("hot cache: refused " + report_.last_refusal);
      continue;
    }
    backoff_.erase(k);
    if (!*in) continue;  // verified, but no longer fits: the plan is redone next round
    std::lock_guard lock(snap_mu_);
    ++report_.fetches;
    report_.fetch_bytes += got;
  }
}

Result<bool> HotExpertCache::insert(ExpertKey key, FetchedExpert f) {
  // The bytes first: nothing else about a download means anything until they are the expected ones.
  Sha256Digest expected = holding_digest(std::span<const Sha256Digest>(&f.recorded_digest, 1));
  if (options_.expected_digest) {
    Result<Sha256Digest> e = options_.expected_digest(key.layer, key.expert);
    if (!e) return e.status().with_context("the expected digest");
    expected = *e;
  }
  const Sha256Digest d = sha256(f.bytes);
  const Sha256Digest got = holding_digest(std::span<const Sha256Digest>(&d, 1));
  if (got != expected) {
    return Status::error("its bytes hash to " + digest_hex(d).substr(0, 16) +
                         "..., not the expert's digest: a damaged or altered download");
  }
  // The slabs must tile the bytes and describe one expert of the layer's format.
  const size_t want_slabs = f.fused ? 2 : 3;
  if (f.slabs.size() != want_slabs) return Status::error("a download of " + std::to_string(f.slabs.size()) + " slabs");
  uint64_t at = 0;
  for (const FetchedExpert::Slab& s : f.slabs) {
    if (s.offset != at || s.cols <= 0 || s.rows <= 0 || s.bytes != type_traits(s.type).row_bytes(s.cols) * uint64_t(s.rows))
      return Status::error("slab sizes that do not match their shapes");
    at += s.bytes;
  }
  if (at != f.bytes.size()) return Status::error("slabs that do not cover the download");

  auto entry = std::make_shared<HotSnapshot::Entry>();
  entry->key = key;
  entry->bytes = f.bytes.size();
  const size_t alloc = (f.bytes.size() + 63) / 64 * 64;
  entry->data = static_cast<uint8_t*>(std::aligned_alloc(64, alloc == 0 ? 64 : alloc));
  if (entry->data == nullptr) return Status::error("out of memory for " + std::to_string(f.bytes.size()) + " bytes");
  std::memcpy(entry->data, f.bytes.data(), f.bytes.size());
  auto view = [&](const FetchedExpert::Slab& s) {
    return ExpertLayer::Tensor3d{s.type, s.cols, s.rows, 1, entry->data + s.offset};
  };
  entry->layer = f.fused ? ExpertLayer::fused(view(f.slabs[0]), view(f.slabs[1]), key.expert)
                         : ExpertLayer::separate(view(f.slabs[0]), view(f.slabs[1]), view(f.slabs[2]), key.expert);
  ESSAIM_RETURN_IF_ERROR(entry->layer.validate());
  if (options_.reference != nullptr) {
    const ExpertLayer* ref = options_.reference->any(key.layer);
    if (ref == nullptr) return Status::error("the backbone has no format for this layer");
    const ExpertLayer& l = entry->layer;
    if (l.n_embd != ref->n_embd || l.n_ff != ref->n_ff || !same_format(l.gate, ref->gate) ||
        !same_format(l.up, ref->up) || !same_format(l.down, ref->down))
      return Status::error("tensors of another format than the backbone's layer");
  }

  const std::shared_ptr<const HotSnapshot> now = snapshot();
  if (now->bytes() + entry->bytes > options_.budget_bytes) return false;
  auto next = std::make_shared<HotSnapshot>();
  for (const auto& [k, e] : now->experts_) {
    (void)next->store_.add(k.layer, e->layer);
    next->experts_.emplace(k, e);
    next->bytes_ += e->bytes;
  }
  ESSAIM_RETURN_IF_ERROR(next->store_.add(key.layer, entry->layer));
  next->bytes_ += entry->bytes;
  next->experts_.emplace(key, std::move(entry));
  publish(std::move(next));
  return true;
}

}  // namespace essaim::backbone
