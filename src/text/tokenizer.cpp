#include "text/tokenizer.h"

#include <algorithm>
#include <queue>

#include "text/byte_unicode.h"

namespace essaim {
namespace {

// Texts llama.cpp treats as end of generation (llama-vocab.cpp: the EOT/EOG scan plus the FIM pad/repo/sep
// markers) and, with the FIM prefix/suffix/middle markers, forces to CONTROL whatever the file says (REFERENCE 7.1).
constexpr std::string_view EOG_TEXTS[] = {
    "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<EOT>", "_<EOT>",
    "<|end_of_text|>", "<end_of_utterance>", "<|fim_pad|>", "<|repo_name|>", "<|fim_repo|>", "<|file_sep|>",
};
constexpr std::string_view FIM_TEXTS[] = {"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"};

bool is_special_candidate(TokenType t) {
  return t == TokenType::CONTROL || t == TokenType::USER_DEFINED || t == TokenType::UNKNOWN;
}

// One piece of the input after the special-token split: either a token id or a byte range of raw text.
struct Fragment {
  TokenId id;      // -1 for raw text
  size_t offset;
  size_t length;
};

// A symbol of the word being merged: a byte range of the byte-level word, linked to its live neighbours.
struct Symbol {
  uint32_t offset;
  uint32_t length;  // 0 once merged into its left neighbour
  int32_t prev;
  int32_t next;
};

struct Bigram {
  int32_t rank;
  int32_t left;
  int32_t right;
  uint32_t length;  // left.length + right.length when queued; a mismatch later means the entry is stale
};

struct BigramLater {
  // Lowest rank first; equal ranks (the same pair several times) leftmost first (REFERENCE 7.5).
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
  }
};

}  // namespace

Result<Tokenizer> Tokenizer::create(Vocab vocab) {
  if (vocab.model != "gpt2") {
    return Status::error("unsupported tokenizer model '" + vocab.model + "' (only gpt2 byte-level BPE)");
  }
  if (vocab.tokens.empty()) return Status::error("tokenizer vocabulary is empty");
  if (vocab.tokens.size() > size_t(INT32_MAX)) return Status::error("tokenizer vocabulary too large");
  if (vocab.types.size() != vocab.tokens.size()) {
    return Status::error("tokenizer: " + std::to_string(vocab.types.size()) + " token types for " +
                         std::to_string(vocab.tokens.size()) + " tokens");
  }
  ESSAIM_ASSIGN_OR_RETURN(PreTokenizer pre, PreTokenizer::create(vocab.pre));
  Tokenizer tok(std::move(pre));
  const size_t n = vocab.tokens.size();

  // As llama.cpp: an empty token text is renamed so it can never match, and a repeated text maps to its last id.
  for (size_t id = 0; id < n; ++id) {
    if (vocab.tokens[id].empty()) vocab.tokens[id] = "[EMPTY_" + std::to_string(id) + "]";
  }
  tok.token_ids_.reserve(n);
  for (size_t id = 0; id < n; ++id) tok.token_ids_[vocab.tokens[id]] = int32_t(id);

  tok.merge_ranks_.reserve(vocab.merges.size());
  for (size_t rank = 0; rank < vocab.merges.size(); ++rank) {
    const std::string& merge = vocab.merges[rank];
    const size_t space = merge.find(' ', 1);
    if (space == std::string::npos || space + 1 >= merge.size()) {
      return Status::error("tokenizer.ggml.merges[" + std::to_string(rank) + "] = '" + merge +
                           "' is not \"LEFT RIGHT\"");
    }
    tok.merge_ranks_.emplace(merge, int32_t(rank));  // a repeated merge keeps its first (lowest) rank
  }

  tok.types_ = vocab.types;
  const auto force_control = [&](std::string_view text) -> std::optional<TokenId> {
    const auto it = tok.token_ids_.find(text);
    if (it == tok.token_ids_.end()) return std::nullopt;
    tok.types_[size_t(it->second)] = TokenType::CONTROL;
    return it->second;
  };
  for (std::string_view text : EOG_TEXTS) {
    if (const std::optional<TokenId> id = force_control(text)) tok.eog_ids_.push_back(*id);
  }
  for (std::string_view text : FIM_TEXTS) (void)force_control(text);
  for (const std::optional<uint32_t>& id : {vocab.eos_id, vocab.eot_id}) {
    if (id && *id < n) tok.eog_ids_.push_back(TokenId(*id));
  }
  std::sort(tok.eog_ids_.begin(), tok.eog_ids_.end());
  tok.eog_ids_.erase(std::unique(tok.eog_ids_.begin(), tok.eog_ids_.end()), tok.eog_ids_.end());

  for (size_t id = 0; id < n; ++id) {
    if (is_special_candidate(tok.types_[id])) tok.special_candidates_.push_back(TokenId(id));
  }
  // Longest first so that e.g. "<|im_start|>" wins over a shorter token it contains; id breaks ties so the
  // order never depends on the sort implementation.
  std::sort(tok.special_candidates_.begin(), tok.special_candidates_.end(), [&](TokenId a, TokenId b) {
    const size_t la = vocab.tokens[size_t(a)].size();
    const size_t lb = vocab.tokens[size_t(b)].size();
    return la != lb ? la > lb : a < b;
  });
  tok.vocab_ = std::move(vocab);
  return tok;
}

std::optional<TokenId> Tokenizer::find(std::string_view text) const {
  const auto it = token_ids_.find(text);
  if (it == token_ids_.end()) return std::nullopt;
  return it->second;
}

bool Tokenizer::is_eog(TokenId id) const { return std::binary_search(eog_ids_.begin(), eog_ids_.end(), id); }

std::optional<TokenId> Tokenizer::bos() const {
  if (!vocab_.bos_id || *vocab_.bos_id >= vocab_.tokens.size()) return std::nullopt;
  return TokenId(*vocab_.bos_id);
}

std::optional<TokenId> Tokenizer::eos() const {
  if (!vocab_.eos_id || *vocab_.eos_id >= vocab_.tokens.size()) return std::nullopt;
  return TokenId(*vocab_.eos_id);
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool parse_special) const {
  std::vector<TokenId> out;
  if (vocab_.add_bos && bos()) out.push_back(*bos());

  // 1. Special-token split (REFERENCE 7.3 step 1): each candidate, longest first, cuts every raw fragment at
  //    each exact match, left to right.
  std::vector<Fragment> fragments;
  if (!text.empty()) fragments.push_back({-1, 0, text.size()});
  std::vector<Fragment> next;
  for (TokenId id : special_candidates_) {
    if (!parse_special && types_[size_t(id)] != TokenType::USER_DEFINED) continue;
    const std::string& special = vocab_.tokens[size_t(id)];
    next.clear();
    bool changed = false;
    for (const Fragment& f : fragments) {
      if (f.id >= 0 || f.length < special.size()) {
        next.push_back(f);
        continue;
      }
      const std::string_view raw = text.substr(f.offset, f.length);
      size_t pos = 0;
      for (size_t hit = raw.find(special); hit != std::string_view::npos; hit = raw.find(special, pos)) {
        if (hit > pos) next.push_back({-1, f.offset + pos, hit - pos});
        next.push_back({id, f.offset + hit, special.size()});
        pos = hit + special.size();
        changed = true;
      }
      if (pos < raw.size()) next.push_back({-1, f.offset + pos, raw.size() - pos});
    }
    if (changed) std::swap(fragments, next);
  }

  // 2. Everything else through the byte-level BPE path.
  for (const Fragment& f : fragments) {
    if (f.id >= 0) {
      out.push_back(f.id);
    } else {
      encode_raw(text.substr(f.offset, f.length), out);
    }
  }
  if (vocab_.add_eos && eos()) out.push_back(*eos());
  return out;
}

void Tokenizer::encode_raw(std::string_view text, std::vector<TokenId>& out) const {
  std::string clean = utf8_sanitize(text);
  if (vocab_.normalizer == "NFC") clean = utf8_nfc(clean);
  std::string word;
  for (std::string_view piece : pre_.split(clean)) {
    word.clear();
    byte_level_encode_append(word, piece);
    bpe_word(word, out);
  }
}

int32_t Tokenizer::merge_rank(std::string_view left, std::string_view right, std::string& key) const {
  key.assign(left);
  key += ' ';
  key.append(right);
  const auto it = merge_ranks_.find(std::string_view(key));
  return it == merge_ranks_.end() ? -1 : it->second;
}

void Tokenizer::bpe_word(std::string_view word, std::vector<TokenId>& out) const {
  // One symbol per code point of the byte-level word (each is one input byte, 1 or 2 UTF-8 bytes here).
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  uint32_t cp = 0;
  for (size_t pos = 0; pos < word.size();) {
    size_t len = utf8_decode(word, pos, cp);
    if (len == 0) len = 1;  // cannot happen for byte-level text; keeps the loop total anyway
    const int32_t index = int32_t(symbols.size());
    symbols.push_back({uint32_t(pos), uint32_t(len), index - 1, index + 1});
    pos += len;
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;

  const auto text_of = [&](const Symbol& s) { return word.substr(s.offset, s.length); };
  std::string key;
  std::priority_queue<Bigram, std::vector<Bigram>, BigramLater> queue;
  const auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const int32_t rank = merge_rank(text_of(symbols[size_t(left)]), text_of(symbols[size_t(right)]), key);
    if (rank < 0) return;
    queue.push({rank, left, right, symbols[size_t(left)].length + symbols[size_t(right)].length});
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) try_add(int32_t(i), int32_t(i + 1));

  while (!queue.empty()) {
    const Bigram top = queue.top();
    queue.pop();
    Symbol& left = symbols[size_t(top.left)];
    Symbol& right = symbols[size_t(top.right)];
    // Lengths only grow, so a queued pair whose summed length changed (or a side that was absorbed) is stale.
    if (left.length == 0 || right.length == 0 || left.next != top.right ||
        left.length + right.length != top.length) {
      continue;
    }
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[size_t(right.next)].prev = top.left;
    try_add(left.prev, top.left);
    try_add(top.left, left.next);
  }

  for (int32_t i = 0; i >= 0; i = symbols[size_t(i)].next) {
    const std::string_view text = text_of(symbols[size_t(i)]);
    if (const auto it = token_ids_.find(text); it != token_ids_.end()) {
      out.push_back(it->second);
      continue;
    }
    // A symbol missing from the vocabulary falls back to one-byte tokens (REFERENCE 7.3e); only ASCII can hit.
    for (char c : text) {
      if (const auto it = token_ids_.find(std::string_view(&c, 1)); it != token_ids_.end()) out.push_back(it->second);
    }
  }
}

std::string Tokenizer::token_to_piece(TokenId id, bool render_special) const {
  if (!valid(id)) return {};
  const std::string& text = vocab_.tokens[size_t(id)];
  switch (types_[size_t(id)]) {
    case TokenType::NORMAL:
      return byte_level_decode(text);
    case TokenType::USER_DEFINED:
      return text;
    case TokenType::CONTROL:
    case TokenType::UNKNOWN:
      return render_special ? text : std::string();
    case TokenType::BYTE: {
      // "<0xAB>" (SentencePiece style; not used by Qwen).
      const auto hex = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        return -1;
      };
      if (text.size() != 6 || text.compare(0, 3, "<0x") != 0 || text[5] != '>') return {};
      const int hi = hex(text[3]);
      const int lo = hex(text[4]);
      if (hi < 0 || lo < 0) return {};
      return std::string(1, char(hi * 16 + lo));
    }
    case TokenType::UNUSED:
    case TokenType::UNDEFINED:
      return {};
  }
  return {};
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool render_special) const {
  std::string out;
  for (TokenId id : ids) out += token_to_piece(id, render_special);
  return out;
}

std::string Detokenizer::push(TokenId id) {
  pending_ += tokenizer_->token_to_piece(id, render_special_);
  const size_t ready = pending_.size() - utf8_incomplete_tail(pending_);
  std::string out = utf8_sanitize(std::string_view(pending_).substr(0, ready));
  pending_.erase(0, ready);
  return out;
}

std::string Detokenizer::flush() {
  std::string out = utf8_sanitize(pending_);
  pending_.clear();
  return out;
}

}  // namespace essaim
