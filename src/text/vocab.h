// A BPE vocabulary as GGUF stores it (docs/reference.md 7.1), independent of where it came from: read from a GGUF
// file, or imported from a Hugging Face tokenizer.json (so `essaim synth --tokenizer` can embed a real one).
//
//   ESSAIM_ASSIGN_OR_RETURN(Vocab v, vocab_from_gguf(file));
//   ESSAIM_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::create(std::move(v)));   // text/tokenizer.h
//
// Token texts and merges are in the byte-level (GPT-2) encoding of docs/reference.md 7.2 (NORMAL tokens; CONTROL and
// USER_DEFINED texts are the raw text, as llama.cpp's converter writes them).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace essaim {

class GgufFile;

using TokenId = int32_t;  // as llama.cpp's llama_token

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
  // Unicode normalisation applied to raw text before pre-tokenisation: "" (none) or "NFC". From
  // tokenizer.json's "normalizer"; GGUF has no key for it, so vocab_from_gguf infers NFC for the Qwen
  // pre-tokenizers (qwen2, qwen35), whose Hugging Face tokenizers all declare it (docs/text.md).
  std::string normalizer;
  std::vector<std::string> warnings;      // non-fatal load notes (e.g. no tokenizer.ggml.pre), for the CLI to show
};

// Reads the tokenizer.ggml.* keys with llama.cpp's exact types (docs/reference.md 7.1, 9); a missing required key or a
// key of another type is an error naming it. Missing token_type means all NORMAL; out-of-range special ids are
// dropped; a missing tokenizer.ggml.pre means "default" (with a warning). normalizer: NFC for qwen2 / qwen35.
Result<Vocab> vocab_from_gguf(const GgufFile& file);

// Imports a Hugging Face tokenizer.json (byte-level BPE only) the way llama.cpp's converter would write it:
// model.vocab as NORMAL, added tokens as CONTROL (special, or spelled <|...|>) or USER_DEFINED (raw text), gaps in
// the id range filled with "[PAD<id>]" UNUSED, pre-tokenizer recognised from its Split regex. Qwen conventions
// give bos = pad = <|endoftext|> and eos = <|im_end|> (else <|endoftext|>); a tokenizer_config.json next to the
// file, when present, overrides eos/bos/pad/add_bos_token and supplies chat_template.
Result<Vocab> vocab_from_hf_tokenizer_json(const std::string& path);

// Appends "[PAD<id>]" UNUSED entries up to n_tokens (a model's padded vocabulary size, e.g. 151936 for Qwen3).
void vocab_pad_to(Vocab& vocab, size_t n_tokens);

}  // namespace essaim
