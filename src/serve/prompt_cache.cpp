#include "serve/prompt_cache.h"

#include <algorithm>
#include <cstring>

namespace essaim::serve {
namespace {

bool has_recurrent_layers(const SequenceCache& cache) {
  for (int32_t il = 0; il < cache.n_layers(); ++il)
    if (std::holds_alternative<RecurrentState>(cache.layer(il))) return true;
  return false;
}

size_t common_prefix(std::span<const TokenId> a, std::span<const TokenId> b) {
  const size_t n = std::min(a.size(), b.size());
  return size_t(std::mismatch(a.begin(), a.begin() + ptrdiff_t(n), b.begin()).first - a.begin());
}

// The recurrent states' bytes: one checkpoint of this cache.
uint64_t checkpoint_bytes(const SequenceCache& cache) {
  uint64_t b = 0;
  for (int32_t il = 0; il < cache.n_layers(); ++il)
    if (const auto* r = std::get_if<RecurrentState>(&cache.layer(il))) b += (r->conv.size() + r->state.size()) * sizeof(float);
  return b;
}

}  // namespace

PromptCache::PromptCache(PromptCacheOptions options) : options_(options) {
  ESSAIM_CHECK(options_.checkpoint_interval > 0);
}

uint64_t PromptCache::Checkpoint::bytes() const {
  uint64_t b = 0;
  for (const auto& v : conv) b += v.size() * sizeof(float);
  for (const auto& v : state) b += v.size() * sizeof(float);
  return b;
}

bool PromptCache::is_checkpoint(size_t n, size_t prompt_size) const {
  if (n == 0 || n >= prompt_size) return false;
  return n % size_t(options_.checkpoint_interval) == 0 || n + 1 == prompt_size;
}

std::shared_ptr<const PromptCache::Checkpoint> PromptCache::snapshot(const SequenceCache& cache) const {
  auto* cp = new Checkpoint;
  cp->n = cache.n_past();
  for (int32_t il = 0; il < cache.n_layers(); ++il) {
    if (const auto* r = std::get_if<RecurrentState>(&cache.layer(il))) {
      cp->conv.push_back(r->conv);
      cp->state.push_back(r->state);
    }
  }
  const uint64_t bytes = cp->bytes();
  live_checkpoint_bytes_->fetch_add(bytes);
  return std::shared_ptr<const Checkpoint>(cp, [live = live_checkpoint_bytes_, bytes](const Checkpoint* c) {
    live->fetch_sub(bytes);
    delete c;
  });
}

// Within the budget, a prefill's checkpoints: those of every prefill in progress together, and this one's
// entry (its K/V so far and its checkpoints) alone.
bool PromptCache::room_for_checkpoint(const Recording& rec, const SequenceCache& cache) {
  if (options_.budget_bytes < 0) return true;
  const uint64_t budget = uint64_t(options_.budget_bytes), b = checkpoint_bytes(cache);
  uint64_t own = b;
  for (const auto& c : rec.checkpoints) own += c->bytes();
  for (int32_t il = 0; il < cache.n_layers(); ++il)
    if (const auto* kv = std::get_if<KvCache>(&cache.layer(il))) own += kv->bytes();
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t pending = live_checkpoint_bytes_->load() - held_checkpoint_bytes_;
  if (pending + b <= budget && own <= budget) return true;
  ++stats_.checkpoints_skipped;
  return false;
}

// `cache` at n tokens of e: the first n K/V rows of each attention layer, the checkpoint's recurrent states.
void PromptCache::restore(const Entry& e, const Checkpoint* cp, size_t n, SequenceCache& cache) {
  size_t ir = 0;
  for (int32_t il = 0; il < cache.n_layers(); ++il) {
    if (const auto* kv = std::get_if<KvCache>(&e.layers[size_t(il)])) cache.kv(il).assign_prefix(*kv, int32_t(n));
    if (auto* r = std::get_if<RecurrentState>(&cache.layer(il))) {
      ESSAIM_CHECK(cp != nullptr && size_t(cp->n) == n && r->conv.size() == cp->conv[ir].size() &&
                   r->state.size() == cp->state[ir].size());
      std::memcpy(r->conv.data(), cp->conv[ir].data(), r->conv.size() * sizeof(float));
      std::memcpy(r->state.data(), cp->state[ir].data(), r->state.size() * sizeof(float));
      ++ir;
    }
  }
  cache.advance(int32_t(n));
}

// The tokens of `prompt` that e can restore (0: none): its shared prefix, less the prompt's last token, and
// with recurrent layers down to the last checkpoint within that (*cp).
size_t PromptCache::resumable(const Entry& e, std::span<const TokenId> prompt, const Recording& rec,
                              const Checkpoint** cp) const {
  *cp = nullptr;
  if (rec.hidden && e.hidden.empty()) return 0;
  const size_t limit = std::min(common_prefix(e.tokens, prompt), prompt.size() - 1);
  if (!rec.recurrent) return limit;
  for (const auto& c : e.checkpoints)
    if (size_t(c->n) <= limit) *cp = c.get();
  return *cp ? size_t((*cp)->n) : 0;
}

size_t PromptCache::begin(std::span<const TokenId> prompt, SequenceCache& cache, Recording& rec,
                          std::span<float> hidden) {
  rec = Recording{};
  if (!enabled() || prompt.empty()) return 0;
  rec.on = true;
  rec.recurrent = has_recurrent_layers(cache);
  rec.hidden = !hidden.empty();
  std::lock_guard<std::mutex> lock(mu_);
  Entries::iterator best = entries_.end();
  const Checkpoint* best_cp = nullptr;
  size_t best_n = 0;
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {  // most recent first: ties go to it
    const Checkpoint* cp = nullptr;
    const size_t n = resumable(*it, prompt, rec, &cp);
    if (n > best_n) best = it, best_n = n, best_cp = cp;
  }
  if (best == entries_.end()) {
    ++stats_.misses;
    return 0;
  }
  restore(*best, best_cp, best_n, cache);
  if (rec.hidden) {
    const size_t E = hidden.size() / prompt.size();
    std::copy_n(best->hidden.begin(), best_n * E, hidden.begin());
  }
  for (const auto& c : best->checkpoints)
    if (size_t(c->n) <= best_n) rec.checkpoints.push_back(c);
  entries_.splice(entries_.begin(), entries_, best);
  ++stats_.hits;
  stats_.tokens_reused += best_n;
  return best_n;
}

size_t PromptCache::chunk_end(const Recording& rec, size_t done, size_t prompt_size) const {
  if (!rec.on || !rec.recurrent) return prompt_size;
  const size_t interval = size_t(options_.checkpoint_interval);
  size_t end = (done / interval + 1) * interval;
  if (done + 1 < prompt_size) end = std::min(end, prompt_size - 1);
  return std::min(end, prompt_size);
}

void PromptCache::prefilled(Recording& rec, std::span<const TokenId> prompt, const SequenceCache& cache,
                            std::span<const float> hidden) {
  if (!rec.on) return;
  const size_t n = size_t(cache.n_past());
  const bool newer = rec.checkpoints.empty() || size_t(rec.checkpoints.back()->n) < n;
  if (rec.recurrent && is_checkpoint(n, prompt.size()) && newer && room_for_checkpoint(rec, cache))
    rec.checkpoints.push_back(snapshot(cache));
  if (n < prompt.size()) return;
  Entry e;
  e.tokens.assign(prompt.begin(), prompt.end());
  e.layers.resize(size_t(cache.n_layers()));
  for (int32_t il = 0; il < cache.n_layers(); ++il) {
    if (const auto* kv = std::get_if<KvCache>(&cache.layer(il))) {
      KvCache copy(kv->type(), kv->n_kv_heads(), kv->head_dim());
      copy.assign_prefix(*kv, int32_t(n));
      e.kv_bytes += copy.bytes();
      e.layers[size_t(il)] = std::move(copy);
    }
  }
  if (rec.hidden) {
    e.hidden.assign(hidden.begin(), hidden.end());
    e.kv_bytes += e.hidden.size() * sizeof(float);
  }
  e.checkpoints = std::move(rec.checkpoints);
  rec = Recording{};
  std::lock_guard<std::mutex> lock(mu_);
  insert(std::move(e));
}

uint64_t PromptCache::unheld_bytes(const Entry& e) const {
  uint64_t b = e.kv_bytes + e.tokens.size() * sizeof(TokenId);
  for (const auto& c : e.checkpoints)
    if (!held_.contains(c.get())) b += c->bytes();
  return b;
}

void PromptCache::hold(const Entry& e) {
  stats_.bytes += e.kv_bytes + e.tokens.size() * sizeof(TokenId);
  for (const auto& c : e.checkpoints)
    if (held_[c.get()]++ == 0) stats_.bytes += c->bytes(), held_checkpoint_bytes_ += c->bytes();
  ++stats_.entries;
}

void PromptCache::drop(Entries::iterator it) {
  stats_.bytes -= it->kv_bytes + it->tokens.size() * sizeof(TokenId);
  for (const auto& c : it->checkpoints) {
    auto h = held_.find(c.get());
    if (--h->second == 0) {
      stats_.bytes -= c->bytes();
      held_checkpoint_bytes_ -= c->bytes();
      held_.erase(h);
    }
  }
  --stats_.entries;
  entries_.erase(it);
}

// An entry over the budget is not kept. Otherwise entries that e holds all of leave first (e's tokens start
// with theirs and e has a checkpoint at each of their positions), then the least recently used until e fits.
void PromptCache::insert(Entry e) {
  uint64_t full = e.kv_bytes + e.tokens.size() * sizeof(TokenId);
  for (const auto& c : e.checkpoints) full += c->bytes();
  const int64_t budget = options_.budget_bytes;
  if (budget > 0 && full > uint64_t(budget)) {
    ++stats_.too_large;
    return;
  }
  for (auto it = entries_.begin(); it != entries_.end();) {
    bool covered = it->tokens.size() <= e.tokens.size() && (it->hidden.empty() || !e.hidden.empty()) &&
                   std::equal(it->tokens.begin(), it->tokens.end(), e.tokens.begin());
    for (const auto& c : it->checkpoints)
      covered = covered && std::any_of(e.checkpoints.begin(), e.checkpoints.end(),
                                       [&](const auto& d) { return d->n == c->n; });
    auto next = std::next(it);
    if (covered) drop(it), ++stats_.replaced;
    it = next;
  }
  // Terminates: with no entry left nothing is held, and e fits alone.
  while (budget > 0 && stats_.bytes + unheld_bytes(e) > uint64_t(budget)) {
    drop(std::prev(entries_.end()));
    ++stats_.evictions;
  }
  hold(e);
  entries_.push_front(std::move(e));
}

PromptCacheStats PromptCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  PromptCacheStats s = stats_;
  s.budget_bytes = options_.budget_bytes;
  s.checkpoints = held_.size();
  s.pending_bytes = live_checkpoint_bytes_->load() - held_checkpoint_bytes_;
  return s;
}

}  // namespace essaim::serve
