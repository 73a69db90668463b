// GPT-2 byte-level BPE over a Vocab, exactly as llama.cpp runs it (docs/reference.md 7.3-7.6): special-token split,
// UTF-8 sanitising, pre-tokeniser regexes, per-word BPE by merge rank; and a streaming detokeniser that never
// emits half a character.
//
//   ESSAIM_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::create(std::move(vocab)));
//   std::vector<TokenId> ids = tok.encode("<|im_start|>user\nHi", /*parse_special=*/true);
//   Detokenizer out(tok);
//   for (TokenId id : generated) std::fputs(out.push(id).c_str(), stdout);   // whole characters only
//   std::fputs(out.flush().c_str(), stdout);
//   if (tok.is_eog(id)) stop();
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "text/pre_tokenizer.h"
#include "text/vocab.h"

namespace essaim {

class Tokenizer {
 public:
  // Validates the vocabulary (model "gpt2", types as long as tokens, every merge "LEFT RIGHT") and builds the
  // lookup tables. Refuses an unknown pre-tokenizer name.
  static Result<Tokenizer> create(Vocab vocab);

  // Text -> ids. parse_special: CONTROL and UNKNOWN token texts in the input become their ids (USER_DEFINED
  // texts such as <think> always do). Never fails: invalid UTF-8 is encoded as U+FFFD, one per bad byte. Adds
  // BOS/EOS only when the vocabulary asks for it (never for Qwen).
  std::vector<TokenId> encode(std::string_view text, bool parse_special = true) const;

  // The bytes one token stands for (possibly part of a UTF-8 character). CONTROL/UNKNOWN render only when
  // render_special; UNUSED and out-of-range ids render nothing.
  std::string token_to_piece(TokenId id, bool render_special = false) const;
  // Concatenated pieces; raw bytes, not sanitised (a sequence may end inside a character).
  std::string decode(std::span<const TokenId> ids, bool render_special = false) const;

  int32_t n_vocab() const { return int32_t(vocab_.tokens.size()); }
  bool valid(TokenId id) const { return id >= 0 && id < n_vocab(); }
  // Effective type: as stored, except end-of-generation and FIM markers, which are forced to CONTROL.
  TokenType type(TokenId id) const { return types_[size_t(id)]; }
  const std::string& text(TokenId id) const { return vocab_.tokens[size_t(id)]; }
  std::optional<TokenId> find(std::string_view text) const;

  bool is_eog(TokenId id) const;
  const std::vector<TokenId>& eog_ids() const { return eog_ids_; }
  std::optional<TokenId> bos() const;
  std::optional<TokenId> eos() const;

  const Vocab& vocab() const { return vocab_; }
  const PreTokenizer& pre_tokenizer() const { return pre_; }

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using StringMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

  explicit Tokenizer(PreTokenizer pre) : pre_(std::move(pre)) {}
  void encode_raw(std::string_view text, std::vector<TokenId>& out) const;
  void bpe_word(std::string_view word, std::vector<TokenId>& out) const;
  int32_t merge_rank(std::string_view left, std::string_view right, std::string& key) const;

  Vocab vocab_;
  PreTokenizer pre_;
  std::vector<TokenType> types_;
  StringMap token_ids_;     // vocabulary text -> id
  StringMap merge_ranks_;   // "LEFT RIGHT" -> rank
  std::vector<TokenId> special_candidates_;  // CONTROL / USER_DEFINED / UNKNOWN, longest text first
  std::vector<TokenId> eog_ids_;             // sorted
};

// Turns a stream of generated ids into text, holding back an incomplete UTF-8 sequence until the token that
// completes it arrives. Every string it returns is valid UTF-8 (bytes that can never complete become U+FFFD).
class Detokenizer {
 public:
  explicit Detokenizer(const Tokenizer& tokenizer, bool render_special = false)
      : tokenizer_(&tokenizer), render_special_(render_special) {}
  std::string push(TokenId id);
  // What is still held back, an unfinished sequence rendered as U+FFFD per byte. Resets the stream.
  std::string flush();

 private:
  const Tokenizer* tokenizer_;
  bool render_special_;
  std::string pending_;
};

}  // namespace essaim
