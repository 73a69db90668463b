#include "model/perplexity.h"

#include <algorithm>
#include <cmath>

#include "core/status.h"

namespace essaim {

double token_nll(std::span<const float> row, int32_t target) {
  ESSAIM_CHECK(target >= 0 && size_t(target) < row.size());
  const float max = *std::max_element(row.begin(), row.end());
  double sum = 0;
  for (float v : row) sum += std::exp(double(v) - double(max));
  return std::log(sum) - (double(row[size_t(target)]) - double(max));
}

void PerplexityTally::add_chunk(std::span<const float> logits, std::span<const int32_t> tokens, size_t n_vocab) {
  const size_t n_ctx = tokens.size();
  ESSAIM_CHECK(logits.size() == n_ctx * n_vocab);
  for (size_t j = n_ctx / 2; j + 1 < n_ctx; ++j) {
    const double v = token_nll(logits.subspan(j * n_vocab, n_vocab), tokens[j + 1]);
    nll += v;
    nll2 += v * v;
    ++count;
  }
}

double PerplexityTally::ppl() const { return count == 0 ? 0.0 : std::exp(nll / double(count)); }

double PerplexityTally::ppl_error() const {
  if (count < 2) return 0.0;
  const double mean = nll / double(count);
  const double var = nll2 / double(count) - mean * mean;
  return var > 0 ? ppl() * std::sqrt(var / double(count - 1)) : 0.0;
}

}  // namespace essaim
