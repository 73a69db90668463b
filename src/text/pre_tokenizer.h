// The pre-tokeniser: splits text into the words that BPE then merges independently (docs/reference.md 7.4), chosen
// by the GGUF key `tokenizer.ggml.pre`. Regexes run in PCRE2 (UTF + Unicode properties, JIT when available).
//
//   ESSAIM_ASSIGN_OR_RETURN(PreTokenizer pre, PreTokenizer::create("qwen2"));
//   std::vector<std::string_view> words = pre.split("Hello  world 123");
//   // {"Hello", " ", " world", " ", "1", "2", "3"}
//
// A name is a sequence of regexes (llama.cpp's `default` has four): each one splits every piece the previous one
// produced; matches and the gaps between them both become pieces, in order, so the pieces always concatenate
// back to the input. Matching is leftmost-first (backtracking), as in llama.cpp and Hugging Face.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace essaim {

class PreTokenizer {
 public:
  // Known names: "qwen2", "qwen35", "gpt-2", "default". Anything else is refused with the list of known names.
  static Result<PreTokenizer> create(std::string_view name);
  // The regex sequence behind a known name (PCRE2 syntax), empty for an unknown one. For tests and docs.
  static std::vector<std::string> patterns(std::string_view name);
  static std::vector<std::string> known_names();
  // The known name whose regex a Hugging Face tokenizer.json spells this way (its Split pre-tokenizer), or "".
  static std::string name_for_hf_regex(std::string_view regex);

  // Splits valid UTF-8 text (the tokenizer sanitises first; invalid UTF-8 here is a caller bug). The views point
  // into `text`.
  std::vector<std::string_view> split(std::string_view text) const;

  const std::string& name() const { return name_; }

  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;
  ~PreTokenizer();

 private:
  struct Regex;
  PreTokenizer() = default;
  std::string name_;
  std::vector<std::unique_ptr<Regex>> regexes_;
};

}  // namespace essaim
