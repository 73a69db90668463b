// `essaim run --draft-max K`: the generation loop of speculative decoding with the model's MTP block
// (model/speculative.h). The stream equals plain decoding's; the caller prints it through on_token.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/status.h"
#include "model/model.h"
#include "model/speculative.h"
#include "text/sampler.h"

namespace essaim::cli {

struct SpecRun {
  const Model* model = nullptr;
  ExpertExecutor* experts = nullptr;
  ExpertExecutor* draft_experts = nullptr;  // the MTP block's (nullptr: `experts`)
  ThreadPool* pool = nullptr;
  CacheOptions cache;
  SpecOptions spec;
  std::span<const int32_t> prompt;
  size_t chunk = 0;  // prompt chunk size
  // Called with each token of the stream in order; false stops (end of generation, limit reached).
  std::function<bool(int32_t)> on_token;
};

struct SpecRunResult {
  SpecStats stats;
  double prompt_s = 0;
  double generation_s = 0;
  int32_t n_ctx = 0;
};

// The prompt (every row's hidden state kept for the MTP block), then rounds of draft + one verification
// until on_token says stop or the context is full. `sampler` is used exactly as plain decoding uses it.
Result<SpecRunResult> run_speculative(const SpecRun& run, Sampler& sampler);

}  // namespace essaim::cli
