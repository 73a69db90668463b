#include "serve_workload.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

namespace essaim::bench {
namespace {

using json = nlohmann::json;

// Words of the corpus from `first` on until the text has `tokens` tokens (a word at a time: the count is
// exact only where a word ends, so it may overshoot by a word's tokens).
std::string text_of_tokens(const WorkloadOptions& o, size_t first, size_t tokens) {
  std::string text;
  for (size_t i = 0; !o.corpus.empty() && i < 100000; ++i) {
    if (i) text += ' ';
    text += o.corpus[(first + i) % o.corpus.size()];
    if (o.count_tokens(text) >= tokens) break;
  }
  return text;
}

}  // namespace

std::vector<std::string> corpus_words(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

Workload make_workload(const WorkloadOptions& o) {
  std::mt19937 rng(o.seed);
  std::exponential_distribution<double> gap(o.rate_per_s > 0 ? o.rate_per_s : 1.0);
  std::uniform_int_distribution<int> prompt_tokens(o.prompt_tokens_min, o.prompt_tokens_max);
  std::uniform_int_distribution<int> output(o.output_min, o.output_max);
  std::uniform_int_distribution<size_t> offset(0, std::max<size_t>(o.corpus.size(), 1) - 1);
  const std::string system = text_of_tokens(o, 0, size_t(o.system_tokens));
  Workload w;
  double t = 0;
  for (int i = 0; i < o.requests; ++i) {
    const size_t first = offset(rng);
    const std::string user = text_of_tokens(o, first, size_t(prompt_tokens(rng)));
    const int max_tokens = output(rng);
    json body = {{"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}, {"stream", true},
                 {"stream_options", {{"include_usage", true}}}, {"cache_prompt", o.cache_prompt}};
    if (o.chat)
      body["messages"] = json::array({{{"role", "system"}, {"content", system}}, {{"role", "user"}, {"content", user}}});
    else
      body["prompt"] = system + "\n\n" + user;
    w.requests.push_back({.arrival_s = t, .body = body.dump()});
    w.max_tokens.push_back(max_tokens);
    t += o.rate_per_s > 0 ? gap(rng) : 0.0;
  }
  return w;
}

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(q * double(v.size())))];
}

RunFigures summarize(std::span<const LoadResult> results) {
  RunFigures f;
  f.requests = int(results.size());
  std::vector<double> ttft, itl;
  double first_sent = 1e300, last_done = 0, prompt_tokens = 0;
  size_t events = 0;
  for (const LoadResult& r : results) {
    if (!r.ok) {
      if (f.failed++ == 0) f.first_error = r.error;
      continue;
    }
    first_sent = std::min(first_sent, r.sent_s);
    last_done = std::max(last_done, r.done_s);
    f.generated += std::max<int64_t>(r.completion_tokens, 0);
    prompt_tokens += double(std::max<int64_t>(r.prompt_tokens, 0));
    ttft.push_back(1e3 * (r.first_s - r.sent_s));
    for (size_t i = 1; i < r.chunk_s.size(); ++i) itl.push_back(1e3 * (r.chunk_s[i] - r.chunk_s[i - 1]));
    events += r.chunk_s.size();
  }
  const int ok = f.requests - f.failed;
  if (ok == 0) return f;
  f.wall_s = last_done - first_sent;
  f.tokens_per_s = f.wall_s > 0 ? double(f.generated) / f.wall_s : 0;
  f.prompt_tokens_mean = prompt_tokens / ok;
  f.ttft_ms_p50 = quantile(ttft, 0.5), f.ttft_ms_p99 = quantile(ttft, 0.99);
  f.itl_ms_p50 = quantile(itl, 0.5), f.itl_ms_p99 = quantile(itl, 0.99);
  f.tokens_per_event = events ? double(f.generated) / double(events) : 0;
  return f;
}

}  // namespace essaim::bench
