#include "serve/scheduler.h"

#include <algorithm>
#include <chrono>
#include <limits>

namespace essaim::serve {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kRateWindowSeconds = 10.0;

// Rows per step and sequences per step: powers of two up to the largest batches a backbone runs.
std::vector<double> pow2_bounds(double max) {
  std::vector<double> b;
  for (double v = 1; v <= max; v *= 2) b.push_back(v);
  return b;
}

// Every row of `logits` (n_vocab wide) gets -inf at `ids`: those tokens cannot be sampled.
void forbid_tokens(std::span<float> logits, size_t n_vocab, std::span<const TokenId> ids) {
  for (size_t row = 0; row + n_vocab <= logits.size(); row += n_vocab)
    for (TokenId id : ids) logits[row + size_t(id)] = -std::numeric_limits<float>::infinity();
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
const Clock::time_point kProcessStart = Clock::now();

}  // namespace

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::NONE: return "none";
    case FinishReason::STOP: return "stop";
    case FinishReason::LENGTH: return "length";
    case FinishReason::CANCELLED: return "cancelled";
    case FinishReason::ERROR: return "error";
  }
  return "?";
}

struct Scheduler::Sequence {
  Scheduler* owner = nullptr;
  std::shared_ptr<SequenceHandle> handle;
  SequenceRequest request;
  SequenceSink sink;
  SequenceCache plain_cache;
  std::unique_ptr<SpecSequence> spec;  // its caches and drafts when speculating
  std::vector<float> prompt_hidden;    // [prompt][E] for the MTP block (speculating only)
  PromptCache::Recording recording;    // its prefill's checkpoints, for the prompt cache
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<GrammarMatcher> grammar;  // structured output: what the next token may be
  std::vector<float> logits;  // (n_vocab), the row the next token is sampled from
  size_t prompt_done = 0;     // prompt tokens already in the cache
  TokenId next = -1;          // the last sampled token, fed back at the next step
  int32_t n_generated = 0;
  bool done = false;

  bool decoding() const { return prompt_done == request.prompt.size(); }
  SequenceCache& cache() { return spec ? spec->cache() : plain_cache; }
  void finish(FinishReason reason, std::string error = {}, std::vector<TokenId> tokens = {}) {
    SequenceEvent e{.tokens = std::move(tokens), .done = true, .reason = reason, .error = std::move(error),
                    .n_prompt = int32_t(request.prompt.size()), .n_generated = n_generated, .handle = handle.get()};
    done = true;
    {
      // Counted out before the caller hears of the end, so a caller that resubmits at once finds the room.
      std::lock_guard<std::mutex> lock(owner->mu_);
      --owner->in_system_;
    }
    if (sink) sink(e);
    sink = nullptr;  // the sink may hold the HTTP session alive: release it as soon as the sequence is done
  }
};

Scheduler::Scheduler(const Model& model, ExpertExecutor* experts, ThreadPool* pool, SchedulerOptions options)
    : model_(model), experts_(experts), pool_(pool), options_(options), prompt_cache_(options.prompt_cache) {
  options_.parallel = std::max(1, options_.parallel);
  options_.batch_tokens = std::max(1, options_.batch_tokens);
  options_.queue_capacity = std::max(0, options_.queue_capacity);
  n_ctx_ = model_.new_cache(options_.cache).n_ctx();
  stats_.parallel = options_.parallel;
  stats_.queue_capacity = options_.queue_capacity;
  stats_.batch_rows = net::Histogram(pow2_bounds(4096));
  stats_.batch_sequences = net::Histogram(pow2_bounds(256));
  thread_ = std::thread([this] { run(); });
}

Scheduler::~Scheduler() { stop(); }

void Scheduler::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  std::lock_guard<std::mutex> lock(stop_mu_);
  if (thread_.joinable()) thread_.join();
}

SubmitResult Scheduler::submit(SequenceRequest request, SequenceSink sink) {
  if (request.prompt.empty()) return {nullptr, SubmitError::BAD_REQUEST, "the prompt has no tokens"};
  if (int64_t(request.prompt.size()) >= n_ctx_) {
    return {nullptr, SubmitError::BAD_REQUEST,
            "the prompt has " + std::to_string(request.prompt.size()) + " tokens; the context holds " +
                std::to_string(n_ctx_) + " (prompt + generated)"};
  }
  for (TokenId id : request.prompt) {
    if (id < 0 || id >= model_.info().n_vocab) return {nullptr, SubmitError::BAD_REQUEST, "token id out of range"};
  }
  for (TokenId id : request.eog) {
    if (id < 0 || id >= model_.info().n_vocab) return {nullptr, SubmitError::BAD_REQUEST, "eog id out of range"};
  }
  if (request.max_tokens < 0) return {nullptr, SubmitError::BAD_REQUEST, "max_tokens is negative"};
  if (request.grammar && (!request.trie || request.trie->n_vocab() != model_.info().n_vocab))
    return {nullptr, SubmitError::BAD_REQUEST, "a grammar needs the model's token trie"};
  std::sort(request.eog.begin(), request.eog.end());
  auto seq = std::make_unique<Sequence>();
  seq->owner = this;
  seq->request = std::move(request);
  seq->sink = std::move(sink);
  std::shared_ptr<SequenceHandle> handle;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return {nullptr, SubmitError::STOPPED, "the server is shutting down"};
    // Counted from submit to the final event, so the bound holds whatever the step thread has admitted yet.
    if (in_system_ >= int64_t(options_.parallel) + options_.queue_capacity) {
      return {nullptr, SubmitError::QUEUE_FULL,
              "the server is full (" + std::to_string(options_.parallel) + " in flight, " +
                  std::to_string(options_.queue_capacity) + " waiting); retry later"};
    }
    ++in_system_;
    handle = std::make_shared<SequenceHandle>(next_id_++);
    seq->handle = handle;
    queue_.push_back(std::move(seq));
    stats_.queued = int32_t(queue_.size());
  }
  wake_.notify_all();
  return {std::move(handle), SubmitError::NONE, {}};
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  SchedulerStats s = stats_;
  const double now = seconds_since(kProcessStart);
  uint64_t tokens = 0;
  for (const auto& [t, n] : rate_window_)
    if (now - t <= kRateWindowSeconds) tokens += n;
  s.tokens_per_second = double(tokens) / kRateWindowSeconds;
  s.prompt_cache = prompt_cache_.stats();
  return s;
}

void Scheduler::run() {
  std::vector<std::unique_ptr<Sequence>> active;
  for (;;) {
    std::vector<std::unique_ptr<Sequence>> admitted;
    Clock::time_point t = Clock::now();
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stopping_ || !active.empty() || !queue_.empty(); });
      stats_.idle_seconds += seconds_since(t);
      t = Clock::now();
      if (stopping_) break;
      while (!queue_.empty() && int32_t(active.size() + admitted.size()) < options_.parallel) {
        admitted.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      stats_.queued = int32_t(queue_.size());
    }
    // Caches are allocated here, on the step thread, outside the lock: a submit never waits for them.
    for (std::unique_ptr<Sequence>& s : admitted) {
      if (s->handle->cancelled()) {
        const FinishReason r = s->handle->leave_reason();
        s->finish(r);
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.finished[size_t(r)];
        continue;
      }
      if (s->request.max_tokens == 0) {
        s->finish(FinishReason::LENGTH);
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.finished[size_t(FinishReason::LENGTH)];
        continue;
      }
      if (speculating() && !s->request.may_force) {
        s->spec = std::make_unique<SpecSequence>(model_, options_.cache, options_.spec);
        s->prompt_hidden.resize(s->request.prompt.size() * size_t(model_.info().n_embd));
        s->prompt_done = prompt_cache_.begin(s->request.prompt, s->spec->cache(), s->recording, s->prompt_hidden);
      } else {
        s->plain_cache = model_.new_cache(options_.cache);
        s->prompt_done = prompt_cache_.begin(s->request.prompt, s->plain_cache, s->recording);
      }
      s->sampler = std::make_unique<Sampler>(s->request.sampling);
      if (s->request.grammar) s->grammar = std::make_unique<GrammarMatcher>(s->request.grammar);
      for (TokenId id : s->request.prompt) s->sampler->accept(id);  // the penalty window sees the prompt, as in `essaim run`
      s->logits.assign(size_t(model_.info().n_vocab), 0.0f);
      active.push_back(std::move(s));
    }
    // Cancelled sequences leave before the step: their slot goes to the queue at the next admission.
    for (std::unique_ptr<Sequence>& s : active) {
      if (s->handle->cancelled()) {
        const FinishReason r = s->handle->leave_reason();
        s->finish(r);
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.finished[size_t(r)];
        s.reset();
      }
    }
    std::erase(active, nullptr);
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.active = int32_t(active.size());
      stats_.admit_seconds += seconds_since(t);
    }
    if (!active.empty()) step(active);
    std::erase(active, nullptr);
    std::lock_guard<std::mutex> lock(mu_);
    stats_.active = int32_t(active.size());
  }
  for (std::unique_ptr<Sequence>& s : active) s->finish(FinishReason::CANCELLED, "the server is shutting down");
  std::deque<std::unique_ptr<Sequence>> queued;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queued.swap(queue_);
    stats_.queued = 0;
    stats_.active = 0;
  }
  for (std::unique_ptr<Sequence>& s : queued) s->finish(FinishReason::CANCELLED, "the server is shutting down");
}

// What a step's sequences gave, counted into the stats once the step is over.
struct Scheduler::StepTally {
  uint64_t generated = 0;
  uint64_t finished[5] = {};
  SpecStats spec;  // this step's verifications
};

// One forward_batch over every active sequence: decode rows first (each sequence waiting on one token gets
// its row; a speculating one its K+1 verification rows, drafted just before), then prompt chunks in admission order within what is left of the token budget. A step always
// makes progress: when decode rows fill the budget, prompts wait; when there are none, the first prompt
// gets at least one row.
void Scheduler::step(std::vector<std::unique_ptr<Sequence>>& active) {
  struct Row {
    Sequence* seq;
    size_t n_prompt;  // prompt tokens in this item (0 for a decode row)
    bool wants_logits;
  };
  std::vector<BatchItem> items;
  std::vector<Row> rows;
  int64_t budget = options_.batch_tokens;
  const Clock::time_point t_forward = Clock::now();
  if (Status d = draft(active); !d) return;
  for (std::unique_ptr<Sequence>& s : active) {
    if (!s->decoding()) continue;
    if (s->spec)
      items.push_back(s->spec->verify_item());  // [next | drafts]: K+1 rows
    else
      items.push_back({.tokens = std::span<const TokenId>(&s->next, 1), .cache = &s->cache(),
                       .logits_mode = LogitsMode::LAST, .logits = s->logits});
    rows.push_back({s.get(), 0, true});
    budget -= int64_t(items.back().tokens.size());
  }
  for (std::unique_ptr<Sequence>& s : active) {
    if (s->decoding()) continue;
    const size_t left = s->request.prompt.size() - s->prompt_done;
    size_t n = size_t(std::max<int64_t>(budget, 0));
    if (n == 0 && items.empty()) n = 1;
    n = std::min(n, left);
    n = std::min(n, prompt_cache_.chunk_end(s->recording, s->prompt_done, s->request.prompt.size()) - s->prompt_done);
    if (n == 0) continue;
    const bool last = n == left;
    const size_t E = size_t(model_.info().n_embd);
    items.push_back({.tokens = std::span<const TokenId>(s->request.prompt).subspan(s->prompt_done, n),
                     .cache = &s->cache(), .logits_mode = last ? LogitsMode::LAST : LogitsMode::NONE,
                     .logits = last ? std::span<float>(s->logits) : std::span<float>(),
                     .hidden = s->spec ? std::span(s->prompt_hidden).subspan(s->prompt_done * E, n * E)
                                       : std::span<float>()});
    rows.push_back({s.get(), n, last});
    budget -= int64_t(n);
  }
  if (items.empty()) return;
  int64_t n_rows = 0;
  for (const BatchItem& it : items) n_rows += int64_t(it.tokens.size());

  const Status status = model_.forward_batch({.items = items, .experts = experts_, .pool = pool_});
  const Clock::time_point t_emit = Clock::now();
  if (!status) {
    // Items before the failing one may have advanced, so no sequence of this step can continue.
    for (const Row& r : rows) r.seq->finish(FinishReason::ERROR, "generation failed: " + status.message());
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.steps;
    ++stats_.failed_steps;
    stats_.finished[size_t(FinishReason::ERROR)] += rows.size();
    for (std::unique_ptr<Sequence>& s : active)
      for (const Row& r : rows)
        if (s.get() == r.seq) s.reset();
    return;
  }

  uint64_t prompt_rows = 0;
  StepTally tally;
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    Sequence& s = *r.seq;
    if (r.wants_logits && s.request.ignore_eog)
      forbid_tokens(items[i].logits, size_t(model_.info().n_vocab), s.request.eog);
    s.prompt_done += r.n_prompt;
    prompt_rows += r.n_prompt;
    if (r.n_prompt > 0) prompt_cache_.prefilled(s.recording, s.request.prompt, s.cache(), s.prompt_hidden);
    if (r.wants_logits) take_tokens(s, tally);
  }
  for (std::unique_ptr<Sequence>& s : active)
    if (s->done) s.reset();  // finished this step

  record_step(tally, {.prompt_rows = prompt_rows, .rows = n_rows, .items = items.size(), .forward_start = t_forward,
                      .emit_start = t_emit});
}

// A finished step's counts in the stats, and its generated tokens in the rate window.
void Scheduler::record_step(const StepTally& tally, const StepShape& shape) {
  const Clock::time_point t_forward = shape.forward_start, t_emit = shape.emit_start;
  const uint64_t prompt_rows = shape.prompt_rows;
  const int64_t n_rows = shape.rows;
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.steps;
  stats_.forward_seconds += std::chrono::duration<double>(t_emit - t_forward).count();
  stats_.emit_seconds += seconds_since(t_emit);
  stats_.prompt_tokens += prompt_rows;
  stats_.generated_tokens += tally.generated;
  for (size_t i = 0; i < 5; ++i) stats_.finished[i] += tally.finished[i];
  stats_.spec_rounds += uint64_t(tally.spec.rounds);
  stats_.spec_drafted += uint64_t(tally.spec.drafted);
  stats_.spec_accepted += uint64_t(tally.spec.accepted);
  stats_.spec_tokens += uint64_t(tally.spec.tokens);
  stats_.batch_rows.observe(double(n_rows));
  stats_.batch_sequences.observe(double(shape.items));
  const double now = seconds_since(kProcessStart);
  rate_window_.emplace_back(now, tally.generated);
  while (!rate_window_.empty() && now - rate_window_.front().first > kRateWindowSeconds) rate_window_.pop_front();
}

// The drafts of every decoding, speculating sequence, all through the MTP block together. A failure (the
// executor's) ends those sequences: their MTP caches may have advanced.
Status Scheduler::draft(std::vector<std::unique_ptr<Sequence>>& active) {
  std::vector<SpecSequence*> drafting;
  for (std::unique_ptr<Sequence>& s : active)
    if (s->spec && s->decoding()) drafting.push_back(s->spec.get());
  if (drafting.empty()) return Status::ok();
  const Status d = spec_draft(model_, drafting, options_.draft_experts ? options_.draft_experts : experts_, pool_);
  if (d) return d;
  uint64_t failed = 0;
  for (std::unique_ptr<Sequence>& s : active)
    if (s->spec && s->decoding()) {
      s->finish(FinishReason::ERROR, "drafting failed: " + d.message());
      s.reset();
      ++failed;
    }
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.steps;
  ++stats_.failed_steps;
  stats_.finished[size_t(FinishReason::ERROR)] += failed;
  return d;
}

// Structured output: the chain over the tokens the sequence's grammar takes next; sets `error` when none is
// left, which only a grammar past one of its limits gives (the sequence then ends with it).
TokenId Scheduler::sample_constrained(Sequence& s, std::span<const float> logits, std::string& error) {
  const TokenMask& allowed = s.grammar->allowed(*s.request.trie, s.request.eog);
  if (allowed.count() == 0) {
    error = s.grammar->error().empty() ? "no token can continue the grammar" : s.grammar->error();
    return s.request.eog.empty() ? 0 : s.request.eog.front();
  }
  return s.sampler->sample(logits, allowed.bits);
}

// Plain: one token sampled from the row's logits. Speculating: the first token after the prompt is sampled
// the same way (and starts the drafting); afterwards the verification's tokens, sampled in order by the
// same sampler (SpecSequence::accept). Each token is then taken exactly as plain decoding takes it: an EOG
// ends the sequence, max_tokens or a full context ends it after the token.
void Scheduler::take_tokens(Sequence& s, StepTally& tally) {
  std::string grammar_error;
  const auto sample = [&](std::span<const float> logits) {
    TokenId id = -1;
    if (!s.handle->take_forced(id)) {  // forced: never while speculating
      if (s.grammar) id = sample_constrained(s, logits, grammar_error);
      else id = s.sampler->sample(logits);
    }
    s.sampler->accept(id);
    if (s.grammar && grammar_error.empty() && !std::binary_search(s.request.eog.begin(), s.request.eog.end(), id) &&
        !s.grammar->accept_bytes(s.request.trie->piece(id)))
      grammar_error = s.grammar->error().empty() ? "token " + std::to_string(id) + " does not follow the grammar" : s.grammar->error();
    return id;
  };
  std::vector<TokenId> got;
  const bool verified = s.spec && s.next >= 0;
  if (verified) {
    const SpecStats before = s.spec->stats();
    got = s.spec->accept(sample);
    const SpecStats& after = s.spec->stats();
    tally.spec.rounds += after.rounds - before.rounds, tally.spec.drafted += after.drafted - before.drafted;
    tally.spec.accepted += after.accepted - before.accepted, tally.spec.tokens += after.tokens - before.tokens;
  } else {
    got = {sample(s.logits)};
  }
  if (!grammar_error.empty()) {
    s.finish(FinishReason::ERROR, "structured output: " + grammar_error);
    ++tally.finished[size_t(FinishReason::ERROR)];
    return;
  }
  if (s.spec && !verified) s.spec->start(s.request.prompt, s.prompt_hidden, got[0]);
  std::vector<TokenId> emitted;
  const int32_t n_past_last = s.cache().n_past();  // the cache holds every token of `got` but the last
  for (size_t j = 0; j < got.size(); ++j) {
    const TokenId id = got[j];
    if (std::binary_search(s.request.eog.begin(), s.request.eog.end(), id)) {
      s.finish(FinishReason::STOP, {}, std::move(emitted));
      ++tally.finished[size_t(FinishReason::STOP)];
      return;
    }
    ++s.n_generated;
    ++tally.generated;
    emitted.push_back(id);
    const int32_t n_past = n_past_last - int32_t(got.size() - 1 - j);  // plain decoding's cache at this token
    if (s.n_generated >= s.request.max_tokens || n_past >= s.cache().n_ctx()) {
      s.finish(FinishReason::LENGTH, {}, std::move(emitted));
      ++tally.finished[size_t(FinishReason::LENGTH)];
      return;
    }
  }
  s.next = got.back();
  if (s.sink) {
    s.sink(SequenceEvent{.tokens = std::move(emitted), .done = false, .reason = FinishReason::NONE, .error = {},
                         .n_prompt = int32_t(s.request.prompt.size()), .n_generated = s.n_generated,
                         .handle = s.handle.get()});
  }
}

}  // namespace essaim::serve
