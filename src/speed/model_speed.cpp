#include "speed/model_speed.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>

#include "core/huge_pages.h"

namespace essaim {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void summarise(SpeedResult& r, int tokens) {
  std::vector<double> ts;
  for (double s : r.seconds) ts.push_back(double(tokens) / s);
  double sum = 0;
  for (double v : ts) sum += v;
  r.avg_ts = sum / double(ts.size());
  double sq = 0;
  for (double v : ts) sq += (v - r.avg_ts) * (v - r.avg_ts);
  r.stddev_ts = ts.size() > 1 ? std::sqrt(sq / double(ts.size() - 1)) : 0.0;  // sample deviation, as llama-bench
  std::sort(ts.begin(), ts.end());
  r.median_ts = ts.size() % 2 ? ts[ts.size() / 2] : 0.5 * (ts[ts.size() / 2 - 1] + ts[ts.size() / 2]);
}

}  // namespace

void touch_model_pages(const Model& m) {
  volatile uint8_t sink = touch_pages(m.file().mapping().bytes(), 4096);
  (void)sink;
}

Result<std::vector<SpeedResult>> measure_model_speed(const Model& m, ExpertExecutor& experts, ThreadPool* pool,
                                                     const SpeedOptions& o) {
  if (o.reps < 1) return Status::error("bench needs at least one repetition");
  if (o.n_prompt < 0 || o.n_gen < 0) return Status::error("bench token counts must not be negative");
  const int32_t n_vocab = m.info().n_vocab;
  std::mt19937 rng(o.seed);
  std::uniform_int_distribution<int32_t> pick(0, n_vocab - 1);
  std::vector<float> logits(static_cast<size_t>(n_vocab));
  std::vector<SpeedResult> out;

  if (o.n_prompt > 0) {
    SpeedResult r;
    r.name = "pp" + std::to_string(o.n_prompt);
    r.n_prompt = o.n_prompt;
    std::vector<int32_t> prompt(size_t(o.n_prompt));
    for (int rep = 0; rep < o.reps + 1; ++rep) {  // repetition 0 warms up
      for (int32_t& t : prompt) t = pick(rng);
      SequenceCache cache = m.new_cache({.n_ctx = o.n_prompt + 1});
      const auto t0 = Clock::now();
      const Status s = m.forward({.tokens = prompt, .cache = &cache, .experts = &experts, .pool = pool,
                                  .logits_mode = LogitsMode::LAST, .logits = logits});
      ESSAIM_RETURN_IF_ERROR(s);
      if (rep > 0) r.seconds.push_back(since(t0));
    }
    summarise(r, o.n_prompt);
    out.push_back(std::move(r));
  }
  if (o.n_gen > 0) {
    SpeedResult r;
    r.name = "tg" + std::to_string(o.n_gen);
    r.n_gen = o.n_gen;
    for (int rep = 0; rep < o.reps + 1; ++rep) {  // repetition 0 warms up (a few tokens)
      const int n = rep == 0 ? std::min(o.n_gen, 4) : o.n_gen;
      SequenceCache cache = m.new_cache({.n_ctx = o.n_gen + 1});
      const auto t0 = Clock::now();
      for (int i = 0; i < n; ++i) {
        const int32_t token = pick(rng);
        const Status s = m.forward({.tokens = std::span<const int32_t>(&token, 1), .cache = &cache,
                                    .experts = &experts, .pool = pool, .logits_mode = LogitsMode::LAST,
                                    .logits = logits});
        ESSAIM_RETURN_IF_ERROR(s);
      }
      if (rep > 0) r.seconds.push_back(since(t0));
    }
    summarise(r, o.n_gen);
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace essaim
