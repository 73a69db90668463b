#include "text/tokenizer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "text/byte_unicode.h"
#include "text_test_util.h"

namespace essaim {
namespace {

using test::byte_ids;
using test::id_of;
using test::make_tokenizer;
using test::make_vocab;
using Ids = std::vector<TokenId>;

TEST(Bpe, LowestRankMergesFirst) {
  const Tokenizer ab_first = make_tokenizer(make_vocab({"a b", "b c"}));
  EXPECT_EQ(ab_first.encode("abc"), (Ids{id_of(ab_first, "ab"), id_of(ab_first, "c")}));
  const Tokenizer bc_first = make_tokenizer(make_vocab({"b c", "a b"}));
  EXPECT_EQ(bc_first.encode("abc"), (Ids{id_of(bc_first, "a"), id_of(bc_first, "bc")}));
}

TEST(Bpe, EqualRanksMergeLeftmostFirst) {
  const Tokenizer tok = make_tokenizer(make_vocab({"a a", "aa aa"}));
  EXPECT_EQ(tok.encode("aaa"), (Ids{id_of(tok, "aa"), id_of(tok, "a")}));
  EXPECT_EQ(tok.encode("aaaa"), (Ids{id_of(tok, "aaaa")}));
  EXPECT_EQ(tok.encode("aaaaa"), (Ids{id_of(tok, "aaaa"), id_of(tok, "a")}));
}

TEST(Bpe, MergedSymbolsMeetTheirNewNeighbours) {
  const Tokenizer tok = make_tokenizer(make_vocab({"b c", "a bc", "abc d"}));
  EXPECT_EQ(tok.encode("abcd"), (Ids{id_of(tok, "abcd")}));
  EXPECT_EQ(tok.encode("abce"), (Ids{id_of(tok, "abc"), id_of(tok, "e")}));
}

TEST(Bpe, WordsNeverMergeAcrossPreTokenizerBoundaries) {
  // "\xC4\xA0" is the byte-level image of a space ("Ġ").
  const Tokenizer tok = make_tokenizer(make_vocab({"\xC4\xA0 t", "h e", "\xC4\xA0t he", "e \xC4\xA0"}));
  EXPECT_EQ(tok.encode(" the"), (Ids{id_of(tok, "\xC4\xA0the")}));
  // "e " would merge if words were not split first: "he" + " " is two words.
  EXPECT_EQ(tok.encode("he  x"), (Ids{id_of(tok, "he"), id_of(tok, "\xC4\xA0"), id_of(tok, "\xC4\xA0"),
                                      id_of(tok, "x")}));
}

TEST(Bpe, SymbolMissingFromVocabularyFallsBackToBytes) {
  Vocab v = make_vocab({"x y"});
  v.tokens.back() = "not-xy";  // the merge result has no token of its own
  const Tokenizer tok = make_tokenizer(std::move(v));
  EXPECT_EQ(tok.encode("xy"), byte_ids(tok, "xy"));
}

TEST(Bpe, FixtureStyleVocabularyGoldenIds) {
  // The fixtures' merges (tests/text/vocab_test.cpp reads the same ids from the GGUF files).
  const Tokenizer tok = make_tokenizer(make_vocab({"\xC4\xA0 t", "\xC4\xA0 a", "h e", "i n", "r e", "o n",
                                                   "\xC4\xA0t he", "e r", "\xC4\xA0 s", "a t", "\xC4\xA0 w", "o r",
                                                   "e n", "\xC4\xA0 c", "i s", "l l", "H e", "He ll", "Hell o",
                                                   "\xC4\xA0 o"}));
  EXPECT_EQ(tok.encode("Hello world"), (Ids{274, 266, 267, 75, 67}));
  EXPECT_EQ(tok.n_vocab(), 276);
}

TEST(SpecialTokens, SplitLongestFirstAndOnlyWhenParsing) {
  const Tokenizer tok = make_tokenizer(make_vocab(
      {}, {{"<|im_start|>", TokenType::CONTROL}, {"<|im_end|>", TokenType::CONTROL}, {"<think>", TokenType::USER_DEFINED},
           {"<|im_start|>user", TokenType::USER_DEFINED}}));
  const TokenId start = id_of(tok, "<|im_start|>");
  const TokenId end = id_of(tok, "<|im_end|>");
  const TokenId think = id_of(tok, "<think>");
  const TokenId start_user = id_of(tok, "<|im_start|>user");

  Ids expected = {start_user};
  for (TokenId id : byte_ids(tok, "\nHi")) expected.push_back(id);
  expected.push_back(end);
  expected.push_back(think);
  EXPECT_EQ(tok.encode("<|im_start|>user\nHi<|im_end|><think>"), expected);
  EXPECT_EQ(tok.encode("<|im_start|>x"), (Ids{start, id_of(tok, "x")}));

  // parse_special off: CONTROL texts are ordinary text, USER_DEFINED ones still match.
  Ids plain = byte_ids(tok, "<|im_end|>");
  plain.push_back(think);
  EXPECT_EQ(tok.encode("<|im_end|><think>", /*parse_special=*/false), plain);
  EXPECT_EQ(tok.encode("<|im_start|>user", false), (Ids{start_user}));
}

TEST(SpecialTokens, EndOfGenerationMarkersAreForcedToControl) {
  const Tokenizer tok = make_tokenizer(make_vocab(
      {}, {{"<|endoftext|>", TokenType::CONTROL}, {"<|im_end|>", TokenType::USER_DEFINED},
           {"<|fim_pad|>", TokenType::NORMAL}, {"<|im_start|>", TokenType::CONTROL}}));
  const TokenId im_end = id_of(tok, "<|im_end|>");
  EXPECT_EQ(tok.type(im_end), TokenType::CONTROL);
  EXPECT_EQ(tok.type(id_of(tok, "<|fim_pad|>")), TokenType::CONTROL);
  EXPECT_TRUE(tok.is_eog(im_end));
  EXPECT_TRUE(tok.is_eog(id_of(tok, "<|endoftext|>")));
  EXPECT_TRUE(tok.is_eog(id_of(tok, "<|fim_pad|>")));
  EXPECT_FALSE(tok.is_eog(id_of(tok, "<|im_start|>")));
  EXPECT_FALSE(tok.is_eog(id_of(tok, "a")));
  EXPECT_EQ(tok.eog_ids().size(), 3u);
}

TEST(SpecialTokens, EosIdJoinsTheEndSet) {
  Vocab v = make_vocab({}, {{"</s>", TokenType::CONTROL}});
  v.eos_id = uint32_t(v.tokens.size() - 1);
  const Tokenizer tok = make_tokenizer(std::move(v));
  EXPECT_TRUE(tok.is_eog(id_of(tok, "</s>")));
}

TEST(Encode, InvalidUtf8BecomesReplacementCharacters) {
  const Tokenizer tok = make_tokenizer(make_vocab({}));
  EXPECT_EQ(tok.encode("a\xFF" "b"), tok.encode("a\xEF\xBF\xBD" "b"));
  EXPECT_EQ(tok.encode("\xE2\x82"), byte_ids(tok, "\xEF\xBF\xBD\xEF\xBF\xBD"));
  EXPECT_EQ(tok.decode(tok.encode("x\xC0\x80y")), "x\xEF\xBF\xBD\xEF\xBF\xBDy");
}

TEST(Encode, BosOnlyWhenTheVocabularyAsks) {
  Vocab v = make_vocab({}, {{"<s>", TokenType::CONTROL}});
  v.bos_id = uint32_t(v.tokens.size() - 1);
  EXPECT_EQ(make_tokenizer(v).encode("a"), (Ids{id_of(make_tokenizer(v), "a")}));
  v.add_bos = true;
  const Tokenizer with_bos = make_tokenizer(v);
  EXPECT_EQ(with_bos.encode("a"), (Ids{TokenId(*v.bos_id), id_of(with_bos, "a")}));
}

const std::vector<std::string>& round_trip_texts() {
  using namespace std::string_literals;
  static const std::vector<std::string> texts = {
      "",
      "Hello, world!",
      "Cr\xC3\xA8me br\xC3\xBBl\xC3\xA9\x65, na\xC3\xAFve fa\xC3\xA7\x61\x64\x65, \xC3\x85ngstr\xC3\xB6m",
      "\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C\xE3\x80\x82\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E",
      "\xF0\x9F\xA4\x97\xF0\x9F\x8E\x89 \xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x92\xBB \xF0\x9F\x87\xAB\xF0\x9F\x87\xB7",
      "   leading and trailing   ",
      "tabs\tand\t\tmore\ttabs",
      "line one\nline two\r\nline three\n\n\n",
      "0123456789 3.14159 -42 1e10 1,000,000",
      "\xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7 \xD8\xA8\xD8\xA7\xD9\x84\xD8\xB9\xD8\xA7\xD9\x84\xD9\x85 and "
      "\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82 \xCE\xB3\xCE\xB5\xCE\xB9\xCE\xB1",
      "e\xCC\x81 decomposed, \xE0\xA4\xB9\xE0\xA4\xBF\xE0\xA4\x82\xE0\xA4\xA6\xE0\xA5\x80",
      "nul\0byte and \x01\x1F controls"s,
      "\xC2\xA0nbsp\xE3\x80\x80ideographic\xE2\x80\x89thin",
      "it's DON'T we'll I'd",
      "<|im_start|>user\nHi<|im_end|>",
  };
  return texts;
}

// decode(encode(s)) == s for valid UTF-8, with and without merges covering the text.
TEST(RoundTrip, Utf8Text) {
  const Tokenizer bytes_only = make_tokenizer(make_vocab({}, {{"<|im_start|>", TokenType::CONTROL},
                                                              {"<|im_end|>", TokenType::CONTROL}}));
  const Tokenizer merged = make_tokenizer(make_vocab({"\xC4\xA0 t", "l i", "n e", "li ne", "\xC4\xA0 \xC4\xA0",
                                                      "\xC3\xA4 \xC2\xBD", "\xC4\xA0 w", "o r", "l d"}));
  for (const std::string& s : round_trip_texts()) {
    EXPECT_EQ(bytes_only.decode(bytes_only.encode(s), /*render_special=*/true), s);
    EXPECT_EQ(merged.decode(merged.encode(s)), s);
  }
  // Merges really were used (the test would pass trivially with bytes only otherwise).
  EXPECT_LT(merged.encode("line line line").size(), bytes_only.encode("line line line").size());
}

TEST(RoundTrip, RandomBytesComeBackSanitised) {
  const Tokenizer tok = make_tokenizer(make_vocab({"a b", "\xC4\xA0 a"}));
  std::mt19937 rng(3);
  size_t invalid = 0;
  for (int trial = 0; trial < 300; ++trial) {
    std::string s;
    const int n = int(rng() % 48);
    for (int i = 0; i < n; ++i) s += (rng() % 3 == 0) ? char(rng() & 0xFF) : "ab \n\xC3\xA9"[rng() % 6];
    invalid += !utf8_is_valid(s);
    ASSERT_EQ(tok.decode(tok.encode(s)), utf8_sanitize(s));
  }
  EXPECT_GT(invalid, 100u);
}

TEST(Decode, TokenTypesRenderPerReference76) {
  Vocab v = make_vocab({}, {{"<|im_end|>", TokenType::CONTROL}, {"<think>", TokenType::USER_DEFINED},
                            {"[PAD300]", TokenType::UNUSED}, {"<0x41>", TokenType::BYTE}, {"<unk>", TokenType::UNKNOWN}});
  const Tokenizer tok = make_tokenizer(std::move(v));
  EXPECT_EQ(tok.token_to_piece(id_of(tok, "\xC4\xA0")), " ");
  EXPECT_EQ(tok.token_to_piece(id_of(tok, "<|im_end|>")), "");
  EXPECT_EQ(tok.token_to_piece(id_of(tok, "<|im_end|>"), true), "<|im_end|>");
  EXPECT_EQ(tok.token_to_piece(id_of(tok, "<think>")), "<think>");
  EXPECT_EQ(tok.token_to_piece(id_of(tok, "[PAD300]"), true), "");
  EXPECT_EQ(tok.token_to_piece(id_of(tok, "<0x41>")), "A");
  EXPECT_EQ(tok.token_to_piece(id_of(tok, "<unk>")), "");
  EXPECT_EQ(tok.token_to_piece(-1), "");
  EXPECT_EQ(tok.token_to_piece(tok.n_vocab()), "");
}

TEST(Detokenizer, HoldsMultibyteCharactersAcrossTokens) {
  const Tokenizer tok = make_tokenizer(make_vocab({}));
  const std::string text = "a\xC3\xA9\xF0\x9F\xA4\x97z";  // a é 🤗 z: 1 + 2 + 4 + 1 byte tokens
  const Ids ids = tok.encode(text);
  ASSERT_EQ(ids.size(), 8u);
  Detokenizer detok(tok);
  std::vector<std::string> out;
  for (TokenId id : ids) out.push_back(detok.push(id));
  EXPECT_EQ(out, (std::vector<std::string>{"a", "", "\xC3\xA9", "", "", "", "\xF0\x9F\xA4\x97", "z"}));
  EXPECT_EQ(detok.flush(), "");
}

TEST(Detokenizer, FlushAndGarbageBecomeReplacementCharacters) {
  const Tokenizer tok = make_tokenizer(make_vocab({}, {{"<|im_end|>", TokenType::CONTROL}}));
  const Ids emoji = tok.encode("\xF0\x9F\xA4\x97");
  Detokenizer detok(tok, /*render_special=*/true);
  EXPECT_EQ(detok.push(emoji[0]), "");
  EXPECT_EQ(detok.push(emoji[1]), "");
  // A complete token arriving mid-character: the unfinished bytes can never complete.
  EXPECT_EQ(detok.push(id_of(tok, "<|im_end|>")), "\xEF\xBF\xBD\xEF\xBF\xBD<|im_end|>");
  EXPECT_EQ(detok.push(emoji[0]), "");
  EXPECT_EQ(detok.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(detok.flush(), "");
}

TEST(Create, RefusesMalformedVocabularies) {
  Vocab bad_types = make_vocab({});
  bad_types.types.pop_back();
  EXPECT_FALSE(Tokenizer::create(bad_types).is_ok());
  Vocab bad_merge = make_vocab({});
  bad_merge.merges.push_back("nospace");
  Result<Tokenizer> r = Tokenizer::create(bad_merge);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("merges[0]"), std::string::npos);
  Vocab bad_pre = make_vocab({}, {}, "wat");
  EXPECT_FALSE(Tokenizer::create(bad_pre).is_ok());
  Vocab bad_model = make_vocab({});
  bad_model.model = "llama";
  EXPECT_FALSE(Tokenizer::create(bad_model).is_ok());
  EXPECT_FALSE(Tokenizer::create(Vocab{}).is_ok());
}

TEST(Encode, LongInputsAreFast) {
  const Tokenizer tok = make_tokenizer(make_vocab({"a a", "aa aa", "aaaa aaaa", "\xC4\xA0 a", "b c"}));
  const auto start = std::chrono::steady_clock::now();
  const std::string word(1 << 18, 'a');  // one 256 KiB word: the merge queue must not be quadratic
  const Ids ids = tok.encode(word);
  EXPECT_EQ(ids.size(), size_t(1 << 15));
  std::string prose;
  while (prose.size() < (1u << 20)) prose += "abc bca cab aaaa, 123 \n";
  EXPECT_EQ(tok.decode(tok.encode(prose)), prose);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 10.0);
}

}  // namespace
}  // namespace essaim

namespace essaim {
namespace {

// The model's tokenizer declares NFC (Qwen's tokenizer.json; inferred for GGUF qwen2/qwen35): text that is
// not NFC tokenizes as its composed form. Without a normaliser the two spellings differ, as in llama.cpp.
TEST(Normalizer, NfcBeforePreTokenisation) {
  Vocab with = test::make_vocab({"c a", "ca f", "\xC3 \xA9"});
  with.normalizer = "NFC";
  const Tokenizer nfc = test::make_tokenizer(with);
  const Tokenizer raw = test::make_tokenizer(test::make_vocab({"c a", "ca f", "\xC3 \xA9"}));
  const std::string composed = "caf\xC3\xA9";     // café, U+00E9
  const std::string decomposed = "cafe\xCC\x81";  // cafe + U+0301
  EXPECT_EQ(nfc.encode(decomposed), nfc.encode(composed));
  EXPECT_NE(raw.encode(decomposed), raw.encode(composed));
  EXPECT_EQ(nfc.decode(nfc.encode(decomposed)), composed);
  // Canonical reordering as well as composition; ASCII and special tokens untouched.
  EXPECT_EQ(utf8_nfc("e\xCC\x81\xCC\xA3"), utf8_nfc("e\xCC\xA3\xCC\x81"));
  EXPECT_EQ(utf8_nfc("\xE2\x84\xAB"), "\xC3\x85");  // U+212B ANGSTROM SIGN -> U+00C5
  EXPECT_EQ(utf8_nfc(std::string("a\0b", 3)), std::string("a\0b", 3));
  EXPECT_EQ(utf8_nfc("plain ascii"), "plain ascii");
}

}  // namespace
}  // namespace essaim
