// The serving benchmark's workload and its figures: streaming requests with Poisson arrivals, a shared
// system prompt, prompt and output lengths drawn from ranges (text cut from a corpus, so every server
// tokenizes it itself), and the summary of a run — generated tok/s, time to first token and inter-token
// latency (p50, p99) — computed the same way whichever server answered.
//
//   Workload w = make_workload({.corpus = words, .requests = 12, .rate_per_s = 4, .seed = 1});
//   std::vector<LoadResult> got = run_streaming_load({.port = p, .max_in_flight = 4}, w.requests);
//   RunFigures f = summarize(got);  // f.tokens_per_s, f.ttft_ms_p50, f.itl_ms_p99, ...
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "sse_load.h"

namespace essaim::bench {

struct WorkloadOptions {
  std::span<const std::string> corpus;  // words; the system prompt is cut from its start
  // Tokens of a text in the served model's vocabulary (both servers read the same GGUF), so that lengths
  // are in tokens whatever the vocabulary; a text is cut at the first word that reaches its length.
  std::function<size_t(const std::string&)> count_tokens;
  bool chat = false;                    // /v1/chat/completions bodies (system + user messages) instead of prompts
  int requests = 8;
  double rate_per_s = 1;                // Poisson arrivals (exponential gaps, mean 1/rate)
  int system_tokens = 32;
  int prompt_tokens_min = 40, prompt_tokens_max = 120;  // the user part, uniform
  int output_min = 32, output_max = 96;               // max_tokens, uniform (ignore_eos: exactly this many)
  bool cache_prompt = false;            // llama-server's prefix reuse between a slot's requests (sent as cache_prompt)
  uint32_t seed = 1;
};

struct Workload {
  std::vector<LoadRequest> requests;
  std::vector<int> max_tokens;  // [request]
};

// Greedy (temperature 0), ignore_eos, stream with include_usage.
Workload make_workload(const WorkloadOptions& o);
// The words of a text file, in order.
std::vector<std::string> corpus_words(const std::string& path);

struct RunFigures {
  int requests = 0;
  int failed = 0;
  int64_t generated = 0;       // completion tokens (usage)
  double prompt_tokens_mean = 0;
  double wall_s = 0;           // first request sent .. last stream ended
  double tokens_per_s = 0;     // generated / wall_s
  double ttft_ms_p50 = 0, ttft_ms_p99 = 0;
  double itl_ms_p50 = 0, itl_ms_p99 = 0;  // gaps between text events of one stream
  double tokens_per_event = 0;            // generated / text events (1 when every token is its own event)
  std::string first_error;
};

RunFigures summarize(std::span<const LoadResult> results);
// The value at quantile q (0..1) of v: the element at floor(q·n), clamped (a measured value, no interpolation).
double quantile(std::vector<double> v, double q);

}  // namespace essaim::bench
