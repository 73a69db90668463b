// llama-perplexity's figure: the text's tokens cut into consecutive chunks of n_ctx, each evaluated from an
// empty cache and scored on its second half (positions n_ctx/2 .. n_ctx-2 predicting the next token), so
// every scored token has at least n_ctx/2 tokens of context.
//
//   PerplexityTally tally;
//   tally.add_chunk(logits, chunk_tokens, n_vocab);   // logits [n_ctx][n_vocab] of one chunk
//   tally.ppl();  tally.ppl_error();                  // exp(mean NLL), and its standard error
#pragma once

#include <cstdint>
#include <span>

namespace essaim {

// -log softmax(row)[target], in f64 (max subtracted, exponentials summed in f64).
double token_nll(std::span<const float> row, int32_t target);

struct PerplexityTally {
  double nll = 0;    // Σ token NLL
  double nll2 = 0;   // Σ token NLL²
  uint64_t count = 0;

  // Scores tokens[j + 1] from logits row j for j in [n_ctx/2, n_ctx - 1), n_ctx = tokens.size().
  void add_chunk(std::span<const float> logits, std::span<const int32_t> tokens, size_t n_vocab);
  double ppl() const;
  // llama-perplexity's "+/-": ppl · sqrt(var(NLL) / (count - 1)).
  double ppl_error() const;
};

// The MTP draft head's top-1 hit rate on a text, teacher-forced over the same chunks and positions as
// PerplexityTally: the draft from position j (main hidden state of j, token j+1) predicts token j+2; it is
// compared with the main model's greedy choice there (argmax of main row j+1: what greedy speculative
// decoding would accept) and with the text's token.
struct DraftTally {
  uint64_t count = 0;
  uint64_t agree_greedy = 0;  // draft == main model's argmax for token j+2
  uint64_t agree_text = 0;    // draft == the text's token j+2
  uint64_t main_text = 0;     // main model's argmax == the text's token j+2 (for scale)

  // main_logits [n][V] (n = tokens.size()), draft_logits [n-1][V]: row j from position j. Counts
  // j in [n/2, n-2).
  void add_chunk(std::span<const float> main_logits, std::span<const float> draft_logits,
                 std::span<const int32_t> tokens, size_t n_vocab);
};

}  // namespace essaim
