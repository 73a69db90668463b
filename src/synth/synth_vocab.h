// The synthetic models' tokenizer: a GPT-2 byte-level BPE whose merges are learned, deterministically, from a
// small embedded English corpus; or a real one imported from a Hugging Face tokenizer.json.
//
//   Vocab v = synth_default_vocab(kSynthDefaultMerges);        // 256 bytes + merges + 5 specials
//   ESSAIM_ASSIGN_OR_RETURN(Vocab q, synth_vocab_for(synth_arch(SynthArch::QWEN35MOE), "tokenizer.json"));
//
// Token texts and merges use the byte-to-code-point map of docs/reference.md 7.2. Ids 0..255 are the 256 byte
// tokens in GPT-2's order (printable bytes first), then one token per new merge result in merge order, then
// <|endoftext|>, <|im_start|>, <|im_end|> (CONTROL) and <think>, </think> (USER_DEFINED).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "synth/synth_arch.h"
#include "text/vocab.h"

namespace essaim {

inline constexpr uint32_t kSynthDefaultMerges = 320;

// docs/reference.md 7.2: each byte of `bytes` as its code point, UTF-8 encoded ("Ġ" for a space).
std::string synth_byte_encode(std::string_view bytes);

// True when a byte-encoded token text decodes to printable ASCII, tab or newline only. The synthetic LM head
// damps every other token so greedy text from random weights stays readable.
bool synth_token_is_plain_text(std::string_view token_text);

// Words of ASCII text exactly as the qwen2 pre-tokeniser regex (docs/reference.md 7.4) splits it.
std::vector<std::string> synth_pretokenize_ascii(std::string_view text);

// The learned merges, at most n_merges (learning stops early when no pair occurs twice).
Vocab synth_default_vocab(uint32_t n_merges);

// The vocabulary a model of this architecture gets: the default one, or tokenizer_json imported when it is
// non-empty. The default one gets the architecture's pre-tokeniser (qwen2 / qwen35); an imported one keeps
// the pre-tokeniser its regex was recognised as. A missing chat template is filled in with the family's.
Result<Vocab> synth_vocab_for(const SynthArchDesc& arch, const std::string& tokenizer_json);

std::string_view synth_corpus();

}  // namespace essaim
