// The router against a naive top-k: stable sort of the probabilities (ties keep the lower index first),
// renormalisation in double, the 2^-14 clamp; softmax against a double-precision softmax.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "moe/numerics.h"
#include "moe/router.h"

namespace essaim {
namespace {

struct Naive {
  std::vector<int32_t> ids;
  std::vector<double> weights;
};

Naive naive_top_k(const std::vector<float>& p, int32_t k) {
  std::vector<int32_t> order(p.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[size_t(a)] > p[size_t(b)]; });
  Naive n;
  double sum = 0;
  for (int32_t s = 0; s < k; ++s) {
    n.ids.push_back(order[size_t(s)]);
    sum += p[size_t(order[size_t(s)])];
  }
  sum = std::max(sum, std::ldexp(1.0, -14));
  for (int32_t s = 0; s < k; ++s) n.weights.push_back(p[size_t(n.ids[size_t(s)])] / sum);
  return n;
}

TEST(Router, MatchesNaiveTopKOnRandomRows) {
  std::mt19937 rng(1234);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  for (int32_t X : {8, 64, 128, 256}) {
    for (int32_t k : {1, 2, 4, 8}) {
      for (int rep = 0; rep < 20; ++rep) {
        std::vector<float> logits(static_cast<size_t>(X));
        for (float& v : logits) v = dist(rng);
        ASSERT_NE(logits[0], logits[1]);
        std::vector<float> p(logits.size());
        softmax(logits.data(), logits.size(), p.data());
        std::vector<int32_t> ids(static_cast<size_t>(k));
        std::vector<float> w(static_cast<size_t>(k));
        route_select(p.data(), X, k, ids.data(), w.data());
        const Naive n = naive_top_k(p, k);
        EXPECT_EQ(ids, n.ids);
        for (int32_t s = 0; s < k; ++s) EXPECT_NEAR(w[size_t(s)], n.weights[size_t(s)], 1e-6 * n.weights[size_t(s)]);
        EXPECT_NEAR(std::accumulate(w.begin(), w.end(), 0.0), 1.0, 1e-6);
      }
    }
  }
}

TEST(Router, TiesGoToTheLowerExpertIndex) {
  // Experts 5, 2 and 7 share the top probability; 3 and 6 the next one.
  std::vector<float> p(8, 0.01f);
  p[5] = p[2] = p[7] = 0.2f;
  p[6] = p[3] = 0.1f;
  int32_t ids[5];
  float w[5];
  route_select(p.data(), 8, 5, ids, w);
  EXPECT_EQ(std::vector<int32_t>(ids, ids + 5), (std::vector<int32_t>{2, 5, 7, 3, 6}));
  EXPECT_EQ(w[0], w[1]);
  EXPECT_EQ(w[1], w[2]);
}

TEST(Router, WeightsAreExactlyTheSpecifiedFormula) {
  // s = f32(Σ in slot order, f64); w = p / s in f32.
  std::vector<float> p = {0.1f, 0.3f, 0.05f, 0.25f, 0.3f};
  int32_t ids[3];
  float w[3];
  route_select(p.data(), 5, 3, ids, w);
  EXPECT_EQ(std::vector<int32_t>(ids, ids + 3), (std::vector<int32_t>{1, 4, 3}));
  const float s = float(double(0.3f) + double(0.3f) + double(0.25f));
  EXPECT_EQ(w[0], 0.3f / s);
  EXPECT_EQ(w[2], 0.25f / s);
}

TEST(Router, TinyProbabilitiesAreDividedByTheClamp) {
  std::vector<float> p = {1e-7f, 2e-7f, 1.0f - 3e-7f};
  int32_t ids[2];
  float w[2];
  route_select(p.data(), 3, 2, ids, w);  // picks 2 (large) and 1
  EXPECT_EQ(ids[0], 2);
  std::vector<float> tiny = {1e-7f, 2e-7f, 3e-7f};
  route_select(tiny.data(), 3, 2, ids, w);
  EXPECT_EQ(ids[0], 2);
  EXPECT_EQ(ids[1], 1);
  EXPECT_EQ(w[0], 3e-7f / kRouterMinWeightSum);
  EXPECT_EQ(w[1], 2e-7f / kRouterMinWeightSum);
}

TEST(Softmax, MatchesDoublePrecisionAndHandlesMaskedEntries) {
  std::mt19937 rng(99);
  std::normal_distribution<float> dist(0.0f, 5.0f);
  std::vector<float> z(300);
  for (float& v : z) v = dist(rng);
  z[7] = -INFINITY;
  std::vector<float> p(z.size());
  softmax(z.data(), z.size(), p.data());
  double m = -INFINITY, sum = 0;
  for (float v : z) m = std::max(m, double(v));
  for (float v : z) sum += std::exp(double(v) - m);
  for (size_t i = 0; i < z.size(); ++i) EXPECT_NEAR(p[i], std::exp(double(z[i]) - m) / sum, 1e-6);
  EXPECT_EQ(p[7], 0.0f);
  // In place gives the same bits.
  std::vector<float> q = z;
  softmax(q.data(), q.size(), q.data());
  EXPECT_EQ(q, p);
}

TEST(Router, RouteComputesLogitsThroughTheRouterMatrix) {
  // An F32 router [E=16 -> X=12]: route() == softmax + route_select of the naive logits.
  const int32_t E = 16, X = 12, K = 3, N = 4;
  std::mt19937 rng(5);
  std::normal_distribution<float> dist;
  std::vector<float> wr(size_t(E * X)), f(size_t(N * E));
  for (float& v : wr) v = dist(rng);
  for (float& v : f) v = dist(rng);
  const WeightMatrix router{.type = GgmlType::F32, .cols = E, .rows = X,
                            .data = reinterpret_cast<const uint8_t*>(wr.data()), .row_stride = E * 4};
  std::vector<int32_t> ids(size_t(N * K));
  std::vector<float> w(size_t(N * K)), probs(size_t(N * X));
  route(router, f.data(), N, K, ids.data(), w.data(), nullptr, probs.data());
  for (int32_t r = 0; r < N; ++r) {
    std::vector<float> logits(static_cast<size_t>(X));
    for (int32_t x = 0; x < X; ++x) {
      double acc = 0;
      for (int32_t i = 0; i < E; ++i) acc += double(wr[size_t(x * E + i)]) * f[size_t(r * E + i)];
      logits[size_t(x)] = float(acc);
    }
    std::vector<float> p(static_cast<size_t>(X));
    softmax(logits.data(), size_t(X), p.data());
    const Naive n = naive_top_k(p, K);
    EXPECT_EQ(std::vector<int32_t>(ids.begin() + r * K, ids.begin() + (r + 1) * K), n.ids) << "row " << r;
    for (int32_t x = 0; x < X; ++x) EXPECT_NEAR(probs[size_t(r * X + x)], p[size_t(x)], 1e-5);
  }
}

}  // namespace
}  // namespace essaim
