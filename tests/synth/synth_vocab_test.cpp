// The synthetic tokenizer: GPT-2's byte map, the qwen2 word split on ASCII, merges that form a valid BPE
// (every merge joins two existing tokens into an existing token), determinism, a BPE encode of the corpus
// (docs/reference.md 7.5, written here) that compresses it, and the import of a tokenizer.json.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>

#include "synth/synth_vocab.h"
#include "synth_test_util.h"

namespace essaim {
namespace {

TEST(SynthVocab, ByteMapIsGpt2s) {
  EXPECT_EQ(synth_byte_encode(" "), "\xC4\xA0");     // U+0120 Ġ
  EXPECT_EQ(synth_byte_encode("\n"), "\xC4\x8A");    // U+010A Ċ
  EXPECT_EQ(synth_byte_encode("\xAD"), "\xC5\x83");  // U+0143
  EXPECT_EQ(synth_byte_encode(std::string(1, '\0')), "\xC4\x80");  // U+0100
  EXPECT_EQ(synth_byte_encode("Az!~"), "Az!~");
  EXPECT_EQ(synth_byte_encode("\xA1\xFF"), "\xC2\xA1\xC3\xBF");  // printable Latin-1 keeps its code point
}

TEST(SynthVocab, PlainTextTokens) {
  EXPECT_TRUE(synth_token_is_plain_text(synth_byte_encode(" the")));
  EXPECT_TRUE(synth_token_is_plain_text(synth_byte_encode("\n\n")));
  EXPECT_TRUE(synth_token_is_plain_text(synth_byte_encode("a\tb~")));
  EXPECT_FALSE(synth_token_is_plain_text(synth_byte_encode("\xE2")));  // a lone UTF-8 lead byte
  EXPECT_FALSE(synth_token_is_plain_text(synth_byte_encode("\x7F")));
  EXPECT_FALSE(synth_token_is_plain_text(synth_byte_encode(std::string(1, '\0'))));
  EXPECT_FALSE(synth_token_is_plain_text("\xE4\xB8\xAD"));  // raw UTF-8 is not the byte encoding
  EXPECT_FALSE(synth_token_is_plain_text(""));
}

TEST(SynthVocab, PreTokenizerSplitsLikeTheQwen2Regex) {
  using W = std::vector<std::string>;
  EXPECT_EQ(synth_pretokenize_ascii("Hello world"), (W{"Hello", " world"}));
  EXPECT_EQ(synth_pretokenize_ascii("it's 42!"), (W{"it", "'s", " ", "4", "2", "!"}));
  EXPECT_EQ(synth_pretokenize_ascii("a  b"), (W{"a", " ", " b"}));       // the last space leads the word
  EXPECT_EQ(synth_pretokenize_ascii("a\n\nb"), (W{"a", "\n\n", "b"}));
  EXPECT_EQ(synth_pretokenize_ascii("x \n y"), (W{"x", " \n", " y"}));   // \s*[\r\n]+ ends at the newline
  EXPECT_EQ(synth_pretokenize_ascii("(hi) ok?\n"), (W{"(hi", ")", " ok", "?\n"}));
  EXPECT_EQ(synth_pretokenize_ascii("end  "), (W{"end", "  "}));         // trailing run taken whole
  EXPECT_EQ(synth_pretokenize_ascii("I'LL go"), (W{"I", "'LL", " go"}));  // contractions ignore case
}

TEST(SynthVocab, MergesFormAValidDeterministicBpe) {
  const Vocab v = synth_default_vocab(kSynthDefaultMerges);
  EXPECT_EQ(v.model, "gpt2");
  ASSERT_EQ(v.types.size(), v.tokens.size());
  EXPECT_EQ(v.merges.size(), kSynthDefaultMerges);  // the corpus is rich enough for every merge
  std::map<std::string, size_t> id;
  for (size_t i = 0; i < v.tokens.size(); ++i) EXPECT_TRUE(id.emplace(v.tokens[i], i).second) << "dup " << v.tokens[i];
  // Ids 0..255: the byte tokens, '!' first as in GPT-2's ordering.
  std::set<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.insert(synth_byte_encode(std::string(1, char(b))));
  for (size_t i = 0; i < 256; ++i) EXPECT_TRUE(bytes.count(v.tokens[i])) << i;
  EXPECT_EQ(v.tokens[0], "!");
  for (const std::string& m : v.merges) {
    const size_t sp = m.find(' ', 1);
    ASSERT_NE(sp, std::string::npos) << m;
    const std::string a = m.substr(0, sp), b = m.substr(sp + 1);
    EXPECT_TRUE(id.count(a) && id.count(b) && id.count(a + b)) << m;
    EXPECT_LT(std::max(id[a], id[b]), id[a + b]) << m;  // a merge only builds on earlier tokens
  }
  EXPECT_EQ(v.tokens.size(), 256 + v.merges.size() + 5 - 0 * 1);
  EXPECT_TRUE(id.count("\xC4\xA0the"));  // " the" is learned
  const Vocab again = synth_default_vocab(kSynthDefaultMerges);
  EXPECT_EQ(again.tokens, v.tokens);
  EXPECT_EQ(again.merges, v.merges);
}

// docs/reference.md 7.5: per word, repeatedly merge the adjacent pair of lowest rank (leftmost on ties).
using MergeRanks = std::map<std::pair<std::string, std::string>, size_t>;

std::vector<std::string> bpe(const std::string& word, const MergeRanks& rank) {
  std::vector<std::string> s;
  for (size_t i = 0; i < word.size();) {
    const size_t len = static_cast<unsigned char>(word[i]) >= 0xC0 ? 2 : 1;
    s.push_back(word.substr(i, len));
    i += len;
  }
  for (;;) {
    size_t best = SIZE_MAX, at = 0;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      auto it = rank.find({s[i], s[i + 1]});
      if (it != rank.end() && it->second < best) {
        best = it->second;
        at = i;
      }
    }
    if (best == SIZE_MAX) return s;
    s[at] += s[at + 1];
    s.erase(s.begin() + long(at) + 1);
  }
}

TEST(SynthVocab, EncodingTheCorpusCompressesIt) {
  const Vocab v = synth_default_vocab(kSynthDefaultMerges);
  MergeRanks rank;
  for (size_t i = 0; i < v.merges.size(); ++i) {
    const size_t sp = v.merges[i].find(' ', 1);
    rank[{v.merges[i].substr(0, sp), v.merges[i].substr(sp + 1)}] = i;
  }
  std::set<std::string> tokens(v.tokens.begin(), v.tokens.end());
  size_t n_tokens = 0;
  const std::string_view text = synth_corpus();
  for (const std::string& w : synth_pretokenize_ascii(text)) {
    for (const std::string& piece : bpe(synth_byte_encode(w), rank)) {
      EXPECT_TRUE(tokens.count(piece)) << piece;
      ++n_tokens;
    }
  }
  EXPECT_LT(double(n_tokens), 0.45 * double(text.size()));  // several bytes per token on its own corpus
}

TEST(SynthVocab, ArchitecturePreAndTemplate) {
  Result<Vocab> q3 = synth_vocab_for(synth_arch(SynthArch::QWEN3MOE), "");
  Result<Vocab> q35 = synth_vocab_for(synth_arch(SynthArch::QWEN35MOE), "");
  ASSERT_TRUE(q3.is_ok() && q35.is_ok());
  EXPECT_EQ(q3->pre, "qwen2");
  EXPECT_EQ(q35->pre, "qwen35");
  EXPECT_NE(q35->chat_template.find("<think>"), std::string::npos);
  EXPECT_NE(q3->chat_template, q35->chat_template);
}

// A small Qwen-style tokenizer.json (Split regex + ByteLevel, added specials) embedded through --tokenizer.
TEST(SynthVocab, ImportsAHuggingFaceTokenizerJson) {
  const std::string path = synth_test::scratch_file("tokenizer.json");
  {
    std::ofstream out(path);
    out << R"({"model": {"type": "BPE", "vocab": {"h": 0, "i": 1, "hi": 2, "\u0120": 3, "\u0120hi": 4},
      "merges": ["h i", "\u0120 hi"]},
      "added_tokens": [{"id": 5, "content": "<|endoftext|>", "special": true},
                       {"id": 6, "content": "<|im_start|>", "special": true},
                       {"id": 7, "content": "<|im_end|>", "special": true},
                       {"id": 8, "content": "<think>", "special": false}],
      "normalizer": null,
      "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": )"
           R"("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*)"
           R"(|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
         "behavior": "Isolated", "invert": false},
        {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]}})";
  }
  Result<Vocab> v = synth_vocab_for(synth_arch(SynthArch::QWEN35MOE), path);
  ASSERT_TRUE(v.is_ok()) << v.status().message();
  EXPECT_EQ(v->tokens, (std::vector<std::string>{"h", "i", "hi", "\xC4\xA0", "\xC4\xA0hi", "<|endoftext|>",
                                                 "<|im_start|>", "<|im_end|>", "<think>"}));
  EXPECT_EQ(v->types[7], TokenType::CONTROL);
  EXPECT_EQ(v->types[8], TokenType::USER_DEFINED);
  EXPECT_EQ(v->eos_id, 7u);
  EXPECT_EQ(v->pre, "qwen2");  // what its regex is, whatever the architecture
  EXPECT_FALSE(v->chat_template.empty());

  // The vocabulary size sets token_embd / output ne[1].
  const std::string model = synth_test::scratch_file("imported.gguf");
  const SynthPlan plan = synth_test::write_model(
      {.arch = SynthArch::QWEN35MOE, .types = SynthTypeMix::Q4_K_M, .tokenizer_json = path}, model);
  Result<GgufFile> f = GgufFile::open(model);
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  EXPECT_EQ(f->find_tensor("token_embd.weight")->ne[1], 9);
  EXPECT_EQ(f->find_tensor("output.weight")->ne[1], 9);
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens")->size(), 9u);
  EXPECT_EQ(f->get_u32("tokenizer.ggml.eos_token_id"), 7u);
}

}  // namespace
}  // namespace essaim
