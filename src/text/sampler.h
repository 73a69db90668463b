// Token sampling: llama.cpp's default chain (docs/reference.md 8), deterministic for a seed on every platform.
//
//   Sampler sampler({.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .seed = 42});
//   TokenId id = sampler.sample(logits);   // logits: (n_vocab)
//   sampler.accept(id);                     // feeds the repetition penalty window
//
// Chain order: repetition/frequency/presence penalties -> top-k -> top-p -> min-p -> temperature -> draw
// (softmax over the survivors, inverse CDF with one uniform double). temperature <= 0 is greedy: the largest
// penalised logit, the lowest id among equal ones. The uniform double is computed here from std::mt19937's raw
// 32-bit outputs exactly as libstdc++'s generate_canonical does (so llama.cpp builds on Linux draw the same),
// because the standard fixes the engine's output but not the distributions'.
#pragma once

#include <cstdint>
#include <deque>
#include <random>
#include <span>
#include <vector>

#include "text/vocab.h"

namespace essaim {

struct SamplerParams {
  static constexpr uint32_t SEED_RANDOM = 0xFFFFFFFFu;  // as LLAMA_DEFAULT_SEED: draw a seed from the OS

  float temperature = 0.8f;
  int32_t top_k = 40;            // <= 0: off
  float top_p = 0.95f;           // >= 1: off
  float min_p = 0.05f;           // <= 0: off
  int32_t repeat_last_n = 64;    // penalty window; 0: off, < 0: the whole history
  float repeat_penalty = 1.0f;   // 1: off
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  uint32_t seed = SEED_RANDOM;
};

struct Candidate {
  TokenId id;
  float logit;
  float p;  // set by the steps that need probabilities
};

// The candidate list the steps work on; `sorted` means by decreasing logit (then increasing id).
struct Candidates {
  std::vector<Candidate> data;
  bool sorted = false;

  static Candidates from_logits(std::span<const float> logits);
};

// The chain's steps, exposed for tests and for callers composing their own chain. min_keep = 1 throughout.
// history: the accepted tokens, oldest first (only the last `last_n` count).
void sampler_penalties(Candidates& c, std::span<const TokenId> history, const SamplerParams& params);
void sampler_top_k(Candidates& c, int32_t k);
void sampler_top_p(Candidates& c, float p);
void sampler_min_p(Candidates& c, float p);
void sampler_temperature(Candidates& c, float temperature);
// Softmax over c (float, max-subtracted), then the first candidate whose running sum reaches u * total, with
// u = sampler_uniform01(rng). A single candidate is returned without drawing, as llama.cpp does.
TokenId sampler_draw(Candidates& c, std::mt19937& rng);
// Index of the largest logit, the first one in list order among equals.
size_t sampler_argmax(const Candidates& c);

// The uniform double in [0, 1) that std::uniform_real_distribution<double>(0, 1) draws with libstdc++:
// two 32-bit outputs a, b -> (a + b * 2^32) / 2^64, clamped below 1.
double sampler_uniform01(std::mt19937& rng);

class Sampler {
 public:
  explicit Sampler(const SamplerParams& params);

  // Runs the chain over logits (n_vocab) and returns the chosen id. Does not record it: call accept().
  TokenId sample(std::span<const float> logits);
  // The same chain over the ids set in `allowed` only (a bit per id, as text/grammar.h's TokenMask holds them):
  // the penalties first, then the other ids are dropped, then the rest of the chain. At least one id must be set.
  TokenId sample(std::span<const float> logits, std::span<const uint64_t> allowed);
  void accept(TokenId id);
  void reset();  // forgets the history and reseeds

  const SamplerParams& params() const { return params_; }
  uint32_t seed() const { return seed_; }  // the seed in use (drawn when params.seed is SEED_RANDOM)

 private:
  SamplerParams params_;
  uint32_t seed_;
  std::mt19937 rng_;
  std::deque<TokenId> history_;  // at most repeat_last_n when that is > 0
  std::vector<TokenId> window_;  // scratch: history_ as a contiguous span
  Candidates candidates_;        // scratch, reused across calls (n_vocab entries)
};

}  // namespace essaim
