#include "text/pre_tokenizer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "text/byte_unicode.h"

namespace essaim {
namespace {

using Words = std::vector<std::string>;

Words split(const std::string& name, const std::string& text) {
  Result<PreTokenizer> pre = PreTokenizer::create(name);
  EXPECT_TRUE(pre.is_ok()) << pre.status().message();
  if (!pre) return {};
  Words out;
  for (std::string_view w : pre->split(text)) out.emplace_back(w);
  return out;
}

// The rows of docs/reference.md 7.4's table, one case (or more) each, for qwen2.
TEST(PreTokenizerQwen2, Contractions) {
  EXPECT_EQ(split("qwen2", "I'm"), (Words{"I", "'m"}));
  EXPECT_EQ(split("qwen2", "they're we've you'll he'd it's don't"),
            (Words{"they", "'re", " we", "'ve", " you", "'ll", " he", "'d", " it", "'s", " don", "'t"}));
  EXPECT_EQ(split("qwen2", "DON'T SHE'LL"), (Words{"DON", "'T", " SHE", "'LL"}));
  EXPECT_EQ(split("qwen2", "'x"), (Words{"'x"}));  // not a contraction: apostrophe leads the letters
  // Only ASCII case variants count: U+017F (long s) folds to s under case folding but is no contraction.
  EXPECT_EQ(split("qwen2", "it'\xC5\xBF"), (Words{"it", "'\xC5\xBF"}));
}

TEST(PreTokenizerQwen2, LettersWithOneLeadingCharacter) {
  EXPECT_EQ(split("qwen2", "Hello world"), (Words{"Hello", " world"}));
  EXPECT_EQ(split("qwen2", "\thello"), (Words{"\thello"}));
  EXPECT_EQ(split("qwen2", "(hello)"), (Words{"(hello", ")"}));
  EXPECT_EQ(split("qwen2", "\nhello"), (Words{"\n", "hello"}));  // CR/LF never lead a word
  EXPECT_EQ(split("qwen2", "caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD"), (Words{"caf\xC3\xA9", " \xE4\xBD\xA0\xE5\xA5\xBD"}));
}

TEST(PreTokenizerQwen2, DigitsOneByOne) {
  EXPECT_EQ(split("qwen2", "12345"), (Words{"1", "2", "3", "4", "5"}));
  EXPECT_EQ(split("qwen2", "x1.5"), (Words{"x", "1", ".", "5"}));
  EXPECT_EQ(split("qwen2", " 42"), (Words{" ", "4", "2"}));
  EXPECT_EQ(split("qwen2", "\xD9\xA3\xD9\xA4"), (Words{"\xD9\xA3", "\xD9\xA4"}));  // Arabic-Indic digits are \p{N}
}

TEST(PreTokenizerQwen2, PunctuationRuns) {
  EXPECT_EQ(split("qwen2", "hello!!!\n\nworld"), (Words{"hello", "!!!\n\n", "world"}));
  EXPECT_EQ(split("qwen2", "a ...b"), (Words{"a", " ...", "b"}));
  EXPECT_EQ(split("qwen2", "\xF0\x9F\xA4\x97\xF0\x9F\x8E\x89"), (Words{"\xF0\x9F\xA4\x97\xF0\x9F\x8E\x89"}));
}

TEST(PreTokenizerQwen2, NewlineRuns) {
  EXPECT_EQ(split("qwen2", "a\n\nb"), (Words{"a", "\n\n", "b"}));
  EXPECT_EQ(split("qwen2", "a \n b"), (Words{"a", " \n", " b"}));
  EXPECT_EQ(split("qwen2", "a\r\n\r\nb"), (Words{"a", "\r\n\r\n", "b"}));
  EXPECT_EQ(split("qwen2", "x  \n\t\n  y"), (Words{"x", "  \n\t\n", " ", " y"}));
}

TEST(PreTokenizerQwen2, WhitespaceBeforeTextKeepsItsLastCharacterForTheWord) {
  EXPECT_EQ(split("qwen2", "a  b"), (Words{"a", " ", " b"}));
  EXPECT_EQ(split("qwen2", "a     b"), (Words{"a", "    ", " b"}));
  EXPECT_EQ(split("qwen2", "  ?!"), (Words{" ", " ?!"}));
  EXPECT_EQ(split("qwen2", "a   "), (Words{"a", "   "}));  // at the end the whole run is taken
  EXPECT_EQ(split("qwen2", "   "), (Words{"   "}));
}

TEST(PreTokenizerQwen2, RemainingWhitespace) {
  EXPECT_EQ(split("qwen2", "a \t1"), (Words{"a", " ", "\t", "1"}));  // "\t" before a digit: rule 7
  EXPECT_EQ(split("qwen2", "\xC2\xA0" "a"), (Words{"\xC2\xA0" "a"}));  // NBSP is not CR/LF/letter: leads the word
  EXPECT_EQ(split("qwen2", "a\xE3\x80\x80\xE3\x80\x80" "b"), (Words{"a", "\xE3\x80\x80", "\xE3\x80\x80" "b"}));
}

TEST(PreTokenizerQwen35, LettersAbsorbCombiningMarks) {
  const std::string e_acute = "e\xCC\x81";  // e + U+0301
  EXPECT_EQ(split("qwen2", "caf" + e_acute), (Words{"caf" "e", "\xCC\x81"}));
  EXPECT_EQ(split("qwen35", "caf" + e_acute), (Words{"caf" + e_acute}));
  // Devanagari vowel signs are marks: one word for qwen35, split by qwen2.
  const std::string hindi = "\xE0\xA4\xB9\xE0\xA4\xBF\xE0\xA4\x82\xE0\xA4\xA6\xE0\xA5\x80";  // हिंदी
  EXPECT_EQ(split("qwen35", hindi).size(), 1u);
  EXPECT_GT(split("qwen2", hindi).size(), 1u);
}

TEST(PreTokenizerGpt2, Pattern) {
  EXPECT_EQ(split("gpt-2", "Hello  world's 123!"), (Words{"Hello", " ", " world", "'s", " 123", "!"}));
  EXPECT_EQ(split("gpt-2", "\tx"), (Words{"\t", "x"}));  // no lead other than a space
}

TEST(PreTokenizerDefault, RegexSequence) {
  EXPECT_EQ(split("default", "a+b=12345"), (Words{"a", "+", "b", "=", "123", "45"}));
  EXPECT_EQ(split("default", "Hi, there"), (Words{"Hi", ",", " there"}));
}

TEST(PreTokenizer, UnknownNameIsRefused) {
  Result<PreTokenizer> pre = PreTokenizer::create("llama-bpe-ish");
  ASSERT_FALSE(pre.is_ok());
  EXPECT_NE(pre.status().message().find("llama-bpe-ish"), std::string::npos);
  EXPECT_NE(pre.status().message().find("qwen2"), std::string::npos);
}

TEST(PreTokenizer, RecognisesHuggingFaceSpelling) {
  const std::string qwen2 =
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
      "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  EXPECT_EQ(PreTokenizer::name_for_hf_regex(qwen2), "qwen2");
  EXPECT_EQ(PreTokenizer::name_for_hf_regex(qwen2 + "|x"), "");
}

// Pieces always concatenate back to the input, whatever the text (seeded random mixes of scripts).
TEST(PreTokenizer, PiecesConcatenateToInput) {
  const std::vector<std::string> atoms = {"a", "Z", " ", "  ", "\t", "\n", "\r\n", "7", "'s", "'", "!", "\xC3\xA9",
                                          "\xE4\xB8\xAD", "\xF0\x9F\x98\x80", "e\xCC\x81", "\xC2\xA0", "-", "_"};
  std::mt19937 rng(11);
  size_t total_pieces = 0;
  for (const std::string& name : PreTokenizer::known_names()) {
    Result<PreTokenizer> pre = PreTokenizer::create(name);
    ASSERT_TRUE(pre.is_ok());
    for (int trial = 0; trial < 300; ++trial) {
      std::string text;
      const int n = int(rng() % 40);
      for (int i = 0; i < n; ++i) text += atoms[rng() % atoms.size()];
      std::string joined;
      const std::vector<std::string_view> pieces = pre->split(text);
      for (std::string_view p : pieces) {
        ASSERT_FALSE(p.empty());
        joined += p;
      }
      ASSERT_EQ(joined, text) << name;
      total_pieces += pieces.size();
    }
  }
  EXPECT_GT(total_pieces, 10000u);
}

TEST(PreTokenizer, LongInputsAreLinear) {
  Result<PreTokenizer> pre = PreTokenizer::create("qwen2");
  ASSERT_TRUE(pre.is_ok());
  const auto start = std::chrono::steady_clock::now();
  for (const std::string& text : {std::string(1 << 20, ' '), std::string(1 << 20, 'x'), std::string(1 << 20, '!'),
                                  std::string(1 << 20, '\n')}) {
    const std::vector<std::string_view> pieces = pre->split(text);
    ASSERT_LE(pieces.size(), 2u);
    EXPECT_EQ(pieces[0].size() + (pieces.size() > 1 ? pieces[1].size() : 0), text.size());
  }
  std::string mixed;
  while (mixed.size() < (1u << 20)) mixed += "The quick brown fox, 1234 jumps!  \n\t ";
  EXPECT_GT(pre->split(mixed).size(), 200000u);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 5.0);
}

}  // namespace
}  // namespace essaim
