#include "cli/cmd_run_spec.h"

#include <chrono>

namespace essaim::cli {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The prompt in chunks, each keeping every row's hidden state; the last chunk's last logits in `logits`.
Status prefill(const SpecRun& r, SpecSequence& seq, std::vector<float>& hidden, std::vector<float>& logits) {
  const size_t E = size_t(r.model->info().n_embd), P = r.prompt.size();
  const size_t chunk = r.chunk > 0 ? r.chunk : P;
  hidden.resize(P * E);
  for (size_t b = 0; b < P; b += chunk) {
    const size_t n = std::min(chunk, P - b);
    const bool last = b + n == P;
    const BatchItem item{.tokens = r.prompt.subspan(b, n), .cache = &seq.cache(),
                         .logits_mode = last ? LogitsMode::LAST : LogitsMode::NONE,
                         .logits = last ? std::span<float>(logits) : std::span<float>(),
                         .hidden = std::span(hidden).subspan(b * E, n * E)};
    ESSAIM_RETURN_IF_ERROR(r.model->forward_batch({.items = std::span(&item, 1), .experts = r.experts, .pool = r.pool}));
  }
  return Status::ok();
}

}  // namespace

Result<SpecRunResult> run_speculative(const SpecRun& r, Sampler& sampler) {
  if (!r.model->has_nextn())
    return Status::error("--draft-max needs a model with an MTP (nextn) block; " + r.model->info().arch +
                         " file has none (nextn_predict_layers = 0)");
  SpecRunResult out;
  SpecSequence seq(*r.model, r.cache, r.spec);
  out.n_ctx = seq.cache().n_ctx();
  std::vector<float> hidden, logits(size_t(r.model->info().n_vocab));
  const auto t0 = Clock::now();
  ESSAIM_RETURN_IF_ERROR(prefill(r, seq, hidden, logits));
  out.prompt_s = seconds_since(t0);

  const auto t1 = Clock::now();
  const auto sample = [&](std::span<const float> l) {
    const int32_t id = sampler.sample(l);
    sampler.accept(id);
    return id;
  };
  const int32_t first = sample(logits);
  bool more = r.on_token(first);
  seq.start(r.prompt, hidden, first);
  while (more && seq.cache().n_past() < seq.cache().n_ctx()) {
    SpecSequence* one[] = {&seq};
    ESSAIM_RETURN_IF_ERROR(spec_draft(*r.model, one, r.draft_experts ? r.draft_experts : r.experts, r.pool));
    const BatchItem item = seq.verify_item();
    ESSAIM_RETURN_IF_ERROR(r.model->forward_batch({.items = std::span(&item, 1), .experts = r.experts, .pool = r.pool}));
    for (int32_t id : seq.accept(sample)) {
      more = r.on_token(id);
      if (!more) break;
    }
  }
  out.generation_s = seconds_since(t1);
  out.stats = seq.stats();
  return out;
}

}  // namespace essaim::cli
