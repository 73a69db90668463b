#include "text/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

namespace essaim {
namespace {

std::vector<TokenId> ids_of(const Candidates& c) {
  std::vector<TokenId> ids;
  for (const Candidate& x : c.data) ids.push_back(x.id);
  return ids;
}

std::set<TokenId> id_set(const Candidates& c) {
  const std::vector<TokenId> ids = ids_of(c);
  return {ids.begin(), ids.end()};
}

// Logits whose softmax is exactly proportional to the given weights.
std::vector<float> log_weights(const std::vector<float>& w) {
  std::vector<float> l;
  for (float x : w) l.push_back(std::log(x));
  return l;
}

std::vector<float> random_logits(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> normal(0.0f, 2.0f);  // only feeds inputs; results never depend on it
  std::vector<float> l(n);
  for (float& x : l) x = normal(rng);
  return l;
}

TEST(Uniform01, MatchesLibstdcxxUniformRealDistribution) {
  std::mt19937 a(1234), b(1234);
  std::set<double> seen;
  for (int i = 0; i < 2000; ++i) {
    const double u = sampler_uniform01(a);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    seen.insert(u);
#if defined(__GLIBCXX__)
    ASSERT_EQ(u, std::uniform_real_distribution<double>(0.0, 1.0)(b)) << i;
#endif
  }
  EXPECT_EQ(seen.size(), 2000u);
  // Pinned: the engine is fixed by the standard, so these hold on every platform.
  std::mt19937 c(42);
  EXPECT_EQ(sampler_uniform01(c), (double(1608637542u) + double(3421126067u) * 4294967296.0) / 18446744073709551616.0);
}

TEST(TopK, KeepsTheKLargestLowestIdFirstOnTies) {
  Candidates c = Candidates::from_logits(std::vector<float>{1, 5, 3, 5, 2});
  sampler_top_k(c, 2);
  EXPECT_EQ(ids_of(c), (std::vector<TokenId>{1, 3}));
  EXPECT_TRUE(c.sorted);
  Candidates all = Candidates::from_logits(std::vector<float>{1, 5, 3});
  sampler_top_k(all, 0);  // off
  EXPECT_EQ(ids_of(all), (std::vector<TokenId>{0, 1, 2}));
  sampler_top_k(all, 10);
  EXPECT_EQ(ids_of(all), (std::vector<TokenId>{1, 2, 0}));
}

TEST(TopP, ShortestPrefixReachingP) {
  const std::vector<float> logits = log_weights({0.05f, 0.5f, 0.15f, 0.3f});
  const auto keep = [&](float p) {
    Candidates c = Candidates::from_logits(logits);
    sampler_top_p(c, p);
    return ids_of(c);
  };
  EXPECT_EQ(keep(0.4f), (std::vector<TokenId>{1}));
  EXPECT_EQ(keep(0.75f), (std::vector<TokenId>{1, 3}));
  EXPECT_EQ(keep(0.9f), (std::vector<TokenId>{1, 3, 2}));
  EXPECT_EQ(keep(0.99f), (std::vector<TokenId>{1, 3, 2, 0}));
  EXPECT_EQ(keep(0.0f), (std::vector<TokenId>{1}));  // always at least one
  EXPECT_EQ(keep(1.0f), (std::vector<TokenId>{0, 1, 2, 3}));  // off: untouched, unsorted
}

TEST(MinP, KeepsTokensWithinAFactorOfTheBest) {
  const std::vector<float> logits = log_weights({0.05f, 0.5f, 0.15f, 0.3f});
  for (bool presorted : {false, true}) {
    const auto keep = [&](float p) {
      Candidates c = Candidates::from_logits(logits);
      if (presorted) sampler_top_k(c, 100);
      sampler_min_p(c, p);
      return id_set(c);
    };
    EXPECT_EQ(keep(0.2f), (std::set<TokenId>{1, 2, 3})) << presorted;   // threshold 0.1
    EXPECT_EQ(keep(0.35f), (std::set<TokenId>{1, 3})) << presorted;     // threshold 0.175
    EXPECT_EQ(keep(0.9f), (std::set<TokenId>{1})) << presorted;
    EXPECT_EQ(keep(0.0f), (std::set<TokenId>{0, 1, 2, 3})) << presorted;
  }
}

TEST(Temperature, ScalesLogitsAndZeroKeepsOnlyTheMax) {
  Candidates c = Candidates::from_logits(std::vector<float>{1, 4, 2, 4});
  sampler_temperature(c, 2.0f);
  EXPECT_EQ(c.data[1].logit, 2.0f);
  EXPECT_EQ(c.data[2].logit, 1.0f);
  sampler_temperature(c, 0.0f);
  EXPECT_EQ(c.data[1].logit, 2.0f);
  EXPECT_TRUE(std::isinf(c.data[0].logit) && std::isinf(c.data[2].logit) && std::isinf(c.data[3].logit));
}

TEST(Penalties, RepeatFrequencyPresenceOverTheWindow) {
  SamplerParams p;
  p.repeat_penalty = 2.0f;
  p.repeat_last_n = 3;
  Candidates c = Candidates::from_logits(std::vector<float>{4, -4, 4, 4});
  const std::vector<TokenId> history = {3, 0, 1, 1};  // window = last 3: {0, 1, 1}; token 3 fell out
  sampler_penalties(c, history, p);
  EXPECT_EQ(c.data[0].logit, 2.0f);   // positive: divided
  EXPECT_EQ(c.data[1].logit, -8.0f);  // negative: multiplied
  EXPECT_EQ(c.data[2].logit, 4.0f);
  EXPECT_EQ(c.data[3].logit, 4.0f);

  SamplerParams f;
  f.frequency_penalty = 0.5f;
  f.presence_penalty = 0.25f;
  Candidates d = Candidates::from_logits(std::vector<float>{1, 1, 1});
  sampler_penalties(d, std::vector<TokenId>{2, 2, 0}, f);
  EXPECT_EQ(d.data[0].logit, 1.0f - 0.5f - 0.25f);
  EXPECT_EQ(d.data[1].logit, 1.0f);
  EXPECT_EQ(d.data[2].logit, 1.0f - 1.0f - 0.25f);
}

TEST(Greedy, ArgmaxAfterPenaltiesLowestIdOnTies) {
  Sampler greedy({.temperature = 0.0f, .seed = 1});
  EXPECT_EQ(greedy.sample(std::vector<float>{1, 3, 3, 2}), 1);
  Sampler penalised({.temperature = 0.0f, .repeat_penalty = 4.0f, .seed = 1});
  penalised.accept(1);
  EXPECT_EQ(penalised.sample(std::vector<float>{1, 3, 2.5f, 2}), 2);
  Sampler negative({.temperature = -1.0f, .seed = 1});
  EXPECT_EQ(negative.sample(std::vector<float>{-5, -1, -1}), 1);
}

TEST(Draw, FrequenciesFollowTheSoftmax) {
  std::mt19937 rng(9);
  std::map<TokenId, int> counts;
  const int n = 40000;
  for (int i = 0; i < n; ++i) {
    Candidates c = Candidates::from_logits(log_weights({1.0f, 3.0f, 0.0f}));
    ++counts[sampler_draw(c, rng)];
  }
  EXPECT_NEAR(double(counts[0]) / n, 0.25, 0.01);
  EXPECT_NEAR(double(counts[1]) / n, 0.75, 0.01);
  EXPECT_EQ(counts[2], 0);  // weight 0 -> logit -inf: never drawn
}

TEST(Draw, SingleCandidateDoesNotAdvanceTheGenerator) {
  std::mt19937 a(5), b(5);
  Candidates one = Candidates::from_logits(std::vector<float>{0.5f});
  EXPECT_EQ(sampler_draw(one, a), 0);
  EXPECT_EQ(a(), b());
}

TEST(Chain, TemperatureComesAfterTheFilters) {
  // top-p 0.75 keeps ids 1 and 3 at temperature 1; a huge temperature flattens the draw but not the kept set.
  const std::vector<float> logits = log_weights({0.05f, 0.5f, 0.15f, 0.3f});
  Sampler hot({.temperature = 100.0f, .top_k = 0, .top_p = 0.75f, .min_p = 0.0f, .seed = 3});
  std::map<TokenId, int> counts;
  for (int i = 0; i < 2000; ++i) ++counts[hot.sample(logits)];
  EXPECT_EQ(counts.size(), 2u);
  EXPECT_GT(counts[1], 800);
  EXPECT_GT(counts[3], 800);  // nearly uniform between the two survivors
}

TEST(Chain, SameSeedSameSequenceDifferentSeedsDiffer) {
  std::mt19937 rng(21);
  std::vector<std::vector<float>> steps;
  for (int i = 0; i < 300; ++i) steps.push_back(random_logits(rng, 500));
  const auto run = [&](uint32_t seed) {
    Sampler s({.temperature = 1.0f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .repeat_penalty = 1.1f, .seed = seed});
    std::vector<TokenId> out;
    for (const std::vector<float>& l : steps) {
      out.push_back(s.sample(l));
      s.accept(out.back());
    }
    return out;
  };
  const std::vector<TokenId> a = run(7);
  EXPECT_EQ(a, run(7));
  EXPECT_NE(a, run(8));
  EXPECT_GT(std::set<TokenId>(a.begin(), a.end()).size(), 100u);  // the draws really vary

  Sampler s({.temperature = 1.0f, .seed = 7});
  std::vector<TokenId> first;
  for (int i = 0; i < 20; ++i) first.push_back(s.sample(steps[size_t(i)]));
  s.reset();
  for (int i = 0; i < 20; ++i) EXPECT_EQ(s.sample(steps[size_t(i)]), first[size_t(i)]);
  EXPECT_EQ(s.seed(), 7u);
}

TEST(Chain, RandomSeedIsDrawnAndReported) {
  Sampler s(SamplerParams{});
  EXPECT_EQ(s.params().seed, SamplerParams::SEED_RANDOM);
  const TokenId id = s.sample(std::vector<float>{0, 0, 0});
  EXPECT_TRUE(id >= 0 && id < 3);
}

}  // namespace
}  // namespace essaim
