// 1,000 seeded random schemas from the supported subset, each decoded under its grammar with random logits
// over the trained model's vocabulary (text/sampler.h's chain on the masked ids, as serving runs it), and
// every output parsed as JSON and checked against its schema by tests/text/json_schema_check.h — code that
// shares nothing with the compiler.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "gguf/gguf_file.h"
#include "json_schema_check.h"
#include "text/grammar.h"
#include "text/json_schema_grammar.h"
#include "text/sampler.h"
#include "text/tokenizer.h"

namespace essaim {
namespace {

using ojson = nlohmann::ordered_json;

class SchemaGen {
 public:
  explicit SchemaGen(uint32_t seed) : rng_(seed) {}

  ojson root() {
    defs_.clear();
    ojson defs = ojson::object();
    const int n_defs = int(pick(3));
    for (int i = 0; i < n_defs; ++i) {
      const std::string name = "d" + std::to_string(i);
      defs[name] = schema(2, /*refs=*/false);
      defs_.push_back(name);
    }
    ojson s = schema(0, true);
    if (!defs_.empty()) {
      if (s.is_object()) s[pick(2) ? "$defs" : "definitions"] = defs;
      if (s.is_object() && s.contains("definitions")) fix_refs(s, "#/$defs/", "#/definitions/");
    }
    return s;
  }

 private:
  uint32_t pick(uint32_t n) { return n == 0 ? 0 : uint32_t(rng_() % n); }

  // Refs are written to #/$defs/; a root that keeps its defs under "definitions" points there instead.
  static void fix_refs(ojson& v, const std::string& from, const std::string& to) {
    if (v.is_object()) {
      if (v.contains("$ref") && v["$ref"].is_string() && v["$ref"].get<std::string>().starts_with(from))
        v["$ref"] = to + v["$ref"].get<std::string>().substr(from.size());
      for (auto& [k, x] : v.items()) (void)k, fix_refs(x, from, to);
    } else if (v.is_array()) {
      for (ojson& x : v) fix_refs(x, from, to);
    }
  }

  ojson scalar_value() {
    switch (pick(5)) {
      case 0: return ojson(std::string("v") + std::to_string(pick(50)));
      case 1: return ojson(int64_t(pick(2000)) - 1000);
      case 2: return ojson(double(pick(1000)) / 8.0);
      case 3: return ojson(bool(pick(2)));
      default: return ojson(nullptr);
    }
  }

  ojson string_schema() {
    ojson s = {{"type", "string"}};
    const uint32_t k = pick(6);
    if (k == 0) s["format"] = std::vector<std::string>{"date", "time", "date-time", "uuid"}[pick(4)];
    if (k == 1 || k == 2) s["maxLength"] = pick(12);
    if (k == 2 || k == 3) s["minLength"] = std::min<uint32_t>(pick(4), s.value("maxLength", 99u));
    return s;
  }

  ojson object_schema(int depth, bool refs) {
    static const char* kNames[] = {"a", "b", "ab", "id", "name", "x_1", "items", "n"};
    ojson props = ojson::object();
    ojson required = ojson::array();
    const uint32_t n = pick(5);
    for (uint32_t i = 0; i < n; ++i) {
      const std::string name = kNames[pick(8)];
      if (props.contains(name)) continue;
      props[name] = schema(depth + 1, refs);
      if (pick(2)) required.push_back(name);
    }
    ojson s = {{"type", "object"}, {"properties", props}};
    if (!required.empty()) s["required"] = required;
    switch (pick(4)) {
      case 0: s["additionalProperties"] = false; break;
      case 1: s["additionalProperties"] = true; break;
      case 2: s["additionalProperties"] = string_schema(); break;
      default: break;
    }
    if (pick(6) == 0) s["nullable"] = true;
    return s;
  }

  ojson array_schema(int depth, bool refs) {
    ojson s = {{"type", "array"}, {"items", schema(depth + 1, refs)}};
    const uint32_t min = pick(3);
    if (pick(2)) s["minItems"] = min;
    if (pick(2)) s["maxItems"] = min + pick(4);
    return s;
  }

  // Branches of distinct JSON kinds, so that "exactly one" holds for oneOf.
  ojson one_of(int depth, bool refs) {
    std::vector<ojson> kinds = {string_schema(), ojson{{"type", "integer"}}, ojson{{"type", "boolean"}},
                                ojson{{"type", "null"}}, array_schema(depth, refs), object_schema(depth, refs)};
    kinds.back().erase("nullable");
    std::shuffle(kinds.begin(), kinds.end(), rng_);
    ojson branches = ojson::array();
    for (uint32_t i = 0; i < 2 + pick(3); ++i) branches.push_back(kinds[i]);
    return {{"oneOf", branches}};
  }

  ojson schema(int depth, bool refs) {
    const uint32_t k = depth >= 3 ? pick(7) : pick(14);
    switch (k) {
      case 0: return string_schema();
      case 1: return {{"type", "integer"}};
      case 2: return {{"type", "number"}};
      case 3: return {{"type", pick(2) ? "boolean" : "null"}};
      case 4: {
        ojson values = ojson::array();
        for (uint32_t i = 0; i <= pick(4); ++i) values.push_back(scalar_value());
        return {{"enum", values}};
      }
      case 5: return {{"const", scalar_value()}};
      case 6: return pick(2) ? ojson::object() : ojson{{"type", ojson::array({"string", "integer", "null"})}};
      case 7: case 8: return object_schema(depth, refs);
      case 9: case 10: return array_schema(depth, refs);
      case 11: return {{"anyOf", ojson::array({schema(depth + 1, refs), schema(depth + 1, refs)})}};
      case 12: return one_of(depth + 1, refs);
      default:
        if (refs && !defs_.empty()) return {{"$ref", "#/$defs/" + defs_[pick(uint32_t(defs_.size()))]}};
        return object_schema(depth, refs);
    }
  }

  std::mt19937 rng_;
  std::vector<std::string> defs_;
};

// Random logits; from the 40th token on, tokens that close something (and the end of generation) are
// favoured, so that every output ends within the budget.
std::string decode(GrammarMatcher& m, const TokenTrie& trie, const std::vector<TokenId>& eog, uint32_t seed, bool& ended) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.0f, 2.0f);
  Sampler sampler({.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = seed});
  std::vector<float> logits(size_t(trie.n_vocab()));
  std::string out;
  ended = false;
  for (int step = 0; step < 2000; ++step) {
    const TokenMask& mask = m.allowed(trie, eog);
    if (mask.count() == 0) return out;
    for (TokenId id = 0; id < trie.n_vocab(); ++id) {
      logits[size_t(id)] = noise(rng);
      const std::string& p = trie.piece(id);
      if (step >= 40 && (p.empty() || p.find_first_of("\"]}") != std::string::npos)) logits[size_t(id)] += 12.0f;
    }
    const TokenId id = sampler.sample(logits, mask.bits);
    sampler.accept(id);
    if (std::binary_search(eog.begin(), eog.end(), id)) {
      ended = true;
      return out;
    }
    if (!m.accept_bytes(trie.piece(id))) return out + "<<refused " + trie.piece(id) + ">>";
    out += trie.piece(id);
  }
  return out;
}

TEST(GrammarFuzz, ThousandSchemasDecodeToValidJson) {
  auto f = GgufFile::open(std::string(ESSAIM_SOURCE_DIR) + "/models/kjv-moe-q8_0.gguf");
  ASSERT_TRUE(f.is_ok());
  auto v = vocab_from_gguf(*f);
  ASSERT_TRUE(v.is_ok());
  auto tok = Tokenizer::create(std::move(*v));
  ASSERT_TRUE(tok.is_ok());
  const TokenTrie trie(*tok);
  const std::vector<TokenId> eog = tok->eog_ids();
  SchemaGen gen(2026);
  std::set<std::string> outputs, schemas;
  size_t refused = 0, long_outputs = 0;
  for (uint32_t i = 0; i < 1000; ++i) {
    const ojson schema = gen.root();
    schemas.insert(schema.dump());
    auto g = json_schema_grammar(schema, {});
    if (!g.is_ok()) {  // only what the generator cannot avoid: none expected
      ++refused;
      ADD_FAILURE() << "schema " << i << " refused: " << g.status().message() << "\n" << schema.dump();
      continue;
    }
    GrammarMatcher m(*g);
    bool ended = false;
    const std::string text = decode(m, trie, eog, 1000 + i, ended);
    ASSERT_TRUE(ended) << "schema " << i << " did not end: " << schema.dump() << "\n" << text << "\n" << m.error();
    const ojson value = ojson::parse(text, nullptr, false);
    ASSERT_FALSE(value.is_discarded()) << "schema " << i << ": not JSON: " << text << "\n" << schema.dump();
    const std::string why = test::schema_check(value, schema);
    ASSERT_TRUE(why.empty()) << "schema " << i << ": " << why << "\n" << schema.dump() << "\n" << text;
    outputs.insert(text);
    long_outputs += text.size() > 40;
  }
  EXPECT_EQ(refused, 0u);
  // The generator varies (small schemas such as {"type": "boolean"} come back), and so do the outputs.
  EXPECT_GT(schemas.size(), 800u);
  EXPECT_GT(outputs.size(), 650u);
  EXPECT_GT(long_outputs, 120u);  // random choices often close a value early: 169 of 1,000 are over 40 bytes
}

}  // namespace
}  // namespace essaim
