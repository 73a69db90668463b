// A BPE vocabulary as GGUF stores it (REFERENCE.md 7.1), independent of where it came from: read from a GGUF
// file, or imported from a Hugging Face tokenizer.json (so `essaim synth --tokenizer` can embed a real one).
//
//   ESSAIM_ASSIGN_OR_RETURN(Vocab v, vocab_from_gguf(file));
//   Tokenizer tok(v);   // text/tokenizer.h
//
// Token texts and merges are in the byte-level (GPT-2) encoding of REFERENCE.md 7.2.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace essaim {

class GgufFile;

enum class TokenType : int32_t {
  UNDEFINED = 0, NORMAL = 1, UNKNOWN = 2, CONTROL = 3, USER_DEFINED = 4, UNUSED = 5, BYTE = 6,
};

struct Vocab {
  std::string model = "gpt2";             // tokenizer.ggml.model
  std::string pre = "qwen2";              // tokenizer.ggml.pre
  std::vector<std::string> tokens;        // index = id
  std::vector<TokenType> types;           // same length as tokens
  std::vector<std::string> merges;        // "LEFT RIGHT", rank = index
  std::optional<uint32_t> bos_id, eos_id, pad_id, unk_id, eot_id;
  bool add_bos = false;
  bool add_eos = false;
  std::string chat_template;              // tokenizer.chat_template, may be empty
};

Result<Vocab> vocab_from_gguf(const GgufFile& file);
Result<Vocab> vocab_from_hf_tokenizer_json(const std::string& path);

}  // namespace essaim
