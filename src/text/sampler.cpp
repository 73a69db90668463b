#include "text/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>

#include "core/status.h"

namespace essaim {
namespace {

// Decreasing logit, then increasing id: a total order, so results never depend on the sort algorithm
// (llama.cpp's partial sort leaves the order of equal logits unspecified).
bool before(const Candidate& a, const Candidate& b) { return a.logit != b.logit ? a.logit > b.logit : a.id < b.id; }

void sort_candidates(Candidates& c) {
  if (c.sorted) return;
  std::sort(c.data.begin(), c.data.end(), before);
  c.sorted = true;
}

float max_logit(const Candidates& c) {
  if (c.sorted) return c.data[0].logit;
  float m = -std::numeric_limits<float>::infinity();
  for (const Candidate& x : c.data) m = std::max(m, x.logit);
  return m;
}

// llama_sampler_softmax_impl: p_i = expf(l_i - max) / Σ, the sum accumulated in float in list order.
void softmax(Candidates& c) {
  const float max_l = max_logit(c);
  if (!std::isfinite(max_l)) {  // every logit -inf (or a NaN): no preference left, keep the list usable
    for (Candidate& x : c.data) x.p = 1.0f / float(c.data.size());
    return;
  }
  float sum = 0.0f;
  for (Candidate& x : c.data) {
    x.p = std::exp(x.logit - max_l);
    sum += x.p;
  }
  for (Candidate& x : c.data) x.p /= sum;
}

}  // namespace

Candidates Candidates::from_logits(std::span<const float> logits) {
  Candidates c;
  c.data.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) c.data[i] = {TokenId(i), logits[i], 0.0f};
  return c;
}

void sampler_penalties(Candidates& c, std::span<const TokenId> history, const SamplerParams& params) {
  if (params.repeat_last_n == 0 ||
      (params.repeat_penalty == 1.0f && params.frequency_penalty == 0.0f && params.presence_penalty == 0.0f)) {
    return;
  }
  size_t n = history.size();
  if (params.repeat_last_n > 0) n = std::min(n, size_t(params.repeat_last_n));
  std::unordered_map<TokenId, int> counts;
  for (TokenId id : history.subspan(history.size() - n)) ++counts[id];
  for (const auto& entry : counts) {
    const TokenId id = entry.first;  // a named variable, not a structured binding: clang 14 cannot capture those
    const int count = entry.second;
    // The list is usually still in id order (nothing sorted it yet): index directly, else search.
    Candidate* x = nullptr;
    if (id >= 0 && size_t(id) < c.data.size() && c.data[size_t(id)].id == id) {
      x = &c.data[size_t(id)];
    } else {
      const auto it = std::find_if(c.data.begin(), c.data.end(), [&](const Candidate& y) { return y.id == id; });
      if (it == c.data.end()) continue;
      x = &*it;
    }
    // Multiplying a negative logit (rather than dividing) keeps the penalty a penalty, as llama.cpp does.
    x->logit = x->logit <= 0.0f ? x->logit * params.repeat_penalty : x->logit / params.repeat_penalty;
    x->logit -= float(count) * params.frequency_penalty + float(count > 0) * params.presence_penalty;
  }
  c.sorted = false;
}

void sampler_top_k(Candidates& c, int32_t k) {
  if (k <= 0 || c.data.empty()) return;
  const size_t keep = std::min(size_t(k), c.data.size());
  if (!c.sorted) {
    std::partial_sort(c.data.begin(), c.data.begin() + ptrdiff_t(keep), c.data.end(), before);
    c.sorted = true;
  }
  c.data.resize(keep);
}

void sampler_top_p(Candidates& c, float p) {
  if (p >= 1.0f || c.data.empty()) return;
  sort_candidates(c);
  softmax(c);
  float cum = 0.0f;
  size_t keep = c.data.size();
  for (size_t i = 0; i < c.data.size(); ++i) {
    cum += c.data[i].p;
    if (cum >= p) {  // min_keep = 1: i + 1 >= 1 always holds
      keep = i + 1;
      break;
    }
  }
  c.data.resize(keep);
}

void sampler_min_p(Candidates& c, float p) {
  if (p <= 0.0f || c.data.empty()) return;
  // p_i >= p * p_max  <=>  l_i >= l_max + log(p): no softmax needed. The maximum always survives.
  const float min_logit = max_logit(c) + std::log(p);
  if (c.sorted) {
    size_t i = 1;
    while (i < c.data.size() && c.data[i].logit >= min_logit) ++i;
    c.data.resize(i);
    return;
  }
  std::erase_if(c.data, [&](const Candidate& x) { return !(x.logit >= min_logit); });
  ESSAIM_CHECK(!c.data.empty());
}

void sampler_temperature(Candidates& c, float temperature) {
  if (c.data.empty()) return;
  if (temperature <= 0.0f) {
    const size_t best = sampler_argmax(c);
    for (size_t i = 0; i < c.data.size(); ++i) {
      if (i != best) c.data[i].logit = -std::numeric_limits<float>::infinity();
    }
    return;
  }
  for (Candidate& x : c.data) x.logit /= temperature;
}

size_t sampler_argmax(const Candidates& c) {
  ESSAIM_CHECK(!c.data.empty());
  size_t best = 0;
  for (size_t i = 1; i < c.data.size(); ++i) {
    if (c.data[i].logit > c.data[best].logit) best = i;
  }
  return best;
}

double sampler_uniform01(std::mt19937& rng) {
  const double a = double(rng());
  const double b = double(rng());
  const double u = (a + b * 4294967296.0) / 18446744073709551616.0;
  return u >= 1.0 ? std::nextafter(1.0, 0.0) : u;
}

TokenId sampler_draw(Candidates& c, std::mt19937& rng) {
  ESSAIM_CHECK(!c.data.empty());
  if (c.data.size() == 1) {
    c.data[0].p = 1.0f;
    return c.data[0].id;
  }
  const float max_l = max_logit(c);
  double total = 0.0;
  for (Candidate& x : c.data) {
    x.p = std::isfinite(max_l) ? std::exp(x.logit - max_l) : 1.0f;
    total += x.p;
  }
  const double target = total * sampler_uniform01(rng);
  double running = 0.0;
  size_t chosen = 0;
  for (size_t i = 0; i < c.data.size(); ++i) {
    running += c.data[i].p;
    if (running >= target) {
      chosen = i;
      break;
    }
  }
  for (Candidate& x : c.data) x.p = float(x.p / total);
  return c.data[chosen].id;
}

Sampler::Sampler(const SamplerParams& params)
    : params_(params),
      seed_(params.seed == SamplerParams::SEED_RANDOM ? std::random_device{}() : params.seed),
      rng_(seed_) {}

void Sampler::reset() {
  history_.clear();
  rng_.seed(seed_);
}

void Sampler::accept(TokenId id) {
  if (params_.repeat_last_n == 0) return;
  history_.push_back(id);
  if (params_.repeat_last_n > 0 && history_.size() > size_t(params_.repeat_last_n)) history_.pop_front();
}

TokenId Sampler::sample(std::span<const float> logits) { return sample(logits, {}); }

TokenId Sampler::sample(std::span<const float> logits, std::span<const uint64_t> allowed) {
  ESSAIM_CHECK(!logits.empty());
  Candidates& c = candidates_;
  c.data.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) c.data[i] = {TokenId(i), logits[i], 0.0f};
  c.sorted = false;

  window_.assign(history_.begin(), history_.end());
  sampler_penalties(c, window_, params_);
  if (!allowed.empty()) {
    ESSAIM_CHECK(allowed.size() * 64 >= logits.size());
    std::erase_if(c.data, [&](const Candidate& x) { return !((allowed[size_t(x.id) >> 6] >> (x.id & 63)) & 1); });
    ESSAIM_CHECK(!c.data.empty());
  }
  if (params_.temperature <= 0.0f) return c.data[sampler_argmax(c)].id;  // id order: lowest id wins ties
  sampler_top_k(c, params_.top_k);
  sampler_top_p(c, params_.top_p);
  sampler_min_p(c, params_.min_p);
  sampler_temperature(c, params_.temperature);
  return sampler_draw(c, rng_);
}

}  // namespace essaim
