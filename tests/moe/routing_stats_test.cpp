// Router statistics against a hand-worked sequence of picks, and the recorder's sequence bookkeeping.
#include <gtest/gtest.h>

#include <cmath>

#include "moe/routing_stats.h"

namespace essaim {
namespace {

TEST(RoutingStats, HandWorkedSequence) {
  // 4 experts, K = 2. Tokens: {0,1} {0,1} {0,2} | new sequence {3,2}.
  LayerPicks l{.k = 2, .ids = {0, 1, 0, 1, 0, 2, 3, 2}, .sequence_start = {1, 0, 0, 1}};
  Result<std::vector<LayerRoutingStats>> s = routing_stats(std::span<const LayerPicks>(&l, 1), 4);
  ASSERT_TRUE(s.is_ok()) << s.status().message();
  ASSERT_EQ(s->size(), 1u);
  const LayerRoutingStats& r = (*s)[0];
  EXPECT_EQ(r.tokens, 4u);
  EXPECT_EQ(r.picks, (std::vector<uint64_t>{3, 2, 2, 1}));
  const double h = -(3.0 / 8 * std::log2(3.0 / 8) + 2 * (0.25 * std::log2(0.25)) + 1.0 / 8 * std::log2(1.0 / 8));
  EXPECT_NEAR(r.entropy_bits, h, 1e-12);
  EXPECT_NEAR(r.max_entropy_bits, 2.0, 1e-12);
  EXPECT_EQ(r.top_experts, 1);           // ceil(4 / 10)
  EXPECT_NEAR(r.top_share, 3.0 / 8, 1e-12);
  EXPECT_NEAR(r.reuse, 3.0 / 4, 1e-12);  // (2 + 1) shared of 2 pairs x 2 picks; the sequence break not counted
  EXPECT_NEAR(r.reuse_if_random, 0.5, 1e-12);
}

TEST(RoutingStats, EvenRouterHasMaximalEntropyAndATenthForTheTopTenth) {
  LayerPicks l{.k = 1};
  for (int32_t t = 0; t < 200; ++t) {
    l.ids.push_back(t % 20);
    l.sequence_start.push_back(t == 0);
  }
  Result<std::vector<LayerRoutingStats>> s = routing_stats(std::span<const LayerPicks>(&l, 1), 20);
  ASSERT_TRUE(s.is_ok());
  EXPECT_NEAR((*s)[0].entropy_bits, std::log2(20.0), 1e-12);
  EXPECT_EQ((*s)[0].top_experts, 2);
  EXPECT_NEAR((*s)[0].top_share, 0.1, 1e-12);
  EXPECT_NEAR((*s)[0].reuse, 0.0, 1e-12);  // never the previous token's expert
}

TEST(RoutingStats, OutOfRangeIdIsAnError) {
  LayerPicks l{.k = 1, .ids = {5}, .sequence_start = {1}};
  EXPECT_FALSE(routing_stats(std::span<const LayerPicks>(&l, 1), 4).is_ok());
}

// The recorder forwards every batch untouched and marks where a sequence starts, per layer.
class CountingExecutor final : public ExpertExecutor {
 public:
  Status compute(const ExpertBatch&, std::span<float>) override {
    ++calls;
    return Status::ok();
  }
  int calls = 0;
};

TEST(RoutingRecorder, RecordsPicksPerLayerAndSequence) {
  CountingExecutor inner;
  RoutingRecorder rec(inner);
  const std::vector<int32_t> two_rows = {0, 1, 2, 3};
  std::vector<float> out;
  for (int seq = 0; seq < 2; ++seq) {
    rec.start_sequence();
    for (int step = 0; step < 2; ++step)
      for (int32_t layer : {0, 1})
        ASSERT_TRUE(rec.compute({.layer = layer, .n_rows = 2, .k = 2, .ids = two_rows}, out).is_ok());
  }
  EXPECT_EQ(inner.calls, 8);
  ASSERT_EQ(rec.picks().size(), 2u);
  for (const LayerPicks& l : rec.picks()) {
    EXPECT_EQ(l.ids.size(), 16u);
    EXPECT_EQ(l.sequence_start, (std::vector<uint8_t>{1, 0, 0, 0, 1, 0, 0, 0}));
  }
}

}  // namespace
}  // namespace essaim
