// Speculative decoding with the model's own MTP (nextn) block, the stream exactly that of plain decoding
// (docs/speculative.md).
//
//   SpecSequence seq(model, {.kv_type = KvType::F16}, {.draft_max = 3});
//   // prompt: one forward with every row's hidden state (BatchItem::hidden of prompt.size() rows)
//   model.forward_batch({.items = {{.tokens = prompt, .cache = &seq.cache(), .logits = last, .hidden = h}}, ...});
//   TokenId t = sample(last);
//   seq.start(prompt, h, t);
//   while (...) {
//     SpecSequence* one[] = {&seq};
//     ESSAIM_RETURN_IF_ERROR(spec_draft(model, one, &experts, &pool));   // the MTP block, chained
//     BatchItem item = seq.verify_item();                                // [pending | drafts]: K+1 rows
//     ESSAIM_RETURN_IF_ERROR(model.forward_batch({.items = {item}, ...}));
//     std::vector<TokenId> got = seq.accept(sample);                     // 1..K+1 tokens of the stream
//   }
//
// A round drafts K tokens d_1..d_K: the MTP block at the positions the main stack verified last round (its
// true hidden states and tokens; the last of them predicts d_1), then K−1 more positions, each fed the
// block's own normed output and the previous draft. One forward of the main stack over [t | d_1..d_K]
// (one executor call per layer for all K+1 rows) gives the logits of every position; `sample` is called on
// them in order, exactly as plain decoding would call it, until its token differs from the draft there:
// the drafts before that are accepted and the sampled token ends the round. Because a row's logits never
// depend on the rows after it (invariant 2), each sampled token is the one plain decoding samples, and
// `sample` sees the same calls in the same order (a seeded sampler's generator advances identically). The
// main cache is then cut back to the accepted prefix (KV truncated, recurrent states restored from the
// per-row states the verification kept): bit-identical to plain decoding's cache. The MTP cache drops the
// entries made from drafts; the accepted positions are fed to it at the start of the next round.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "model/model.h"

namespace essaim {

struct SpecOptions {
  int32_t draft_max = 3;  // K at most (llama.cpp's --draft-max)
  int32_t draft_min = 0;  // K at least while adapting (--draft-min)
  // Adapt K per sequence from its recent rounds: one more after a round that accepted every draft, one
  // fewer after two rounds in a row that accepted none; otherwise K stays. Off: K = draft_max every round.
  bool adaptive = false;
};

struct SpecStats {
  int64_t rounds = 0;    // verifications (main-stack forwards)
  int64_t drafted = 0;   // draft tokens proposed
  int64_t accepted = 0;  // of which accepted
  int64_t tokens = 0;    // tokens the rounds gave (accepted + one per round)
};

class SpecSequence {
 public:
  SpecSequence(const Model& model, const CacheOptions& cache, const SpecOptions& options);

  SequenceCache& cache() { return cache_; }              // the main stack's
  SequenceCache& nextn_cache() { return nextn_cache_; }  // the MTP block's
  const SpecStats& stats() const { return stats_; }
  int32_t draft_count() const { return k_; }  // K of the next round (0 while it cannot draft)

  // After the prompt's forward on cache(): its tokens, every row's hidden state [T][E], and the token
  // sampled from its last logits (the first of the stream, not yet fed to the model).
  void start(std::span<const int32_t> prompt, std::span<const float> prompt_hidden, int32_t first);
  // The rows this round verifies, [pending | drafts], with all logits, hidden states and per-row states
  // kept. Valid until accept().
  BatchItem verify_item();
  // After verify_item()'s forward: `sample` on each row's logits in order while it agrees with the drafts.
  // Returns the tokens of the stream this round gave (the last one pending for the next round).
  std::vector<int32_t> accept(const std::function<int32_t(std::span<const float>)>& sample);

 private:
  friend Status spec_draft(const Model& model, std::span<SpecSequence* const> seqs, ExpertExecutor* experts,
                           ThreadPool* pool);
  const Model& model_;
  SpecOptions options_;
  SequenceCache cache_, nextn_cache_;
  int32_t k_ = 0;                      // drafts of the next round
  int32_t empty_rounds_ = 0;           // consecutive rounds that accepted no draft (adaptive K)
  int32_t pending_ = -1;               // the last token of the stream, not yet fed to the main stack
  std::vector<float> catch_hidden_;    // [n][E] main hidden states of positions the MTP cache lacks
  std::vector<int32_t> catch_tokens_;  // [n] the tokens one position later
  std::vector<int32_t> drafts_;        // [K] this round's
  std::vector<int32_t> rows_;          // [K+1] pending | drafts
  std::vector<float> logits_, hidden_; // [K+1][V], [K+1][E] of the verification
  SpecStats stats_;
};

// This round's drafts of every sequence whose draft_count() > 0 (all of them through the MTP block together:
// one executor call for the catch-up rows, then one per further draft). A sequence with room for fewer
// positions drafts fewer.
Status spec_draft(const Model& model, std::span<SpecSequence* const> seqs, ExpertExecutor* experts,
                  ThreadPool* pool);

}  // namespace essaim
