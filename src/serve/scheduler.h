// Continuous batching over many sequences: up to `parallel` sequences in flight, each with its own
// SequenceCache and Sampler. Every step gathers the rows of all active sequences — one decode row each, and
// prompt chunks within the step's token budget — into ONE Model::forward_batch call, so an architecture
// with a batched forward makes one expert-dispatch request per worker per MoE layer for the whole batch.
// New sequences join at the next step; finished or cancelled ones leave at the next step. Token ids only:
// text, stop strings and HTTP live above (serve/openai_api.h).
//
//   Scheduler sched(*model, executor, &pool, {.parallel = 4, .batch_tokens = 512, .queue_capacity = 64});
//   auto h = sched.submit({.prompt = ids, .max_tokens = 32, .sampling = {.temperature = 0}},
//                         [](const SequenceEvent& e) { /* on the scheduler thread: e.tokens, e.done */ });
//   if (!h) ...  // queue full (SubmitError::QUEUE_FULL) or bad request
//   h.value()->cancel();  // client went away: the sequence leaves at the next step
//
// Exactness: a sequence's tokens depend only on its prompt, its sampler and the model — never on the other
// sequences of a step (batch-invariant kernels; prompt chunking does not change results).
// Speculative decoding (options.spec.draft_max > 0, a model with an MTP block; docs/speculative.md): each
// decoding sequence drafts its own K tokens (the MTP block runs for all of them together), its K+1 rows join
// the step's one forward_batch, and it emits the tokens its verification accepts — exactly its plain stream.
// With spec.adaptive (as `essaim serve` sets it) K adapts per sequence from its last round.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "model/speculative.h"
#include "moe/executor.h"
#include "net/metrics_text.h"
#include "serve/prompt_cache.h"
#include "text/grammar.h"
#include "text/sampler.h"
#include "text/vocab.h"

namespace essaim::serve {

enum class FinishReason : uint8_t {
  NONE,       // still generating
  STOP,       // an end-of-generation token (or the caller's stop: finish())
  LENGTH,     // max_tokens reached, or the context is full
  CANCELLED,  // cancel(): the client went away
  ERROR,      // the step failed (executor or model error); `error` says why
};
const char* finish_reason_name(FinishReason r);

struct SequenceRequest {
  std::vector<TokenId> prompt;  // not empty, shorter than the context
  int32_t max_tokens = 16;      // >= 0; 0 generates nothing
  SamplerParams sampling;
  std::vector<TokenId> eog;     // ids that end generation (sorted); the scheduler never emits them
  // The sink may force tokens (SequenceHandle::force, a reasoning budget): such a sequence decodes one token
  // per step even when the server speculates, so a forced token lands where plain decoding puts it.
  bool may_force = false;
  // Structured output (text/grammar.h): each token is sampled among those the grammar takes next (an EOG id
  // only once the grammar is complete), from the masked logits of the sequence's own row, so a constrained
  // sequence alone == in a batch. Speculating, each verified row is sampled under the mask of the tokens
  // accepted before it, so a draft the grammar refuses is never sampled, hence never accepted: the stream is
  // plain decoding's. A grammar that passes one of its limits ends the sequence with ERROR. `trie`: the
  // vocabulary's.
  std::shared_ptr<const Grammar> grammar;
  std::shared_ptr<const TokenTrie> trie;
  // llama-server's ignore_eos: the eog ids' logits are set to -inf before sampling, so none is ever sampled
  // and the sequence runs to max_tokens or a full context.
  bool ignore_eog = false;
};

// The caller's hold on a submitted sequence. Thread-safe.
class SequenceHandle {
 public:
  uint64_t id() const { return id_; }
  // The sequence leaves at the next step; its final event says CANCELLED. Idempotent; the first call of
  // cancel() / finish() decides the reason.
  void cancel() { leave(FinishReason::CANCELLED); }
  // The caller has what it wants (a stop string matched): the sequence leaves at the next step with STOP.
  void finish() { leave(FinishReason::STOP); }
  bool cancelled() const { return leave_.load() != uint8_t(FinishReason::NONE); }
  FinishReason leave_reason() const { return FinishReason(leave_.load()); }
  // Tokens the sequence emits next instead of sampled ones, one per step, in order: the server's own
  // continuation (closing a reasoning block at --reasoning-budget). The sampler still sees them.
  void force(const std::vector<TokenId>& tokens) {
    std::lock_guard<std::mutex> lock(forced_mu_);
    forced_.insert(forced_.end(), tokens.begin(), tokens.end());
  }
  bool take_forced(TokenId& id) {
    std::lock_guard<std::mutex> lock(forced_mu_);
    if (forced_.empty()) return false;
    id = forced_.front();
    forced_.pop_front();
    return true;
  }
  explicit SequenceHandle(uint64_t id) : id_(id) {}

 private:
  void leave(FinishReason r) {
    uint8_t none = uint8_t(FinishReason::NONE);
    leave_.compare_exchange_strong(none, uint8_t(r));
  }
  uint64_t id_;
  std::atomic<uint8_t> leave_{uint8_t(FinishReason::NONE)};
  std::mutex forced_mu_;
  std::deque<TokenId> forced_;
};

// One step's news for one sequence, delivered on the scheduler thread. `tokens` are this step's new ids (at
// most one without speculative decoding, up to K+1 with it; none on the final event of a sequence that stops
// on an EOG id straight away or fails).
struct SequenceEvent {
  std::vector<TokenId> tokens;
  bool done = false;
  FinishReason reason = FinishReason::NONE;
  std::string error;
  int32_t n_prompt = 0;
  int32_t n_generated = 0;  // tokens emitted so far, these included
  // The sequence's handle, for a sink that must act before its submitter holds it (force() right after the
  // token that asks for it, whichever thread submitted).
  SequenceHandle* handle = nullptr;
};
using SequenceSink = std::function<void(const SequenceEvent&)>;

struct SchedulerOptions {
  int32_t parallel = 4;         // sequences in flight at once
  int32_t batch_tokens = 512;   // most rows per step (decode rows first, then prompt chunks)
  int32_t queue_capacity = 64;  // sequences waiting for a slot; beyond parallel + this, submit() refuses
  CacheOptions cache;           // per sequence
  SpecOptions spec{.draft_max = 0};  // speculative decoding with the MTP block when draft_max > 0
  ExpertExecutor* draft_experts = nullptr;  // computes the MTP block's experts (nullptr: the step's executor)
  // Prompt prefixes kept for later prompts (serve/prompt_cache.h; off by default here, --cache-ram in serve).
  PromptCacheOptions prompt_cache;
};

enum class SubmitError : uint8_t { NONE, QUEUE_FULL, BAD_REQUEST, STOPPED };

struct SubmitResult {
  std::shared_ptr<SequenceHandle> handle;  // null on error
  SubmitError error = SubmitError::NONE;
  std::string message;
};

struct SchedulerStats {
  int32_t active = 0;
  int32_t queued = 0;
  int32_t parallel = 0;
  int32_t queue_capacity = 0;
  uint64_t steps = 0;
  uint64_t failed_steps = 0;
  uint64_t prompt_tokens = 0;     // prompt rows computed
  uint64_t generated_tokens = 0;  // tokens sampled and emitted
  uint64_t finished[5] = {};      // sequences by FinishReason (index = enum value)
  double tokens_per_second = 0;   // generated tokens over the last few seconds
  // Where the step thread's time went, in seconds: forward_batch (and drafting), sampling and the sinks'
  // work (the HTTP layer's detokenising and writing), admission and bookkeeping between steps, and waiting
  // for work with nothing in flight. Their sum is the thread's life: what is not forward is what the
  // scheduler costs around the engine.
  double forward_seconds = 0;
  double emit_seconds = 0;
  double admit_seconds = 0;
  double idle_seconds = 0;
  net::Histogram batch_rows;           // rows per step
  net::Histogram batch_sequences;      // sequences per step
  // Speculative decoding: sequence-steps that verified drafts, drafts proposed and accepted, and the tokens
  // those sequence-steps gave (accepted + one each).
  uint64_t spec_rounds = 0;
  uint64_t spec_drafted = 0;
  uint64_t spec_accepted = 0;
  uint64_t spec_tokens = 0;
  PromptCacheStats prompt_cache;
};

class Scheduler {
 public:
  Scheduler(const Model& model, ExpertExecutor* experts, ThreadPool* pool, SchedulerOptions options);
  ~Scheduler();  // stop()
  // Stops the step thread: every sequence in flight or queued gets a final CANCELLED event whose error says
  // "the server is shutting down", and submit() refuses from now on (STOPPED). Idempotent, thread-safe.
  void stop();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  SubmitResult submit(SequenceRequest request, SequenceSink sink);
  SchedulerStats stats() const;
  int32_t n_ctx() const { return n_ctx_; }  // the context each sequence gets

 private:
  struct Sequence;
  void run();
  void step(std::vector<std::unique_ptr<Sequence>>& active);
  // Samples the token(s) a row's forward gave its sequence and emits them; counts into the step's tallies.
  struct StepTally;
  struct StepShape {
    uint64_t prompt_rows = 0;  // prompt tokens computed
    int64_t rows = 0;          // token rows in the batch
    size_t items = 0;          // sequences in the batch
    std::chrono::steady_clock::time_point forward_start, emit_start;
  };
  void record_step(const StepTally& tally, const StepShape& shape);
  void take_tokens(Sequence& s, StepTally& tally);
  static TokenId sample_constrained(Sequence& s, std::span<const float> logits, std::string& error);
  Status draft(std::vector<std::unique_ptr<Sequence>>& active);
  bool speculating() const { return options_.spec.draft_max > 0 && model_.has_nextn(); }

  const Model& model_;
  ExpertExecutor* experts_;
  ThreadPool* pool_;
  SchedulerOptions options_;
  int32_t n_ctx_ = 0;
  PromptCache prompt_cache_;

  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Sequence>> queue_;
  bool stopping_ = false;
  uint64_t next_id_ = 1;
  int64_t in_system_ = 0;  // submitted and not yet finished (queued or in flight)
  SchedulerStats stats_;
  std::deque<std::pair<double, uint64_t>> rate_window_;  // (seconds since start, tokens) of recent steps
  std::mutex stop_mu_;  // one joiner of thread_
  std::thread thread_;
};

}  // namespace essaim::serve
