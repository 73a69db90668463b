#include "text/vocab.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "text/tokenizer.h"
#include "text_test_util.h"

namespace essaim {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, for tokenizer.json / tokenizer_config.json pairs.
fs::path test_dir() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir = fs::path(::testing::TempDir()) / (std::string("vocab_") + info->test_suite_name() + "_" + info->name());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// s with the first occurrence of `from` replaced by `to` (which must be there).
std::string replace_once(std::string s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) s.replace(at, from.size(), to);
  return s;
}

std::string write_file(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
  return path.string();
}

const char* QWEN2_SPLIT =
    R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},"behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":false,"use_regex":false}]})";

// A miniature Qwen-style tokenizer.json: vocab 0..4, merges in both spellings, added tokens from id 6 (id 5 is a
// gap), one special, one that merely looks special, one plain.
std::string mini_tokenizer_json(const std::string& pre = QWEN2_SPLIT, const std::string& merges = R"(["a b", ["ab", "c"]])") {
  return R"({"version":"1.0","normalizer":{"type":"NFC"},"pre_tokenizer":)" + pre + R"(,
    "added_tokens":[
      {"id":6,"content":"<|endoftext|>","special":true},
      {"id":7,"content":"<|im_end|>","special":true},
      {"id":8,"content":"<|fim_pad|>","special":false},
      {"id":9,"content":"<think>","special":false}],
    "model":{"type":"BPE","vocab":{"a":0,"b":1,"c":2,"ab":3,"abc":4},"merges":)" + merges + "}}";
}

TEST(HfImport, VocabMergesAddedTokensAndGaps) {
  const fs::path dir = test_dir();
  Result<Vocab> v = vocab_from_hf_tokenizer_json(write_file(dir / "tokenizer.json", mini_tokenizer_json()));
  ASSERT_TRUE(v.is_ok()) << v.status().message();
  EXPECT_EQ(v->pre, "qwen2");
  EXPECT_EQ(v->tokens, (std::vector<std::string>{"a", "b", "c", "ab", "abc", "[PAD5]", "<|endoftext|>",
                                                 "<|im_end|>", "<|fim_pad|>", "<think>"}));
  EXPECT_EQ(v->types, (std::vector<TokenType>{TokenType::NORMAL, TokenType::NORMAL, TokenType::NORMAL,
                                              TokenType::NORMAL, TokenType::NORMAL, TokenType::UNUSED,
                                              TokenType::CONTROL, TokenType::CONTROL, TokenType::CONTROL,
                                              TokenType::USER_DEFINED}));
  EXPECT_EQ(v->merges, (std::vector<std::string>{"a b", "ab c"}));
  EXPECT_EQ(v->bos_id, std::optional<uint32_t>(6));
  EXPECT_EQ(v->pad_id, std::optional<uint32_t>(6));
  EXPECT_EQ(v->eos_id, std::optional<uint32_t>(7));
  EXPECT_FALSE(v->add_bos);
  EXPECT_TRUE(v->chat_template.empty());

  Result<Tokenizer> tok = Tokenizer::create(*v);
  ASSERT_TRUE(tok.is_ok()) << tok.status().message();
  EXPECT_EQ(tok->encode("abc<think>ab<|im_end|>"), (std::vector<TokenId>{4, 9, 3, 7}));
}

TEST(HfImport, TokenizerConfigOverridesSpecialsAndSuppliesTemplate) {
  const fs::path dir = test_dir();
  write_file(dir / "tokenizer_config.json",
             R"({"eos_token":{"content":"<|endoftext|>"},"bos_token":null,"add_bos_token":false,
                 "chat_template":"{{ '<|im_start|>' }}"})");
  Result<Vocab> v = vocab_from_hf_tokenizer_json(write_file(dir / "tokenizer.json", mini_tokenizer_json()));
  ASSERT_TRUE(v.is_ok()) << v.status().message();
  EXPECT_EQ(v->eos_id, std::optional<uint32_t>(6));
  EXPECT_EQ(v->bos_id, std::optional<uint32_t>(6));  // null keeps the Qwen convention
  EXPECT_EQ(v->chat_template, "{{ '<|im_start|>' }}");
}

TEST(HfImport, RecognisesPreTokenizers) {
  const fs::path dir = test_dir();
  std::string qwen35 = replace_once(QWEN2_SPLIT, R"(?\\p{L}+)", R"(?[\\p{L}\\p{M}]+)");
  qwen35 = replace_once(qwen35, R"([^\\s\\p{L}\\p{N}])", R"([^\\s\\p{L}\\p{M}\\p{N}])");
  Result<Vocab> v = vocab_from_hf_tokenizer_json(write_file(dir / "q35.json", mini_tokenizer_json(qwen35)));
  ASSERT_TRUE(v.is_ok()) << v.status().message();
  EXPECT_EQ(v->pre, "qwen35");

  v = vocab_from_hf_tokenizer_json(write_file(
      dir / "gpt2.json", mini_tokenizer_json(R"({"type":"ByteLevel","add_prefix_space":false,"use_regex":true})")));
  ASSERT_TRUE(v.is_ok()) << v.status().message();
  EXPECT_EQ(v->pre, "gpt-2");

  const std::string other = replace_once(QWEN2_SPLIT, R"(|\\p{N}|)", R"(|\\p{N}{1,3}|)");
  v = vocab_from_hf_tokenizer_json(write_file(dir / "other.json", mini_tokenizer_json(other)));
  ASSERT_FALSE(v.is_ok());
  EXPECT_NE(v.status().message().find("not recognised"), std::string::npos) << v.status().message();

  v = vocab_from_hf_tokenizer_json(write_file(
      dir / "prefix.json", mini_tokenizer_json(R"({"type":"ByteLevel","add_prefix_space":true,"use_regex":true})")));
  EXPECT_FALSE(v.is_ok());
}

TEST(HfImport, RefusesMalformedFilesWithClearMessages) {
  const fs::path dir = test_dir();
  const auto error_of = [&](const std::string& name, const std::string& text) {
    Result<Vocab> v = vocab_from_hf_tokenizer_json(write_file(dir / name, text));
    EXPECT_FALSE(v.is_ok()) << name;
    return v.is_ok() ? std::string() : v.status().message();
  };
  EXPECT_NE(error_of("a.json", "{not json").find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of("b.json", "{}").find("model"), std::string::npos);
  EXPECT_NE(error_of("c.json", mini_tokenizer_json(QWEN2_SPLIT, R"([42])")).find("merge"), std::string::npos);
  const std::string unigram = replace_once(mini_tokenizer_json(), R"("BPE")", R"("Unigram")");
  EXPECT_NE(error_of("d.json", unigram).find("BPE"), std::string::npos);
  const std::string huge_id = replace_once(mini_tokenizer_json(), R"("abc":4)", R"("abc":4000000000)");
  EXPECT_NE(error_of("e.json", huge_id).find("out of range"), std::string::npos);
  const std::string sparse = replace_once(mini_tokenizer_json(), R"("abc":4)", R"("abc":16000000)");
  EXPECT_NE(error_of("e2.json", sparse).find("for only"), std::string::npos);
  const std::string dup = replace_once(mini_tokenizer_json(), R"("abc":4)", R"("abc":3)");
  EXPECT_NE(error_of("f.json", dup).find("twice"), std::string::npos);
  const std::string lower = replace_once(mini_tokenizer_json(), R"("NFC")", R"("Lowercase")");
  EXPECT_NE(error_of("g.json", lower).find("normalizer"), std::string::npos);
  EXPECT_NE(error_of("h.json", "[1,2]").find("model"), std::string::npos);
  Result<Vocab> missing = vocab_from_hf_tokenizer_json((dir / "absent.json").string());
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("cannot open"), std::string::npos);
}

TEST(VocabPad, AppendsUnusedFillers) {
  Vocab v = test::make_vocab({});
  vocab_pad_to(v, 260);
  ASSERT_EQ(v.tokens.size(), 260u);
  EXPECT_EQ(v.tokens[259], "[PAD259]");
  EXPECT_EQ(v.types[259], TokenType::UNUSED);
}

// --- GGUF ---------------------------------------------------------------------------------------------------

// Writes a tensor-less GGUF holding the tokenizer keys `fill` sets, and parses it back.
template <typename Fill>
Result<Vocab> gguf_vocab(Fill fill) {
  GgufWriter w;
  w.set_string("general.architecture", "qwen3moe");
  fill(w);
  const std::string path = ::testing::TempDir() + "vocab_test_" +
                           ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".gguf";
  Status s = w.begin(path);
  if (s.is_ok()) s = w.finish();
  if (!s.is_ok()) return s;
  Result<GgufFile> f = GgufFile::open(path);
  if (!f.is_ok()) return f.status();
  Result<Vocab> v = vocab_from_gguf(*f);
  std::remove(path.c_str());
  return v;
}

void good_keys(GgufWriter& w) {
  const Vocab v = test::make_vocab({"a b"}, {{"<|im_end|>", TokenType::CONTROL}});
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", "qwen2");
  w.set_array_string("tokenizer.ggml.tokens", v.tokens);
  std::vector<int32_t> types;
  for (TokenType t : v.types) types.push_back(int32_t(t));
  w.set_array_i32("tokenizer.ggml.token_type", types);
  w.set_array_string("tokenizer.ggml.merges", v.merges);
  w.set_u32("tokenizer.ggml.eos_token_id", 257);
  w.set_u32("tokenizer.ggml.bos_token_id", 99999);  // out of range: ignored
  w.set_bool("tokenizer.ggml.add_bos_token", false);
  w.set_string("tokenizer.chat_template", "{{ x }}");
}

TEST(GgufImport, ReadsEveryKey) {
  Result<Vocab> v = gguf_vocab(good_keys);
  ASSERT_TRUE(v.is_ok()) << v.status().message();
  EXPECT_EQ(v->tokens.size(), 258u);
  EXPECT_EQ(v->types[257], TokenType::CONTROL);
  EXPECT_EQ(v->merges, (std::vector<std::string>{"a b"}));
  EXPECT_EQ(v->eos_id, std::optional<uint32_t>(257));
  EXPECT_FALSE(v->bos_id.has_value());
  EXPECT_EQ(v->warnings.size(), 1u);
  EXPECT_EQ(v->chat_template, "{{ x }}");
  EXPECT_EQ(v->pre, "qwen2");
}

TEST(GgufImport, OptionalKeysDefault) {
  Result<Vocab> v = gguf_vocab([](GgufWriter& w) {
    w.set_string("tokenizer.ggml.model", "gpt2");
    w.set_array_string("tokenizer.ggml.tokens", test::make_vocab({}).tokens);
    w.set_array_string("tokenizer.ggml.merges", {});
  });
  ASSERT_TRUE(v.is_ok()) << v.status().message();
  EXPECT_EQ(v->pre, "default");
  ASSERT_EQ(v->warnings.size(), 1u);
  EXPECT_NE(v->warnings[0].find("tokenizer.ggml.pre"), std::string::npos);
  for (TokenType t : v->types) ASSERT_EQ(t, TokenType::NORMAL);
  EXPECT_FALSE(v->add_bos);
}

TEST(GgufImport, MissingOrMistypedKeysAreNamed) {
  const auto error_of = [](auto mutate) {
    Result<Vocab> v = gguf_vocab([&](GgufWriter& w) {
      good_keys(w);
      mutate(w);
    });
    EXPECT_FALSE(v.is_ok());
    return v.is_ok() ? std::string() : v.status().message();
  };
  std::string e = error_of([](GgufWriter& w) { w.set_array_i32("tokenizer.ggml.tokens", {1, 2}); });
  EXPECT_NE(e.find("tokenizer.ggml.tokens: expected array of STRING"), std::string::npos) << e;
  e = error_of([](GgufWriter& w) { w.set_array_u32("tokenizer.ggml.token_type", std::vector<uint32_t>(258, 1)); });
  EXPECT_NE(e.find("tokenizer.ggml.token_type: expected array of INT32"), std::string::npos) << e;
  e = error_of([](GgufWriter& w) { w.set_array_i32("tokenizer.ggml.token_type", {1, 1}); });
  EXPECT_NE(e.find("2 entries for 258 tokens"), std::string::npos) << e;
  e = error_of([](GgufWriter& w) { w.set_i32("tokenizer.ggml.eos_token_id", 257); });
  EXPECT_NE(e.find("tokenizer.ggml.eos_token_id: expected UINT32"), std::string::npos) << e;
  e = error_of([](GgufWriter& w) { w.set_u8("tokenizer.ggml.add_bos_token", 1); });
  EXPECT_NE(e.find("tokenizer.ggml.add_bos_token: expected BOOL"), std::string::npos) << e;
  e = error_of([](GgufWriter& w) { w.set_string("tokenizer.ggml.model", "llama"); });
  EXPECT_NE(e.find("only gpt2"), std::string::npos) << e;
  e = error_of([](GgufWriter& w) { w.set_u32("tokenizer.ggml.pre", 2); });
  EXPECT_NE(e.find("tokenizer.ggml.pre: expected STRING"), std::string::npos) << e;

  Result<Vocab> v = gguf_vocab([](GgufWriter& w) { w.set_string("tokenizer.ggml.model", "gpt2"); });
  ASSERT_FALSE(v.is_ok());
  EXPECT_NE(v.status().message().find("missing required key tokenizer.ggml.tokens"), std::string::npos);
  v = gguf_vocab([](GgufWriter& w) {
    w.set_string("tokenizer.ggml.model", "gpt2");
    w.set_array_string("tokenizer.ggml.tokens", {"a"});
  });
  ASSERT_FALSE(v.is_ok());
  EXPECT_NE(v.status().message().find("tokenizer.ggml.merges"), std::string::npos);
}

// The llama.cpp-written fixtures: 279 tokens (256 bytes, 20 merges, 3 specials), pre qwen2.
TEST(GgufImport, FixturesTokenize) {
  const std::vector<std::string> merges = {"\xC4\xA0 t", "\xC4\xA0 a", "h e",  "i n",   "r e",    "o n",   "\xC4\xA0t he",
                                           "e r",        "\xC4\xA0 s", "a t",  "\xC4\xA0 w", "o r", "e n",   "\xC4\xA0 c",
                                           "i s",        "l l",        "H e",  "He ll", "Hell o", "\xC4\xA0 o"};
  for (const char* name : {"qwen3moe-small-f32.gguf", "qwen3moe-small-q4k.gguf", "qwen35moe-small-f32.gguf",
                           "qwen35moe-small-q4k.gguf"}) {
    SCOPED_TRACE(name);
    Result<GgufFile> f = GgufFile::open(std::string(ESSAIM_FIXTURES_DIR) + "/" + name);
    ASSERT_TRUE(f.is_ok()) << f.status().message();
    Result<Vocab> v = vocab_from_gguf(*f);
    ASSERT_TRUE(v.is_ok()) << v.status().message();
    EXPECT_EQ(v->tokens.size(), 279u);
    EXPECT_EQ(v->pre, "qwen2");
    EXPECT_EQ(v->merges, merges);
    Result<Tokenizer> tok = Tokenizer::create(*v);
    ASSERT_TRUE(tok.is_ok()) << tok.status().message();
    EXPECT_EQ(tok->encode("Hello world"), (std::vector<TokenId>{274, 266, 267, 75, 67}));
    EXPECT_EQ(tok->encode("<|im_start|>user\nthe<|im_end|>"),
              (std::vector<TokenId>{277, 84, 82, 263, 198, 83, 258, 278}));
    EXPECT_TRUE(tok->is_eog(278));
    EXPECT_TRUE(tok->is_eog(276));
    EXPECT_FALSE(tok->is_eog(277));
    for (const std::string s : {"The weather is nice, isn't it?", "caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80",
                                "  spaces\tand\nnewlines  "}) {
      const std::vector<TokenId> ids = tok->encode(s);
      for (TokenId id : ids) EXPECT_TRUE(id >= 0 && id < 279);
      EXPECT_EQ(tok->decode(ids), s);
    }
  }
}

}  // namespace
}  // namespace essaim
