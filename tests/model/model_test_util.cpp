#include "model_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "core/thread_pool.h"
#include "moe/executor.h"

namespace essaim::test {

std::string fixture(const std::string& name) { return std::string(ESSAIM_FIXTURES_DIR) + "/" + name; }

std::vector<int32_t> read_ids(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  std::replace(s.begin(), s.end(), ',', ' ');
  std::istringstream is(s);
  std::vector<int32_t> ids;
  int32_t v;
  while (is >> v) ids.push_back(v);
  return ids;
}

std::vector<int32_t> fixture_tokens() { return read_ids(fixture("tokens.txt")); }

std::unique_ptr<Model> load_or_die(const std::string& path) {
  Result<std::unique_ptr<Model>> m = load_model(path);
  EXPECT_TRUE(m.is_ok()) << m.status().message();
  return m ? std::move(*m) : nullptr;
}

std::vector<float> eval_logits(const Model& m, const std::vector<int32_t>& tokens, const EvalOptions& o) {
  ThreadPool pool(o.threads);
  LocalExpertExecutor experts(m.expert_store(), &pool);
  SequenceCache cache = m.new_cache({.kv_type = o.kv_type, .n_ctx = int32_t(tokens.size())});
  const size_t V = size_t(m.info().n_vocab);
  std::vector<float> logits(tokens.size() * V);
  const size_t chunk = o.batch ? o.batch : tokens.size();
  for (size_t b = 0; b < tokens.size(); b += chunk) {
    const size_t n = std::min(chunk, tokens.size() - b);
    Status s = m.forward({.tokens = std::span<const int32_t>(tokens).subspan(b, n), .cache = &cache,
                          .experts = &experts, .pool = &pool, .logits_mode = LogitsMode::ALL,
                          .logits = std::span<float>(logits).subspan(b * V, n * V)});
    EXPECT_TRUE(s.is_ok()) << s.message();
  }
  return logits;
}

std::vector<int32_t> greedy(const Model& m, const std::vector<int32_t>& prompt, int n, size_t threads,
                            KvType kv_type) {
  ThreadPool pool(threads);
  LocalExpertExecutor experts(m.expert_store(), &pool);
  SequenceCache cache = m.new_cache({.kv_type = kv_type, .n_ctx = int32_t(prompt.size()) + n});
  std::vector<float> logits(size_t(m.info().n_vocab));
  std::vector<int32_t> out;
  std::vector<int32_t> step = prompt;
  for (int i = 0; i < n; ++i) {
    Status s = m.forward({.tokens = step, .cache = &cache, .experts = &experts, .pool = &pool,
                          .logits_mode = LogitsMode::LAST, .logits = logits});
    EXPECT_TRUE(s.is_ok()) << s.message();
    if (!s) break;
    const int32_t id = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(id);
    step = {id};
  }
  return out;
}

Comparison compare_logits(const std::vector<float>& got, const std::vector<float>& want, size_t V) {
  Comparison c;
  EXPECT_EQ(got.size(), want.size());
  for (size_t r = 0; r * V < std::min(got.size(), want.size()); ++r) {
    const float* a = got.data() + r * V;
    const float* b = want.data() + r * V;
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < V; ++i) {
      ab += double(a[i]) * b[i];
      aa += double(a[i]) * a[i];
      bb += double(b[i]) * b[i];
      c.max_abs_diff = std::max(c.max_abs_diff, std::fabs(double(a[i]) - b[i]));
    }
    c.min_cosine = std::min(c.min_cosine, ab / std::sqrt(aa * bb));
    if (std::max_element(a, a + V) - a != std::max_element(b, b + V) - b) ++c.argmax_mismatches;
  }
  return c;
}

}  // namespace essaim::test
