// The per-step cost of structured output's token mask (text/grammar.h) on a vocabulary: the trained model's
// (4,096 tokens) and, with --tokenizer-json, a Qwen-sized one (Qwen3's tokenizer.json, 151,669 tokens).
// Decodes a schema an agent might send with seeded random logits and times each step's mask: computed (a
// state met for the first time: the trie walk) or cached (a state met again), against the reference of
// testing every token's bytes on its own at the same steps. Prints one JSON document.
//
//   grammar_bench --model models/kjv-moe-q8_0.gguf --tokenizer-json .../tokenizer.json --steps 200
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "gguf/gguf_file.h"
#include "text/grammar.h"
#include "text/json_schema_grammar.h"
#include "text/sampler.h"
#include "text/tokenizer.h"

namespace {

using namespace essaim;
using Clock = std::chrono::steady_clock;

constexpr const char* kSchema = R"({"type":"object","properties":{
  "name":{"type":"string"},"city":{"type":"string","maxLength":40},"age":{"type":"integer"},
  "email_verified":{"type":"boolean"},"tags":{"type":"array","items":{"type":"string"},"maxItems":5},
  "address":{"type":"object","properties":{"street":{"type":"string"},"zip":{"type":"string"}},"required":["street"]},
  "status":{"enum":["active","suspended","deleted"]},"created":{"type":"string","format":"date-time"}},
  "required":["name","age","status"]})";

double us_since(Clock::time_point t0) { return std::chrono::duration<double, std::micro>(Clock::now() - t0).count(); }

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(q * double(v.size())))];
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / double(v.size());
}

nlohmann::json measure(const std::string& name, const Tokenizer& tok, int steps, uint32_t seed) {
  const auto t0 = Clock::now();
  const TokenTrie trie(tok);
  const double trie_ms = us_since(t0) / 1000.0;
  const auto grammar = json_schema_grammar(nlohmann::ordered_json::parse(kSchema), {}).value();
  GrammarMatcher m(grammar);
  Sampler sampler({.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = seed});
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.0f, 2.0f);
  std::vector<float> logits(size_t(tok.n_vocab()));
  std::vector<double> computed, cached, each_alone;
  size_t allowed_sum = 0;
  int done = 0;
  for (int step = 0; step < steps; ++step) {
    const size_t walks_before = m.n_mask_walks();
    auto t = Clock::now();
    const TokenMask& mask = m.allowed(trie, tok.eog_ids());
    const double us = us_since(t);
    (m.n_mask_walks() > walks_before ? computed : cached).push_back(us);
    allowed_sum += mask.count();
    if (step % 10 == 0) {  // the reference: every token's bytes tested on their own
      t = Clock::now();
      size_t n = 0;
      for (TokenId id = 0; id < tok.n_vocab(); ++id) n += !trie.piece(id).empty() && m.can_accept(trie.piece(id));
      each_alone.push_back(us_since(t));
      (void)n;
    }
    for (size_t i = 0; i < logits.size(); ++i) {
      const std::string& p = trie.piece(TokenId(i));
      logits[i] = noise(rng) + (step > steps / 2 && (p.empty() || p.find_first_of("\"]}") != std::string::npos) ? 8.0f : 0.0f);
    }
    const TokenId id = sampler.sample(logits, mask.bits);
    if (tok.is_eog(id)) {  // answer complete: start another one
      ++done;
      m = GrammarMatcher(grammar);
      continue;
    }
    if (!m.accept_bytes(trie.piece(id))) break;
  }
  return {{"vocabulary", name},
          {"n_vocab", tok.n_vocab()},
          {"trie_nodes", trie.nodes().size()},
          {"trie_build_ms", trie_ms},
          {"steps", computed.size() + cached.size()},
          {"answers_completed", done},
          {"mean_allowed_tokens", double(allowed_sum) / double(computed.size() + cached.size())},
          {"mask_computed_steps", computed.size()},
          {"mask_computed_us_mean", mean(computed)},
          {"mask_computed_us_p50", percentile(computed, 0.5)},
          {"mask_computed_us_p99", percentile(computed, 0.99)},
          {"mask_cached_steps", cached.size()},
          {"mask_cached_us_mean", mean(cached)},
          {"each_token_alone_us_mean", mean(each_alone)},
          {"speedup_computed_vs_each_alone", mean(computed) > 0 ? mean(each_alone) / mean(computed) : 0.0}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"grammar_bench: the per-step cost of structured output's token mask"};
  std::string model, tokenizer_json;
  int steps = 300;
  uint32_t seed = 1;
  app.add_option("--model", model, "a GGUF file whose vocabulary to use")->required();
  app.add_option("--tokenizer-json", tokenizer_json, "also a Hugging Face tokenizer.json (e.g. Qwen3's)");
  app.add_option("--steps", steps, "decoding steps per vocabulary");
  app.add_option("--seed", seed, "sampling seed");
  CLI11_PARSE(app, argc, argv);
  nlohmann::json out = {{"bench", "grammar_mask"}, {"schema", nlohmann::json::parse(kSchema)}, {"results", nlohmann::json::array()}};
  auto file = GgufFile::open(model);
  if (!file) return std::fprintf(stderr, "grammar_bench: %s\n", file.status().message().c_str()), 1;
  auto vocab = vocab_from_gguf(*file);
  if (!vocab) return std::fprintf(stderr, "grammar_bench: %s\n", vocab.status().message().c_str()), 1;
  auto tok = Tokenizer::create(std::move(*vocab));
  if (!tok) return std::fprintf(stderr, "grammar_bench: %s\n", tok.status().message().c_str()), 1;
  out["results"].push_back(measure(model, *tok, steps, seed));
  if (!tokenizer_json.empty()) {
    auto v = vocab_from_hf_tokenizer_json(tokenizer_json);
    if (!v) return std::fprintf(stderr, "grammar_bench: %s\n", v.status().message().c_str()), 1;
    auto q = Tokenizer::create(std::move(*v));
    if (!q) return std::fprintf(stderr, "grammar_bench: %s\n", q.status().message().c_str()), 1;
    out["results"].push_back(measure(tokenizer_json, *q, steps, seed));
  }
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}
