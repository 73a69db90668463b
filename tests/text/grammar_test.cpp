// The grammar matcher and the JSON Schema compiler (text/grammar.h, text/json_schema_grammar.h): texts a
// schema's grammar takes and refuses, refusals naming the keyword, limits, and token masks equal to testing
// every token of the trained model's vocabulary on its own.
#include <gtest/gtest.h>

#include <random>

#include "gguf/gguf_file.h"
#include "json_schema_check.h"
#include "text/grammar.h"
#include "text/json_schema_grammar.h"
#include "text/tokenizer.h"

namespace essaim {
namespace {

using ojson = nlohmann::ordered_json;

std::shared_ptr<const Grammar> compile(const std::string& schema, StructuredOutputOptions o = {}) {
  auto g = json_schema_grammar(ojson::parse(schema), o);
  EXPECT_TRUE(g.is_ok()) << schema << ": " << g.status().message();
  return g.is_ok() ? *g : nullptr;
}

// Whether the grammar takes exactly `text` (a whole sentence, not a prefix).
bool takes(const std::shared_ptr<const Grammar>& g, std::string_view text) {
  GrammarMatcher m(g);
  return m.accept_bytes(text) && m.complete();
}

TEST(Grammar, BuilderRepeatAndStar) {
  GrammarBuilder b;
  const uint32_t digits = b.repeat({b.bytes('0', '9')}, 1, 3);
  b.set_root(b.rule({b.seq({b.literal("n="), {b.ref(digits)}, {b.ref(b.star(b.literal("!")))}})}));
  auto g = b.build();
  ASSERT_TRUE(g.is_ok()) << g.status().message();
  EXPECT_TRUE(takes(*g, "n=1"));
  EXPECT_TRUE(takes(*g, "n=123!!!!!!!!!!!!!!!!!!!!!!!!!"));
  EXPECT_FALSE(takes(*g, "n="));
  EXPECT_FALSE(takes(*g, "n=1234"));
  GrammarMatcher m(*g);
  EXPECT_TRUE(m.accept_bytes("n=12"));
  EXPECT_TRUE(m.complete());
  EXPECT_TRUE(m.can_continue());
  EXPECT_FALSE(m.accept_bytes("x"));  // refused bytes leave the state as it was
  EXPECT_TRUE(m.accept_bytes("3!"));
  // A long repetition keeps the state count flat (tail references replace their frame).
  GrammarMatcher loop(*g);
  ASSERT_TRUE(loop.accept_bytes("n=1" + std::string(10000, '!')));
  EXPECT_LT(loop.n_states(), 16u);
}

TEST(Grammar, ElementLimitIsAnError) {
  auto g = json_schema_grammar(ojson::parse(R"({"type":"array","items":{"type":"string","maxLength":4096},"maxItems":256})"),
                               {.in_reasoning = false, .limits = {.max_elements = 1000}});
  ASSERT_FALSE(g.is_ok());
  EXPECT_NE(g.status().message().find("over the limit of 1000"), std::string::npos) << g.status().message();
}

TEST(JsonSchemaGrammar, ScalarsAndStrings) {
  auto s = compile(R"({"type":"string","minLength":2,"maxLength":3})");
  EXPECT_TRUE(takes(s, R"("ab")"));
  EXPECT_TRUE(takes(s, R"("\u00e9\n")"));
  EXPECT_TRUE(takes(s, "\"\xC3\xA9\xE2\x82\xAC\""));  // é€: two code points
  EXPECT_FALSE(takes(s, R"("a")"));
  EXPECT_FALSE(takes(s, R"("abcd")"));
  EXPECT_FALSE(takes(s, "\"a\x01\""));           // a control byte
  EXPECT_FALSE(takes(s, "\"a\xC3\""));           // a cut UTF-8 sequence
  EXPECT_FALSE(takes(s, R"("\ud800x")"));         // a lone surrogate escape
  EXPECT_FALSE(takes(s, "\"\xED\xA0\x80\""));     // a surrogate in UTF-8
  auto i = compile(R"({"type":"integer"})");
  EXPECT_TRUE(takes(i, "-42"));
  EXPECT_TRUE(takes(i, "0"));
  EXPECT_FALSE(takes(i, "01"));
  EXPECT_FALSE(takes(i, "1.5"));
  EXPECT_FALSE(takes(i, "12345678901234567"));  // 17 digits: past what an int64 holds for sure
  auto n = compile(R"({"type":"number"})");
  EXPECT_TRUE(takes(n, "-0.5e-12"));
  EXPECT_TRUE(takes(n, "3"));
  EXPECT_FALSE(takes(n, "1e999"));
  EXPECT_FALSE(takes(n, ".5"));
  auto t = compile(R"({"type":["boolean","null"]})");
  EXPECT_TRUE(takes(t, "true"));
  EXPECT_TRUE(takes(t, "null"));
  EXPECT_FALSE(takes(t, "1"));
  auto e = compile(R"({"enum":["a",1,{"k":[true]}]})");
  EXPECT_TRUE(takes(e, R"("a")"));
  EXPECT_TRUE(takes(e, R"({"k":[true]})"));
  EXPECT_FALSE(takes(e, R"("b")"));
  auto c = compile(R"({"const":"x","nullable":true})");
  EXPECT_TRUE(takes(c, R"("x")"));
  EXPECT_TRUE(takes(c, "null"));
}

TEST(JsonSchemaGrammar, Formats) {
  auto d = compile(R"({"type":"string","format":"date"})");
  EXPECT_TRUE(takes(d, R"("2024-12-31")"));
  EXPECT_TRUE(takes(d, R"("2023-02-28")"));
  EXPECT_FALSE(takes(d, R"("2023-02-30")"));
  EXPECT_FALSE(takes(d, R"("2023-13-01")"));
  auto dt = compile(R"({"type":"string","format":"date-time"})");
  EXPECT_TRUE(takes(dt, R"("2024-06-01T23:59:59.123+02:00")"));
  EXPECT_TRUE(takes(dt, R"("2024-06-01T00:00:00Z")"));
  EXPECT_FALSE(takes(dt, R"("2024-06-01T24:00:00Z")"));
  auto u = compile(R"({"type":"string","format":"uuid"})");
  EXPECT_TRUE(takes(u, R"("123e4567-e89b-12d3-a456-426614174000")"));
  EXPECT_FALSE(takes(u, R"("123e4567-e89b-12d3-a456-42661417400")"));
}

TEST(JsonSchemaGrammar, ObjectsInDeclaredOrder) {
  auto o = compile(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"},"c":{"type":"boolean"}},
                       "required":["b"],"additionalProperties":false})");
  EXPECT_TRUE(takes(o, R"({"b":"x"})"));
  EXPECT_TRUE(takes(o, R"({"a": 1, "b": "x", "c": true})"));
  EXPECT_TRUE(takes(o, "{\n  \"a\": 1,\n  \"b\": \"x\"\n}"));
  EXPECT_FALSE(takes(o, R"({})"));               // b is required
  EXPECT_FALSE(takes(o, R"({"a":1})"));
  EXPECT_FALSE(takes(o, R"({"b":"x",})"));       // no trailing comma
  EXPECT_FALSE(takes(o, R"({"b":"x","d":1})"));  // no extra member
  EXPECT_FALSE(takes(o, R"({"b":"x","a":1})"));  // declared order only
  // Extra members: any name but the declared ones (none spelled by an escape).
  auto x = compile(R"({"type":"object","properties":{"ab":{"type":"integer"}},"additionalProperties":{"type":"string"}})");
  EXPECT_TRUE(takes(x, R"({"ab":1,"abc":"v","a":"w","":"e"})"));
  EXPECT_TRUE(takes(x, R"({"zz":"v"})"));
  EXPECT_FALSE(takes(x, R"({"ab":1,"ab":"v"})"));
  EXPECT_FALSE(takes(x, R"({"ab":1,"abc":2})"));
  EXPECT_FALSE(takes(x, R"({"ab":1,"\u0061b":"v"})"));
  auto any = compile(R"({"type":"object"})");
  EXPECT_TRUE(takes(any, R"({"k":[1,{"z":null}],"s":"t"})"));
}

TEST(JsonSchemaGrammar, ArraysRefsAndAlternatives) {
  auto a = compile(R"({"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":3})");
  EXPECT_TRUE(takes(a, "[1]"));
  EXPECT_TRUE(takes(a, "[1, 2, 3]"));
  EXPECT_FALSE(takes(a, "[]"));
  EXPECT_FALSE(takes(a, "[1,2,3,4]"));
  auto r = compile(R"({"$defs":{"p":{"type":"object","properties":{"x":{"type":"number"}},"required":["x"]}},
                       "type":"array","items":{"anyOf":[{"$ref":"#/$defs/p"},{"type":"null"}]}})");
  EXPECT_TRUE(takes(r, R"([{"x":1},null,{"x":2.5}])"));
  EXPECT_FALSE(takes(r, R"([{"y":1}])"));
  auto one = compile(R"({"oneOf":[{"type":"string"},{"type":"integer"}]})");
  EXPECT_TRUE(takes(one, "7"));
  EXPECT_TRUE(takes(one, R"("7")"));
  auto all = compile(R"({"definitions":{"d":{"type":"boolean"}},"allOf":[{"$ref":"#/definitions/d"}]})");
  EXPECT_TRUE(takes(all, "false"));
}

TEST(JsonSchemaGrammar, RefusalsNameTheKeyword) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"type":"string","pattern":"^a+$"})", "'pattern' at #"},
      {R"({"type":"object","properties":{"n":{"type":"integer","minimum":0}}})", "'minimum' at #/properties/n"},
      {R"({"type":"array","uniqueItems":true})", "'uniqueItems'"},
      {R"({"type":"string","format":"email"})", "format 'email'"},
      {R"({"$defs":{"n":{"type":"object","properties":{"next":{"$ref":"#/$defs/n"}}}},"$ref":"#/$defs/n"})", "recursive"},
      {R"({"$ref":"https://example.com/s.json"})", "only #/$defs/NAME"},
      {R"({"type":"array","maxItems":100000})", "'maxItems' at # is over the supported 256"},
      {R"({"type":"string","minLength":3,"maxLength":2})", "no string satisfies"},
      {R"({"type":"thing"})", "unknown type 'thing'"},
      {R"({"allOf":[{"type":"string"},{"maxLength":2}]})", "exactly one"},
      {R"(false)", "no value satisfies"},
      {R"({"type":"object","properties":{"a":{}},"required":["b"],"additionalProperties":false})", "required property 'b'"},
  };
  for (const auto& [schema, want] : cases) {
    auto g = json_schema_grammar(ojson::parse(schema), {});
    ASSERT_FALSE(g.is_ok()) << schema;
    EXPECT_NE(g.status().message().find(want), std::string::npos) << schema << " -> " << g.status().message();
  }
}

TEST(JsonSchemaGrammar, ReasoningPrefix) {
  auto g = compile(R"({"type":"boolean"})", {.in_reasoning = true, .limits = {}});
  EXPECT_TRUE(takes(g, "Let me see: <b>a</b> </thin </think>\n\ntrue"));
  EXPECT_TRUE(takes(g, "</think>false"));
  EXPECT_FALSE(takes(g, "true"));
  EXPECT_FALSE(takes(g, "x</think>\n\nyes"));
}

TEST(ToolCallGrammar, BothSyntaxes) {
  const ojson tools = ojson::parse(R"([
    {"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
      "properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]}}},
    {"type":"function","function":{"name":"now"}}])");
  auto json = tool_call_grammar(tools, "", ToolCallSyntax::JSON, {});
  ASSERT_TRUE(json.is_ok()) << json.status().message();
  EXPECT_TRUE(takes(*json, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>"));
  EXPECT_TRUE(takes(*json, "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\n"
                           "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(takes(*json, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(takes(*json, "Sure! <tool_call>"));
  auto named = tool_call_grammar(tools, "now", ToolCallSyntax::JSON, {});
  ASSERT_TRUE(named.is_ok());
  EXPECT_FALSE(takes(*named, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"P\"}}\n</tool_call>"));
  auto xml = tool_call_grammar(tools, "get_weather", ToolCallSyntax::XML, {});
  ASSERT_TRUE(xml.is_ok()) << xml.status().message();
  EXPECT_TRUE(takes(*xml, "<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco, CA\n</parameter>\n"
                          "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"));
  EXPECT_FALSE(takes(*xml, "<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"));
  auto missing = tool_call_grammar(tools, "nope", ToolCallSyntax::JSON, {});
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("'nope'"), std::string::npos);
}

Tokenizer trained_tokenizer() {
  auto f = GgufFile::open(std::string(ESSAIM_SOURCE_DIR) + "/models/kjv-moe-q8_0.gguf");
  EXPECT_TRUE(f.is_ok());
  auto v = vocab_from_gguf(*f);
  EXPECT_TRUE(v.is_ok());
  auto t = Tokenizer::create(std::move(*v));
  EXPECT_TRUE(t.is_ok());
  return std::move(*t);
}

// The trie walk gives exactly the tokens that testing each token's bytes alone accepts, at every step of a
// seeded walk through several grammars.
TEST(GrammarMask, EqualsEachTokenTestedAlone) {
  const Tokenizer tok = trained_tokenizer();
  const TokenTrie trie(tok);
  const std::vector<TokenId> eog = tok.eog_ids();
  std::mt19937 rng(7);
  size_t checked = 0, distinct_sizes = 0;
  std::set<size_t> sizes;
  for (const char* schema : {R"({"type":"object","properties":{"name":{"type":"string","maxLength":12},
                               "tags":{"type":"array","items":{"enum":["a","bc"]},"maxItems":3},"n":{"type":"number"},
                               "note":{"type":"string"}},
                               "required":["note","name","n"]})",
                             R"({"type":"array","items":{"type":"string","format":"date"}})"}) {
    auto g = compile(schema);
    GrammarMatcher m(g);
    for (int step = 0; step < 60; ++step) {
      const TokenMask mask = m.allowed(trie, eog);
      std::vector<TokenId> allowed;
      for (TokenId id = 0; id < tok.n_vocab(); ++id) {
        const bool alone = trie.piece(id).empty() ? (m.complete() && std::binary_search(eog.begin(), eog.end(), id))
                                                  : m.can_accept(trie.piece(id));
        ASSERT_EQ(mask.test(id), alone) << "token " << id << " '" << trie.piece(id) << "' at step " << step;
        if (alone) allowed.push_back(id);
        ++checked;
      }
      sizes.insert(allowed.size());
      if (allowed.empty()) break;
      const TokenId pick = allowed[rng() % allowed.size()];
      if (trie.piece(pick).empty()) break;  // end of generation
      ASSERT_TRUE(m.accept_bytes(trie.piece(pick)));
    }
  }
  distinct_sizes = sizes.size();
  // Inside an unbounded string, where most subtrees are taken whole without being walked.
  for (const char* prefix : {"\"ab", "\"\xE2\x82", "\"a\\"}) {
    GrammarMatcher m(compile(R"({"type":"array","items":{"type":"string"}})"));
    ASSERT_TRUE(m.accept_bytes("[" + std::string(prefix)));
    const TokenMask mask = m.allowed(trie, eog);
    size_t n = 0;
    for (TokenId id = 0; id < tok.n_vocab(); ++id) {
      const bool alone = !trie.piece(id).empty() && m.can_accept(trie.piece(id));
      ASSERT_EQ(mask.test(id), alone) << "token " << id << " '" << trie.piece(id) << "' after " << prefix;
      n += alone;
    }
    EXPECT_GT(n, 10u) << prefix;
  }
  EXPECT_GT(checked, 100000u);
  EXPECT_GT(distinct_sizes, 5u);  // the masks differ from step to step: the walk went through varied states
}

}  // namespace
}  // namespace essaim
