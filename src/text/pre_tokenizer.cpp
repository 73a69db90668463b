#include "text/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <utility>

#include "text/byte_unicode.h"

namespace essaim {
namespace {

// The regexes as llama.cpp writes them (src/llama-vocab.cpp). For qwen2/qwen35 llama.cpp replaces Hugging
// Face's `(?i:'s|...)` by explicit ASCII classes; besides being what llama.cpp runs, this keeps PCRE2's caseless
// folding from matching `'ſ` (U+017F folds to s) where Unicode lower-casing would not.
constexpr const char* CONTRACTIONS_ASCII = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])";
constexpr const char* QWEN2_TAIL =
    "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* QWEN35_TAIL =
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* GPT2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";

// The same patterns as Hugging Face tokenizer.json files spell them, to recognise an imported tokenizer.
constexpr const char* HF_CONTRACTIONS = "(?i:'s|'t|'re|'ve|'m|'ll|'d)";

// `\s` in docs/reference.md 7.4 is Unicode White_Space, which is what llama.cpp tests. PCRE2's UCP `\s` is \p{Z} plus
// \h and \v, which also takes U+180E; spelling the set out keeps the two identical.
constexpr const char* WHITE_SPACE =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

// Rewrites \s and \S (inside and outside character classes) to the explicit White_Space set.
std::string expand_white_space(std::string_view pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[++i];
      if (e == 's') {
        out += in_class ? std::string(WHITE_SPACE) : "[" + std::string(WHITE_SPACE) + "]";
      } else if (e == 'S') {
        ESSAIM_CHECK(!in_class);  // none of our patterns negates \S inside a class
        out += "[^" + std::string(WHITE_SPACE) + "]";
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (c == '[' && !in_class) in_class = true;
    else if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

}  // namespace

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  ~Regex() { pcre2_code_free(code); }
};

PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;
PreTokenizer::~PreTokenizer() = default;

std::vector<std::string> PreTokenizer::known_names() { return {"qwen2", "qwen35", "gpt-2", "default"}; }

std::vector<std::string> PreTokenizer::patterns(std::string_view name) {
  if (name == "qwen2") return {std::string(CONTRACTIONS_ASCII) + QWEN2_TAIL};
  if (name == "qwen35") return {std::string(CONTRACTIONS_ASCII) + QWEN35_TAIL};
  if (name == "gpt-2") return {GPT2};
  if (name == "default") return {"[\\p{P}\\$\\+<=>\\^~\\|]+", GPT2, "\\p{N}+", "[0-9][0-9][0-9]"};
  return {};
}

std::string PreTokenizer::name_for_hf_regex(std::string_view regex) {
  if (regex == std::string(HF_CONTRACTIONS) + QWEN2_TAIL) return "qwen2";
  if (regex == std::string(HF_CONTRACTIONS) + QWEN35_TAIL) return "qwen35";
  if (regex == std::string(GPT2) + "|\\s+") return "gpt-2";
  return "";
}

Result<PreTokenizer> PreTokenizer::create(std::string_view name) {
  const std::vector<std::string> sources = patterns(name);
  if (sources.empty()) {
    std::string known;
    for (const std::string& n : known_names()) known += (known.empty() ? "" : ", ") + n;
    return Status::error("unknown pre-tokenizer '" + std::string(name) + "' (tokenizer.ggml.pre); known: " + known);
  }
  PreTokenizer pre;
  pre.name_ = std::string(name);
  for (const std::string& source : sources) {
    const std::string pattern = expand_white_space(source);
    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    auto regex = std::make_unique<Regex>();
    regex->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                                &error_code, &error_offset, nullptr);
    if (regex->code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error_code, message, sizeof(message));
      return Status::error("pre-tokenizer '" + pre.name_ + "': PCRE2 refused pattern at offset " +
                           std::to_string(error_offset) + ": " + reinterpret_cast<const char*>(message));
    }
    // JIT makes splitting several times faster; when the platform has none, the interpreter gives the same matches.
    (void)pcre2_jit_compile(regex->code, PCRE2_JIT_COMPLETE);
    pre.regexes_.push_back(std::move(regex));
  }
  return pre;
}

std::vector<std::string_view> PreTokenizer::split(std::string_view text) const {
  ESSAIM_CHECK(utf8_is_valid(text));  // PCRE2 runs with PCRE2_NO_UTF_CHECK below
  std::vector<std::string_view> pieces;
  if (!text.empty()) pieces.push_back(text);
  std::vector<std::string_view> next;
  for (const std::unique_ptr<Regex>& regex : regexes_) {
    pcre2_match_data* match = pcre2_match_data_create_from_pattern(regex->code, nullptr);
    ESSAIM_CHECK(match != nullptr);
    next.clear();
    for (std::string_view piece : pieces) {
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
      size_t pos = 0;
      while (pos < piece.size()) {
        const int rc = pcre2_match(regex->code, subject, piece.size(), pos, PCRE2_NO_UTF_CHECK, match, nullptr);
        // No match, or a resource limit (never seen with these patterns, tested on megabyte inputs): the rest
        // of the piece stays one piece, as a gap would.
        if (rc < 0) break;
        const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match);
        const size_t start = ovector[0];
        const size_t end = ovector[1];
        ESSAIM_CHECK(end > start);  // no alternative of our patterns matches the empty string
        if (start > pos) next.push_back(piece.substr(pos, start - pos));
        next.push_back(piece.substr(start, end - start));
        pos = end;
      }
      if (pos < piece.size()) next.push_back(piece.substr(pos));
    }
    pcre2_match_data_free(match);
    std::swap(pieces, next);
  }
  return pieces;
}

}  // namespace essaim
