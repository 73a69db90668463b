// libFuzzer target for the text layer's untrusted inputs. The first byte picks what the rest is:
//   even: text to tokenize (both special-parsing modes) with a small byte-level BPE vocabulary; checks that
//         decode(encode(s)) == utf8_sanitize(s) and that the streaming detokeniser only emits valid UTF-8;
//   odd:  a Hugging Face tokenizer.json to import; whatever imports must build a tokenizer or be refused cleanly,
//         and then tokenize a fixed text.
#include <cstdint>
#include <cstdio>
#include <string>
#include <unistd.h>

#include "text/byte_unicode.h"
#include "text/tokenizer.h"

namespace essaim {
namespace {

Tokenizer make_tokenizer() {
  Vocab v;
  for (int b = 0; b < 256; ++b) {
    v.tokens.push_back(byte_level_encode(std::string(1, char(b))));
    v.types.push_back(TokenType::NORMAL);
  }
  for (const char* m : {"\xC4\xA0 t", "h e", "\xC4\xA0t he", "a a", "aa aa", "i n", "\xC4\xA0 \xC4\xA0"}) {
    const std::string merge = m;
    const size_t space = merge.find(' ');
    v.merges.push_back(merge);
    v.tokens.push_back(merge.substr(0, space) + merge.substr(space + 1));
    v.types.push_back(TokenType::NORMAL);
  }
  for (const char* s : {"<|im_start|>", "<|im_end|>", "<|endoftext|>"}) {
    v.tokens.push_back(s);
    v.types.push_back(TokenType::CONTROL);
  }
  v.tokens.push_back("<think>");
  v.types.push_back(TokenType::USER_DEFINED);
  Result<Tokenizer> t = Tokenizer::create(std::move(v));
  ESSAIM_CHECK(t.is_ok());
  return std::move(t).value();
}

void fuzz_encode(const std::string& text) {
  static const Tokenizer tok = make_tokenizer();
  for (bool special : {false, true}) {
    const std::vector<TokenId> ids = tok.encode(text, special);
    ESSAIM_CHECK(tok.decode(ids, /*render_special=*/true) == utf8_sanitize(text));
    Detokenizer detok(tok, /*render_special=*/true);
    std::string streamed;
    for (TokenId id : ids) {
      const std::string piece = detok.push(id);
      ESSAIM_CHECK(utf8_is_valid(piece));
      streamed += piece;
    }
    streamed += detok.flush();
    ESSAIM_CHECK(streamed == utf8_sanitize(text));
  }
}

void fuzz_import(const std::string& json) {
  // The importer reads a path (and a tokenizer_config.json beside it): give it a private directory.
  static const std::string dir = [] {
    char tmpl[] = "/tmp/fuzz_text_XXXXXX";
    const char* made = mkdtemp(tmpl);
    ESSAIM_CHECK(made != nullptr);
    return std::string(made);
  }();
  const std::string path = dir + "/tokenizer.json";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  ESSAIM_CHECK(f != nullptr);
  std::fwrite(json.data(), 1, json.size(), f);
  std::fclose(f);
  Result<Vocab> v = vocab_from_hf_tokenizer_json(path);
  if (!v.is_ok()) return;
  Result<Tokenizer> tok = Tokenizer::create(std::move(*v));
  if (!tok.is_ok()) return;
  const std::vector<TokenId> ids = tok->encode("Hello <|im_end|> w\xC3\xB6rld 123 \xF0\x9F\xA4\x97", true);
  for (TokenId id : ids) ESSAIM_CHECK(tok->valid(id));
  (void)tok->decode(ids, true);
}

}  // namespace
}  // namespace essaim

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    essaim::fuzz_encode(rest);
  } else {
    essaim::fuzz_import(rest);
  }
  return 0;
}
