// llama-perplexity's scoring, against values worked out by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "model/perplexity.h"

namespace essaim {
namespace {

TEST(Perplexity, TokenNllIsMinusLogSoftmax) {
  const std::vector<float> row = {0.0f, std::log(3.0f)};  // softmax = (1/4, 3/4)
  EXPECT_NEAR(token_nll(row, 1), std::log(4.0 / 3.0), 1e-7);
  EXPECT_NEAR(token_nll(row, 0), std::log(4.0), 1e-7);
  const std::vector<float> big = {1000.0f, 1000.0f, 1000.0f, 1000.0f};  // no overflow: max subtracted
  EXPECT_NEAR(token_nll(big, 2), std::log(4.0), 1e-12);
}

TEST(Perplexity, ChunkIsScoredOnItsSecondHalfOnly) {
  // n_ctx = 6, vocab 2: rows 3 and 4 predict tokens 4 and 5; rows 0-2 and 5 are never read (NaN proves it).
  const float nan = std::nanf("");
  const float l3 = std::log(3.0f);
  const std::vector<float> logits = {nan, nan, nan, nan, nan, nan, 0.0f, l3, l3, 0.0f, nan, nan};
  const std::vector<int32_t> tokens = {0, 0, 0, 0, 1, 0};
  PerplexityTally t;
  t.add_chunk(logits, tokens, 2);
  ASSERT_EQ(t.count, 2u);
  const double a = std::log(4.0 / 3.0), b = std::log(4.0 / 3.0);  // token 1 at 3/4, token 0 at 3/4
  EXPECT_NEAR(t.nll, a + b, 1e-7);
  EXPECT_NEAR(t.ppl(), 4.0 / 3.0, 1e-6);
  EXPECT_NEAR(t.ppl_error(), 0.0, 1e-9);  // equal NLLs: no spread
  // A second chunk (n_ctx = 4: only row 2 predicts token 3) where the token had probability 1/4.
  const std::vector<float> second = {nan, nan, nan, nan, 0.0f, l3, nan, nan};
  t.add_chunk(second, std::vector<int32_t>{1, 1, 1, 0}, 2);
  ASSERT_EQ(t.count, 3u);
  const double c = std::log(4.0);
  const double mean = (a + b + c) / 3;
  EXPECT_NEAR(t.ppl(), std::exp(mean), 1e-6);
  const double var = (a * a + b * b + c * c) / 3 - mean * mean;
  EXPECT_NEAR(t.ppl_error(), std::exp(mean) * std::sqrt(var / 2), 1e-6);
}

TEST(Perplexity, DraftTallyComparesRowJOfTheDraftWithMainRowJPlus1AndTokenJPlus2) {
  // n = 7, vocab 3: draft rows 3 and 4 (of 6) predict tokens 5 and 6; main rows 4 and 5 are the greedy
  // choices there. Rows never read are NaN.
  const float nan = std::nanf("");
  const std::vector<float> main = {nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan,
                                   0.0f, 2.0f, 1.0f,   // row 4: greedy 1
                                   3.0f, 0.0f, 0.0f,   // row 5: greedy 0
                                   nan, nan, nan};
  const std::vector<float> draft = {nan, nan, nan, nan, nan, nan, nan, nan, nan,
                                    0.0f, 5.0f, 0.0f,  // row 3: draft 1 (main agrees; the text has 2)
                                    1.0f, 1.0f, 0.0f,  // row 4: draft 0, the lowest of equal maxima (main agrees, text 0)
                                    nan, nan, nan};
  const std::vector<int32_t> tokens = {0, 0, 0, 0, 0, 2, 0};
  DraftTally t;
  t.add_chunk(main, draft, tokens, 3);
  EXPECT_EQ(t.count, 2u);
  EXPECT_EQ(t.agree_greedy, 2u);
  EXPECT_EQ(t.agree_text, 1u);
  EXPECT_EQ(t.main_text, 1u);
}

}  // namespace
}  // namespace essaim
