// Learns the default synthetic tokenizer's merges with textbook BPE: split the corpus into words with the
// qwen2 pre-tokeniser, then repeatedly merge the most frequent adjacent symbol pair (ties: the smallest pair
// in byte order), so the result depends on the corpus alone.
#include "synth/synth_vocab.h"

#include <map>
#include <set>
#include <utility>

namespace essaim {
namespace {

// GPT-2's bytes_to_unicode: printable bytes keep their code point, the 68 others map to U+0100.. in order.
bool byte_is_printable(unsigned b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; }

uint32_t byte_code_point(unsigned b) {
  if (byte_is_printable(b)) return b;
  uint32_t n = 0;
  for (unsigned x = 0; x < b; ++x)
    if (!byte_is_printable(x)) ++n;
  return 0x100 + n;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else {  // every code point of the byte map is below U+0800
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

bool is_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; }
bool is_newline(char c) { return c == '\n' || c == '\r'; }
char lower(char c) { return c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c; }

// Length of the qwen2 pattern's match at text[i], trying its alternatives in order (docs/reference.md 7.4).
size_t match_word(std::string_view t, size_t i) {
  const size_t n = t.size();
  // 1. contractions, case-insensitive, in the pattern's order
  if (t[i] == '\'' && i + 1 < n) {
    for (std::string_view c : {"s", "t", "re", "ve", "m", "ll", "d"}) {
      if (i + 1 + c.size() > n) continue;
      bool eq = true;
      for (size_t k = 0; k < c.size(); ++k) eq = eq && lower(t[i + 1 + k]) == c[k];
      if (eq) return 1 + c.size();
    }
  }
  // 2. [^\r\n\p{L}\p{N}]?\p{L}+
  {
    size_t j = i;
    if (!is_letter(t[j]) && !is_newline(t[j]) && !is_digit(t[j]) && j + 1 < n && is_letter(t[j + 1])) ++j;
    if (is_letter(t[j])) {
      while (j < n && is_letter(t[j])) ++j;
      return j - i;
    }
  }
  // 3. one digit
  if (is_digit(t[i])) return 1;
  // 4. ` ?[^\s\p{L}\p{N}]+[\r\n]*`
  {
    size_t j = i;
    if (t[j] == ' ') ++j;
    const size_t start = j;
    while (j < n && !is_space(t[j]) && !is_letter(t[j]) && !is_digit(t[j])) ++j;
    if (j > start) {
      while (j < n && is_newline(t[j])) ++j;
      return j - i;
    }
  }
  // 5.-7. whitespace runs
  size_t end = i;
  while (end < n && is_space(t[end])) ++end;
  if (end > i) {
    size_t last_nl = std::string_view::npos;  // 5. \s*[\r\n]+ ends at the run's last CR/LF
    for (size_t k = i; k < end; ++k)
      if (is_newline(t[k])) last_nl = k;
    if (last_nl != std::string_view::npos) return last_nl + 1 - i;
    if (end == n) return end - i;          // 6. \s+(?!\S) at the end of the text
    if (end - i >= 2) return end - i - 1;  // 6. leave the last space to lead the next word
    return 1;                              // 7. \s+
  }
  return 1;  // not reached for ASCII input: every byte is a letter, digit, space or other
}

struct Word {
  std::vector<std::string> symbols;
  int64_t count = 0;
};

}  // namespace

std::string synth_byte_encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) append_utf8(out, byte_code_point(b));
  return out;
}

bool synth_token_is_plain_text(std::string_view t) {
  if (t.empty()) return false;
  for (size_t i = 0; i < t.size();) {
    const unsigned char c = static_cast<unsigned char>(t[i]);
    uint32_t cp = c;
    if (c >= 0xC0 && c < 0xE0 && i + 1 < t.size()) {  // the byte map only needs 1- and 2-byte sequences
      cp = (uint32_t(c & 0x1F) << 6) | (static_cast<unsigned char>(t[i + 1]) & 0x3F);
      i += 2;
    } else if (c < 0x80) {
      i += 1;
    } else {
      return false;
    }
    // The byte this code point stands for (docs/reference.md 7.2), or -1.
    static const std::vector<int> kByteOf = [] {
      std::vector<int> t(0x144, -1);
      for (unsigned b = 0; b < 256; ++b) t[byte_code_point(b)] = int(b);
      return t;
    }();
    const int byte = cp < kByteOf.size() ? kByteOf[cp] : -1;
    if (!(byte == '\n' || byte == '\t' || (byte >= 0x20 && byte <= 0x7E))) return false;
  }
  return true;
}

std::vector<std::string> synth_pretokenize_ascii(std::string_view text) {
  std::vector<std::string> words;
  for (size_t i = 0; i < text.size();) {
    const size_t len = match_word(text, i);
    words.emplace_back(text.substr(i, len));
    i += len;
  }
  return words;
}

namespace {

// Textbook BPE over the corpus words; see the file comment.
Vocab learn_vocab(uint32_t n_merges) {
  Vocab v;
  v.model = "gpt2";
  std::set<std::string> known;
  auto add_token = [&](const std::string& text, TokenType type) {
    v.tokens.push_back(text);
    v.types.push_back(type);
    known.insert(text);
  };
  // Byte tokens in GPT-2's order: the printable bytes ascending, then the remapped ones ascending.
  for (unsigned b = 0; b < 256; ++b)
    if (byte_is_printable(b)) add_token(synth_byte_encode(std::string(1, char(b))), TokenType::NORMAL);
  for (unsigned b = 0; b < 256; ++b)
    if (!byte_is_printable(b)) add_token(synth_byte_encode(std::string(1, char(b))), TokenType::NORMAL);

  std::map<std::string, int64_t> counts;
  for (const std::string& w : synth_pretokenize_ascii(synth_corpus())) ++counts[synth_byte_encode(w)];
  std::vector<Word> words;
  for (const auto& [text, count] : counts) {
    Word w;
    w.count = count;
    for (size_t i = 0; i < text.size();) {  // one symbol per code point (1 or 2 UTF-8 bytes here)
      const size_t len = (static_cast<unsigned char>(text[i]) >= 0xC0) ? 2 : 1;
      w.symbols.push_back(text.substr(i, len));
      i += len;
    }
    words.push_back(std::move(w));
  }

  for (uint32_t m = 0; m < n_merges; ++m) {
    std::map<std::pair<std::string, std::string>, int64_t> pairs;
    for (const Word& w : words)
      for (size_t i = 0; i + 1 < w.symbols.size(); ++i) pairs[{w.symbols[i], w.symbols[i + 1]}] += w.count;
    const std::pair<std::string, std::string>* best = nullptr;
    int64_t best_count = 1;  // a pair seen once teaches nothing
    for (const auto& [pair, count] : pairs)
      if (count > best_count) {  // strict: among equal counts the first (smallest) pair wins
        best = &pair;
        best_count = count;
      }
    if (best == nullptr) break;
    const std::string a = best->first, b = best->second, ab = a + b;
    v.merges.push_back(a + " " + b);
    if (!known.count(ab)) add_token(ab, TokenType::NORMAL);
    for (Word& w : words) {
      std::vector<std::string> merged;
      for (size_t i = 0; i < w.symbols.size(); ++i) {
        if (i + 1 < w.symbols.size() && w.symbols[i] == a && w.symbols[i + 1] == b) {
          merged.push_back(ab);
          ++i;
        } else {
          merged.push_back(w.symbols[i]);
        }
      }
      w.symbols = std::move(merged);
    }
  }

  const uint32_t endoftext = uint32_t(v.tokens.size());
  add_token("<|endoftext|>", TokenType::CONTROL);
  add_token("<|im_start|>", TokenType::CONTROL);
  const uint32_t im_end = uint32_t(v.tokens.size());
  add_token("<|im_end|>", TokenType::CONTROL);
  add_token("<think>", TokenType::USER_DEFINED);
  add_token("</think>", TokenType::USER_DEFINED);
  v.bos_id = endoftext;
  v.eos_id = im_end;
  v.pad_id = endoftext;
  v.add_bos = false;
  v.add_eos = false;
  return v;
}

}  // namespace

Vocab synth_default_vocab(uint32_t n_merges) {
  // Every plan needs the default vocabulary and learning it takes a few hundred ms: learn it once.
  if (n_merges == kSynthDefaultMerges) {
    static const Vocab cached = learn_vocab(kSynthDefaultMerges);
    return cached;
  }
  return learn_vocab(n_merges);
}

Result<Vocab> synth_vocab_for(const SynthArchDesc& arch, const std::string& tokenizer_json) {
  Vocab v;
  if (tokenizer_json.empty()) {
    v = synth_default_vocab(kSynthDefaultMerges);
    v.pre = arch.tokenizer_pre;
  } else {
    // An imported tokenizer keeps the pre-tokeniser its regex was recognised as: that is how it splits text.
    ESSAIM_ASSIGN_OR_RETURN(v, vocab_from_hf_tokenizer_json(tokenizer_json));
    if (v.tokens.empty()) return Status::error("tokenizer '" + tokenizer_json + "' has no tokens");
    if (v.types.size() != v.tokens.size())
      return Status::error("tokenizer '" + tokenizer_json + "': token types do not match the tokens");
  }
  if (v.chat_template.empty()) v.chat_template = arch.chat_template;
  return v;
}

}  // namespace essaim
