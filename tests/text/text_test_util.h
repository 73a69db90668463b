// Helpers shared by the text tests: a small byte-level BPE vocabulary built like the fixtures' (all 256 byte
// tokens in GPT-2 order, then one token per merge, then special tokens), so expected ids can be derived by hand.
//
//   Vocab v = make_vocab({"Ġ t", "h e"}, {{"<|im_end|>", TokenType::CONTROL}});
//   Tokenizer tok = make_tokenizer(v);
//   TokenId he = id_of(tok, "he");
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "text/byte_unicode.h"
#include "text/tokenizer.h"
#include "text/vocab.h"

namespace essaim::test {

// Byte tokens come first, ordered as GPT-2's bytes_to_unicode lists them: the bytes that map to themselves
// (0x21-0x7E, 0xA1-0xAC, 0xAE-0xFF), then the remapped ones in increasing order (the fixtures' layout).
inline Vocab make_vocab(const std::vector<std::string>& merges,
                        const std::vector<std::pair<std::string, TokenType>>& specials = {},
                        const std::string& pre = "qwen2") {
  Vocab v;
  v.pre = pre;
  std::vector<int> order;
  for (int b = 0; b < 256; ++b) {
    if (byte_to_codepoint(uint8_t(b)) == uint32_t(b)) order.push_back(b);
  }
  for (int b = 0; b < 256; ++b) {
    if (byte_to_codepoint(uint8_t(b)) != uint32_t(b)) order.push_back(b);
  }
  for (int b : order) {
    v.tokens.push_back(byte_level_encode(std::string(1, char(b))));
    v.types.push_back(TokenType::NORMAL);
  }
  for (const std::string& m : merges) {
    const size_t space = m.find(' ', 1);
    v.merges.push_back(m);
    v.tokens.push_back(m.substr(0, space) + m.substr(space + 1));
    v.types.push_back(TokenType::NORMAL);
  }
  for (const auto& [text, type] : specials) {
    v.tokens.push_back(text);
    v.types.push_back(type);
  }
  return v;
}

inline Tokenizer make_tokenizer(Vocab v) {
  Result<Tokenizer> t = Tokenizer::create(std::move(v));
  EXPECT_TRUE(t.is_ok()) << t.status().message();
  return std::move(t).value();
}

inline TokenId id_of(const Tokenizer& tok, const std::string& text) {
  const std::optional<TokenId> id = tok.find(text);
  EXPECT_TRUE(id.has_value()) << "no token '" << text << "'";
  return id.value_or(-1);
}

// Ids of the byte tokens of raw text, one per byte.
inline std::vector<TokenId> byte_ids(const Tokenizer& tok, const std::string& raw) {
  std::vector<TokenId> ids;
  for (char c : raw) ids.push_back(id_of(tok, byte_level_encode(std::string(1, c))));
  return ids;
}

}  // namespace essaim::test
