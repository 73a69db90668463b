#include "model/speculative.h"

#include <algorithm>
#include <cstring>

namespace essaim {
namespace {

int32_t argmax(std::span<const float> v) {  // the lowest id among equal maxima, as greedy sampling
  return int32_t(std::max_element(v.begin(), v.end()) - v.begin());
}

}  // namespace

SpecSequence::SpecSequence(const Model& model, const CacheOptions& cache, const SpecOptions& options)
    : model_(model),
      options_(options),
      cache_(model.new_cache(cache)),
      nextn_cache_(model.new_nextn_cache(cache)),
      k_(model.has_nextn() ? std::max(options.draft_max, 0) : 0) {}

void SpecSequence::start(std::span<const int32_t> prompt, std::span<const float> prompt_hidden, int32_t first) {
  const size_t E = size_t(model_.info().n_embd);
  ESSAIM_CHECK(!prompt.empty() && prompt_hidden.size() == prompt.size() * E);
  catch_hidden_.assign(prompt_hidden.begin(), prompt_hidden.end());
  catch_tokens_.assign(prompt.begin() + 1, prompt.end());
  catch_tokens_.push_back(first);
  pending_ = first;
  drafts_.clear();
}

Status spec_draft(const Model& model, std::span<SpecSequence* const> seqs, ExpertExecutor* experts,
                  ThreadPool* pool) {
  const size_t E = size_t(model.info().n_embd), V = size_t(model.info().n_vocab);
  std::vector<SpecSequence*> drafting;
  for (SpecSequence* s : seqs) {
    s->drafts_.clear();
    const int32_t room = s->cache_.n_ctx() - s->cache_.n_past() - 1;  // verification needs K + 1 positions
    const int32_t k = std::min(s->k_, room);
    if (k <= 0 || s->catch_tokens_.empty()) continue;
    s->drafts_.resize(size_t(k));
    drafting.push_back(s);
  }
  if (drafting.empty()) return Status::ok();
  std::vector<float> logits(drafting.size() * V), hidden(drafting.size() * E);  // [n][V], [n][E]
  std::vector<NextnItem> items;
  // Catch-up: the positions the main stack verified, the last of which drafts d_1.
  for (size_t i = 0; i < drafting.size(); ++i)
    items.push_back({.hidden = drafting[i]->catch_hidden_, .tokens = drafting[i]->catch_tokens_,
                     .cache = &drafting[i]->nextn_cache_, .logits = std::span(logits).subspan(i * V, V),
                     .hidden_out = std::span(hidden).subspan(i * E, E)});
  ESSAIM_RETURN_IF_ERROR(model.forward_nextn_batch({.items = items, .experts = experts, .pool = pool}));
  for (size_t i = 0; i < drafting.size(); ++i) {
    drafting[i]->catch_hidden_.clear();
    drafting[i]->catch_tokens_.clear();
    drafting[i]->drafts_[0] = argmax(std::span(logits).subspan(i * V, V));
  }
  // Chained: d_j from the block's own output at the previous position and d_{j-1}.
  for (size_t j = 1;; ++j) {
    items.clear();
    std::vector<size_t> which;
    for (size_t i = 0; i < drafting.size(); ++i) {
      if (j >= drafting[i]->drafts_.size()) continue;
      items.push_back({.hidden = std::span(hidden).subspan(i * E, E),
                       .tokens = std::span(drafting[i]->drafts_).subspan(j - 1, 1),
                       .cache = &drafting[i]->nextn_cache_, .logits = std::span(logits).subspan(i * V, V),
                       .hidden_out = std::span(hidden).subspan(i * E, E)});
      which.push_back(i);
    }
    if (items.empty()) break;
    // hidden_out overwrites the hidden an item reads: the block copies its inputs before it writes outputs.
    ESSAIM_RETURN_IF_ERROR(model.forward_nextn_batch({.items = items, .experts = experts, .pool = pool}));
    for (size_t i : which) drafting[i]->drafts_[j] = argmax(std::span(logits).subspan(i * V, V));
  }
  return Status::ok();
}

BatchItem SpecSequence::verify_item() {
  ESSAIM_CHECK(pending_ >= 0);
  const size_t n = drafts_.size() + 1, E = size_t(model_.info().n_embd), V = size_t(model_.info().n_vocab);
  rows_.assign(1, pending_);
  rows_.insert(rows_.end(), drafts_.begin(), drafts_.end());
  logits_.resize(n * V);
  hidden_.resize(n * E);
  return {.tokens = rows_, .cache = &cache_, .logits_mode = LogitsMode::ALL, .logits = logits_,
          .hidden = hidden_, .keep_row_states = !drafts_.empty()};
}

std::vector<int32_t> SpecSequence::accept(const std::function<int32_t(std::span<const float>)>& sample) {
  const size_t K = drafts_.size(), E = size_t(model_.info().n_embd), V = size_t(model_.info().n_vocab);
  const int32_t p = cache_.n_past() - int32_t(K + 1);  // the position of the pending token
  std::vector<int32_t> got;
  size_t a = 0;  // drafts accepted
  for (;; ++a) {
    got.push_back(sample(std::span<const float>(logits_).subspan(a * V, V)));
    if (a == K || got.back() != drafts_[a]) break;
  }
  // Main stack: keep positions p..p+a (pending and the accepted drafts).
  ESSAIM_CHECK(cache_.cut_back(p + int32_t(a) + 1).is_ok());
  // MTP block: drop its entries made from drafts (positions ≥ p); positions p..p+a are fed next round.
  if (K > 0) ESSAIM_CHECK(nextn_cache_.cut_back(std::min(nextn_cache_.n_past(), p)).is_ok());
  catch_hidden_.insert(catch_hidden_.end(), hidden_.begin(), hidden_.begin() + ptrdiff_t((a + 1) * E));
  catch_tokens_.insert(catch_tokens_.end(), got.begin(), got.end());
  pending_ = got.back();

  stats_.rounds += 1;
  stats_.drafted += int64_t(K);
  stats_.accepted += int64_t(a);
  stats_.tokens += int64_t(got.size());
  if (options_.adaptive && K > 0) {
    const int32_t lo = std::max(options_.draft_min, 1);
    empty_rounds_ = a == 0 ? empty_rounds_ + 1 : 0;
    if (a == K) {
      k_ = std::min(k_ + 1, options_.draft_max);
    } else if (empty_rounds_ == 2) {  // one empty round is common even for a good head; two in a row is not
      k_ = std::max(k_ - 1, lo);
      empty_rounds_ = 0;
    }
  }
  drafts_.clear();
  return got;
}

}  // namespace essaim
