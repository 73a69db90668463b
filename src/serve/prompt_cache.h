// The prompt cache of `essaim serve` (--cache-ram, llama-server's flag): what a prompt's prefill leaves in a
// sequence's cache is kept after the prefill, so that a later prompt that starts with the same tokens (the
// system prompt and the history an agent resends every turn) resumes from it instead of computing them
// again — exactly: a restored cache holds the bits that prefilling the prefix writes, and prefill results do
// not depend on how a prompt is chunked (docs/invariants.md invariant 2), so every later logit is the same.
//
//   PromptCache pc({.budget_bytes = int64_t(8192) << 20});
//   PromptCache::Recording rec;
//   size_t done = pc.begin(prompt, cache, rec);             // tokens restored into a fresh cache (0: a miss)
//   while (done < prompt.size()) {
//     size_t n = std::min(chunk, pc.chunk_end(rec, done, prompt.size()) - done);   // stop at a checkpoint
//     model.forward({.tokens = prompt.subspan(done, n), .cache = &cache, ...});  done += n;
//     pc.prefilled(rec, prompt, cache);                     // a checkpoint there; at the end, the entry
//   }
//
// Attention layers: an entry keeps the K/V rows of its whole prompt, and any prefix of them is a valid cache.
// Recurrent layers (qwen35moe's Gated DeltaNet) cannot be cut back to an arbitrary position, so an entry keeps
// their states at checkpoints — every `checkpoint_interval` tokens of the prompt and one token before its end
// — and a prompt resumes from the longest checkpoint within the prefix it shares. A prompt always leaves its
// last token to compute: the first sampled token comes from that token's logits. Checkpoints are shared
// between entries (a prompt resumed from an entry keeps that entry's checkpoints of the shared prefix) and
// counted once. Entries leave least recently used first when a new one needs room in the budget; an entry
// whose tokens and checkpoints a newer entry also holds leaves at once (replaced). Checkpoints of prefills in
// progress are not in an entry yet; they are bounded too: a prefill skips a checkpoint when those of all
// prefills in progress would exceed the budget, or when its own entry could not fit. Speculating sequences
// (--draft-max) also need the prompt's hidden rows, which the entries they store keep.
// All members are thread-safe (one mutex); the scheduler thread does the work, /metrics reads stats().
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "model/cache.h"
#include "text/vocab.h"

namespace essaim::serve {

struct PromptCacheOptions {
  int64_t budget_bytes = 0;           // 0: off; < 0: no limit
  int32_t checkpoint_interval = 256;  // recurrent-state checkpoints every this many prompt tokens
};

struct PromptCacheStats {
  int64_t budget_bytes = 0;
  uint64_t bytes = 0;            // held: K/V rows, tokens, and each checkpoint once
  uint64_t entries = 0;
  uint64_t checkpoints = 0;      // distinct recurrent-state checkpoints held
  uint64_t hits = 0;             // prompts that resumed from an entry
  uint64_t misses = 0;           // prompts that found nothing to resume from
  uint64_t tokens_reused = 0;    // prompt tokens restored instead of computed
  uint64_t evictions = 0;        // entries dropped for room in the budget
  uint64_t replaced = 0;         // entries dropped because a newer one holds all they held
  uint64_t too_large = 0;        // prompts whose entry alone exceeds the budget (not kept)
  uint64_t checkpoints_skipped = 0;  // checkpoints a prefill did not take, for the budget
  uint64_t pending_bytes = 0;    // checkpoints of prefills in progress (not held by an entry yet)
};

class PromptCache {
 public:
  // The recurrent layers' states at one position of a prompt, in layer order.
  struct Checkpoint {
    int32_t n = 0;  // tokens processed
    std::vector<std::vector<float>> conv, state;
    uint64_t bytes() const;
  };
  // A sequence's prefill in progress: the checkpoints it has so far (its own and those it resumed with).
  struct Recording {
    bool on = false;
    bool recurrent = false;  // the model has recurrent layers: chunks stop at checkpoint positions
    bool hidden = false;     // a speculating sequence: its entry keeps the prompt's final normed states
    std::vector<std::shared_ptr<const Checkpoint>> checkpoints;  // ascending n
  };

  explicit PromptCache(PromptCacheOptions options);
  bool enabled() const { return options_.budget_bytes != 0; }

  // A new sequence: restores into `cache` (fresh: n_past 0) the longest prefix of `prompt` an entry holds,
  // at most prompt.size() − 1 tokens, and starts `rec`. Returns the tokens restored (cache.n_past()).
  // A speculating sequence passes its prompt's hidden rows ([prompt][n_embd], what the MTP block drafts
  // from): only entries that kept them serve it, and the restored rows are copied there too.
  size_t begin(std::span<const TokenId> prompt, SequenceCache& cache, Recording& rec, std::span<float> hidden = {});
  // Where the chunk that starts at `done` must end at the latest (> done): the next checkpoint position of a
  // recording sequence with recurrent layers, else the prompt's end.
  size_t chunk_end(const Recording& rec, size_t done, size_t prompt_size) const;
  // After a step that prefilled part of `prompt` into `cache`: keeps a checkpoint at cache.n_past() when it is
  // one; once the whole prompt is in, stores the entry (with `hidden`, begin()'s rows, when speculating) and
  // ends the recording.
  void prefilled(Recording& rec, std::span<const TokenId> prompt, const SequenceCache& cache,
                 std::span<const float> hidden = {});
  PromptCacheStats stats() const;

 private:
  struct Entry {
    std::vector<TokenId> tokens;
    std::vector<LayerCache> layers;  // K/V of every attention layer, positions [0, tokens.size()); monostate else
    std::vector<std::shared_ptr<const Checkpoint>> checkpoints;
    std::vector<float> hidden;  // [tokens][n_embd] when a speculating sequence stored it, else empty
    uint64_t kv_bytes = 0;      // K/V rows and hidden rows
  };
  using Entries = std::list<Entry>;  // most recently used first

  bool is_checkpoint(size_t n, size_t prompt_size) const;
  std::shared_ptr<const Checkpoint> snapshot(const SequenceCache& cache) const;
  bool room_for_checkpoint(const Recording& rec, const SequenceCache& cache);
  static void restore(const Entry& e, const Checkpoint* cp, size_t n, SequenceCache& cache);
  size_t resumable(const Entry& e, std::span<const TokenId> prompt, const Recording& rec, const Checkpoint** cp) const;
  void insert(Entry entry);
  uint64_t unheld_bytes(const Entry& e) const;  // what holding e adds
  void hold(const Entry& e);
  void drop(Entries::iterator it);

  PromptCacheOptions options_;
  mutable std::mutex mu_;
  Entries entries_;
  std::unordered_map<const Checkpoint*, int32_t> held_;  // checkpoint → entries holding it
  uint64_t held_checkpoint_bytes_ = 0;
  // Bytes of every checkpoint alive, held or in a prefill's recording (each checkpoint's deleter subtracts).
  std::shared_ptr<std::atomic<uint64_t>> live_checkpoint_bytes_ = std::make_shared<std::atomic<uint64_t>>(0);
  PromptCacheStats stats_;
};

}  // namespace essaim::serve
