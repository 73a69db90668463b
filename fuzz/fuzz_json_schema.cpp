// libFuzzer target for structured output (text/json_schema_grammar.h, text/grammar.h): any bytes as a JSON
// Schema, compiled under small limits; when it compiles, a matcher walks the bytes that follow the schema in
// the input and its token mask over a small vocabulary is computed at each step. Compiling and matching must
// return a grammar or an error with a message — never crash, hang, or grow past the limits.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "text/grammar.h"
#include "text/json_schema_grammar.h"
#include "text/tokenizer.h"

namespace {

void require(bool ok) {
  if (!ok) std::abort();
}

// All 256 byte tokens and a few longer ones, GPT-2 style, as the text tests build them.
const essaim::Tokenizer& tokenizer() {
  static const essaim::Tokenizer t = [] {
    essaim::Vocab v;
    for (int b = 0; b < 256; ++b) {
      v.tokens.push_back(std::string(1, char(b)));
      v.types.push_back(essaim::TokenType::USER_DEFINED);  // rendered verbatim: one byte each
    }
    for (const char* s : {"{\"", "\":", "true", "null", "\"}", "</think>", "<tool_call>\n", "12", ", "}) {
      v.tokens.push_back(s);
      v.types.push_back(essaim::TokenType::USER_DEFINED);
    }
    v.tokens.push_back("<|im_end|>");
    v.types.push_back(essaim::TokenType::CONTROL);
    v.eos_id = uint32_t(v.tokens.size() - 1);
    return std::move(essaim::Tokenizer::create(std::move(v))).value();
  }();
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace essaim;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t cut = in.find('\0');  // schema \0 bytes to match
  const std::string_view schema_text = in.substr(0, cut);
  const std::string_view tail = cut == std::string_view::npos ? std::string_view() : in.substr(cut + 1);
  const nlohmann::ordered_json schema = nlohmann::ordered_json::parse(schema_text, nullptr, false);
  if (schema.is_discarded()) return 0;
  const StructuredOutputOptions options{.in_reasoning = size % 2 == 1,
                                        .limits = {.max_elements = 20'000, .max_states = 2'000, .max_frames = 20'000,
                                                   .max_stacks = 64, .max_cached_masks = 4}};
  auto g = json_schema_grammar(schema, options);
  if (!g) {
    require(!g.status().message().empty());
    return 0;
  }
  static const TokenTrie trie(tokenizer());
  GrammarMatcher m(*g);
  const std::vector<TokenId> eog = tokenizer().eog_ids();
  for (char c : tail.substr(0, 256)) {
    const TokenMask& mask = m.allowed(trie, eog);
    require(mask.count() > 0 || !m.error().empty() || (!m.can_continue() && !m.complete()));
    if (!m.accept_bytes(std::string_view(&c, 1))) break;
  }
  require(m.n_states() <= 2'000);
  return 0;
}
