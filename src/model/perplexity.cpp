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

namespace {

size_t row_argmax(std::span<const float> logits, size_t row, size_t V) {  // the lowest id among equal maxima
  const float* r = logits.data() + row * V;
  return size_t(std::max_element(r, r + V) - r);
}

}  // namespace

void DraftTally::add_chunk(std::span<const float> main_logits, std::span<const float> draft_logits,
                           std::span<const int32_t> tokens, size_t n_vocab) {
  const size_t n = tokens.size();
  if (n < 3) return;
  for (size_t j = n / 2; j + 2 < n; ++j) {
    const size_t draft = row_argmax(draft_logits, j, n_vocab), greedy = row_argmax(main_logits, j + 1, n_vocab);
    const size_t text = size_t(tokens[j + 2]);
    ++count;
    agree_greedy += draft == greedy;
    agree_text += draft == text;
    main_text += greedy == text;
  }
}

}  // namespace essaim
