// Helpers shared by the model tests: teacher-forced evaluation with a chosen chunking / thread count /
// KV type, greedy generation, and reading the llama.cpp fixtures.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/model.h"

namespace essaim::test {

std::string fixture(const std::string& name);  // ESSAIM_FIXTURES_DIR/name
std::vector<int32_t> fixture_tokens();          // tokens.txt
std::vector<int32_t> read_ids(const std::string& path);  // whitespace or comma separated ids

std::unique_ptr<Model> load_or_die(const std::string& path);

struct EvalOptions {
  size_t batch = 0;     // chunk size; 0 = all tokens at once
  size_t threads = 1;
  KvType kv_type = KvType::F16;
};
// Logits [n_tokens][n_vocab] of every position.
std::vector<float> eval_logits(const Model& m, const std::vector<int32_t>& tokens, const EvalOptions& o = {});

// Greedy continuation: prefill the prompt, then n argmax steps (lowest id among equal logits).
std::vector<int32_t> greedy(const Model& m, const std::vector<int32_t>& prompt, int n, size_t threads = 1,
                            KvType kv_type = KvType::F16);

struct Comparison {
  double min_cosine = 1;
  double max_abs_diff = 0;
  int argmax_mismatches = 0;
};
Comparison compare_logits(const std::vector<float>& got, const std::vector<float>& want, size_t n_vocab);

}  // namespace essaim::test
