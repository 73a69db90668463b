// What the paired A/B programs of bench/ab share (lanes_ab.cpp, dot_ab.cpp): their arguments, seeded weight
// and activation rows, and the alternating timing loop whose per-pair B/A ratios cancel a noisy host's drifts.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "core/ggml_type.h"
#include "kernels/quantize.h"

namespace essaim::ab {

// COLS ROWS ACT_ROWS TYPE COPIES [PAIRS], as both programs take them.
struct Args {
  int64_t cols = 0, rows = 0, act_rows = 0, copies = 1;
  std::string type;
  int pairs = 40;
};

// Parses argv; false (after a message on stderr) if they are missing or out of range. `types` lists the
// accepted type names, e.g. {"q4_k", "q6_k"}.
inline bool parse_args(int argc, char** argv, const char* program, const std::vector<std::string>& types, Args* a) {
  std::string names;
  for (const std::string& t : types) names += (names.empty() ? "" : "|") + t;
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s COLS ROWS ACT_ROWS %s COPIES [PAIRS]\n", program, names.c_str());
    return false;
  }
  a->cols = std::atol(argv[1]);
  a->rows = std::atol(argv[2]);
  a->act_rows = std::atol(argv[3]);
  a->type = argv[4];
  a->copies = std::max<int64_t>(1, std::atol(argv[5]));
  a->pairs = argc > 6 ? std::max(1, std::atoi(argv[6])) : 40;
  if (std::find(types.begin(), types.end(), a->type) == types.end() || a->cols <= 0 || a->cols % 256 != 0 ||
      a->rows <= 0 || a->act_rows <= 0) {
    std::fprintf(stderr, "%s: TYPE one of %s, COLS a positive multiple of 256, ROWS and ACT_ROWS > 0\n", program,
                 names.c_str());
    return false;
  }
  return true;
}

inline GgmlType type_of(const std::string& name) {
  return name == "q6_k" ? GgmlType::Q6_K : name == "q5_k" ? GgmlType::Q5_K : GgmlType::Q4_K;
}

// n rows of `cols` Gaussian values quantised to type t (weights, or Q8_K activations), row_bytes apart.
inline std::vector<uint8_t> quantized_rows(GgmlType t, int64_t cols, int64_t n, uint64_t row_bytes, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::vector<float> f(static_cast<size_t>(cols));
  std::vector<uint8_t> out(row_bytes * uint64_t(n));
  for (int64_t r = 0; r < n; ++r) {
    for (float& v : f) v = nd(rng);
    quantize_row(t, f.data(), out.data() + uint64_t(r) * row_bytes, cols);
  }
  return out;
}

inline double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[size_t(q * double(v.size() - 1) + 0.5)];
}

// Times A and B `pairs` times, alternating which goes first; prints the medians and the quartiles of the
// per-pair B/A ratios as one JSON line. time_a / time_b return microseconds per call.
template <typename TimeA, typename TimeB>
void run_pairs(const Args& a, TimeA time_a, TimeB time_b) {
  std::vector<double> ta, tb, ratio;
  for (int p = 0; p < a.pairs; ++p) {
    double x, y;
    if (p % 2 == 0) {
      x = time_a();
      y = time_b();
    } else {
      y = time_b();
      x = time_a();
    }
    ta.push_back(x);
    tb.push_back(y);
    ratio.push_back(y / x);
  }
  std::printf(
      "{\"type\": \"%s\", \"cols\": %ld, \"rows\": %ld, \"act_rows\": %ld, \"copies\": %ld, \"pairs\": %d, "
      "\"a_us_median\": %.1f, \"b_us_median\": %.1f, \"b_over_a_median\": %.3f, \"b_over_a_q1\": %.3f, "
      "\"b_over_a_q3\": %.3f}\n",
      a.type.c_str(), long(a.cols), long(a.rows), long(a.act_rows), long(a.copies), a.pairs, quantile(ta, 0.5),
      quantile(tb, 0.5), quantile(ratio, 0.5), quantile(ratio, 0.25), quantile(ratio, 0.75));
}

// Calls per timing: about 4e6 multiply-adds / 64 each, so one timing lasts milliseconds, not microseconds.
inline int calls_per_timing(const Args& a) {
  return std::max(1, int(4e6 / (double(a.cols) * double(a.rows) * double(a.act_rows) / 64.0)));
}

}  // namespace essaim::ab
