// Paired comparison of two versions of the AVX2 lanes kernel (matmul_lanes_avx2.cpp) in one process, for
// hosts too noisy for separate runs. scripts/lanes-ab.sh compiles each version under its own name
// (lanes_a, lanes_b) and links them here. Both are checked against matmul_rows (the dot kernels) bit for
// bit, then called alternately, `pairs` times, on weights spread over `copies` copies (enough copies put
// them beyond the caches, as an expert's weights are in a prefill); each pair's B/A ratio cancels the
// host's slow drifts, and the median ratio with its quartiles is printed as JSON.
//
//   scripts/lanes-ab.sh OLD.cpp NEW.cpp 1024 3072 16 q6_k 16 [pairs]   # cols rows act_rows type copies
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/ggml_type.h"
#include "kernels/kernel_traits.h"
#include "kernels/matmul.h"
#include "kernels/quantize.h"

namespace essaim {
using LanesFn = void (*)(const WeightMatrix&, const uint8_t*, uint64_t, int64_t, int64_t, int64_t, float* const*);
void lanes_a(const WeightMatrix& w, const uint8_t* xprep, uint64_t x_stride, int64_t n_rows, int64_t o_begin,
             int64_t o_end, float* const* y);
void lanes_b(const WeightMatrix& w, const uint8_t* xprep, uint64_t x_stride, int64_t n_rows, int64_t o_begin,
             int64_t o_end, float* const* y);
}  // namespace essaim

using namespace essaim;

namespace {

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[size_t(q * double(v.size() - 1) + 0.5)];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: lanes_ab COLS ROWS ACT_ROWS q4_k|q6_k COPIES [PAIRS]\n");
    return 2;
  }
  const int64_t cols = std::atol(argv[1]), rows = std::atol(argv[2]), nx = std::atol(argv[3]);
  const std::string type = argv[4];
  const int64_t copies = std::max<int64_t>(1, std::atol(argv[5]));
  const int pairs = argc > 6 ? std::max(1, std::atoi(argv[6])) : 40;
  if ((type != "q4_k" && type != "q6_k") || cols % 256 != 0 || rows <= 0 || nx <= 0) {
    std::fprintf(stderr, "lanes_ab: type must be q4_k or q6_k, COLS a multiple of 256, ROWS and ACT_ROWS > 0\n");
    return 2;
  }
  if (!isa_supported(Isa::AVX2)) {
    std::fprintf(stderr, "lanes_ab: this CPU has no AVX2\n");
    return 2;
  }
  const GgmlType wt = type == "q6_k" ? GgmlType::Q6_K : GgmlType::Q4_K;

  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  std::vector<float> f(static_cast<size_t>(cols));
  const uint64_t rs = type_traits(wt).row_bytes(cols);
  std::vector<uint8_t> weights(rs * uint64_t(rows * copies));  // [copies][rows] rows of rs bytes
  for (int64_t r = 0; r < rows * copies; ++r) {
    for (float& v : f) v = nd(rng);
    quantize_row(wt, f.data(), weights.data() + uint64_t(r) * rs, cols);
  }
  const uint64_t xs = activation_row_bytes(wt, cols);
  std::vector<uint8_t> xq(xs * uint64_t(nx)), xp(xs * uint64_t(nx));
  for (int64_t t = 0; t < nx; ++t) {
    for (float& v : f) v = nd(rng);
    quantize_row_q8k(f.data(), xq.data() + uint64_t(t) * xs, cols);
  }
  xp = xq;
  if (PrepareFn prep = kernel_traits(wt)->prepare_for(Isa::AVX2))
    for (int64_t t = 0; t < nx; ++t) prep(xq.data() + uint64_t(t) * xs, xp.data() + uint64_t(t) * xs, cols);

  std::vector<float> want(size_t(nx * rows)), got(size_t(nx * rows));
  std::vector<float*> want_rows(static_cast<size_t>(nx)), got_rows(static_cast<size_t>(nx));
  for (int64_t t = 0; t < nx; ++t) {
    want_rows[size_t(t)] = want.data() + t * rows;
    got_rows[size_t(t)] = got.data() + t * rows;
  }
  const Status isa = set_kernel_isa(Isa::AVX2);
  if (!isa.is_ok()) {
    std::fprintf(stderr, "lanes_ab: %s\n", isa.message().c_str());
    return 2;
  }
  const WeightMatrix first{wt, cols, rows, weights.data(), rs};
  matmul_rows(first, xp.data(), nx, 0, rows, want_rows.data());
  const LanesFn fns[2] = {lanes_a, lanes_b};
  for (int v = 0; v < 2; ++v) {
    fns[v](first, xp.data(), xs, nx, 0, rows, got_rows.data());
    if (std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) != 0) {
      std::fprintf(stderr, "lanes_ab: version %c does not give the dot kernels' bits\n", v == 0 ? 'A' : 'B');
      return 1;
    }
  }

  // Calls per timing: about 4e6 multiply-adds / 64 each, so one timing lasts milliseconds, not microseconds.
  const int reps = std::max(1, int(4e6 / (double(cols) * double(rows) * double(nx) / 64.0)));
  int64_t call = 0;
  auto time_us = [&](LanesFn fn) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < reps; ++k, ++call) {
      const WeightMatrix w{wt, cols, rows, weights.data() + uint64_t(call % copies) * rs * uint64_t(rows), rs};
      fn(w, xp.data(), xs, nx, 0, rows, got_rows.data());
    }
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps;
  };
  std::vector<double> ta, tb, ratio;
  for (int p = 0; p < pairs; ++p) {
    double a, b;
    if (p % 2 == 0) {
      a = time_us(lanes_a);
      b = time_us(lanes_b);
    } else {
      b = time_us(lanes_b);
      a = time_us(lanes_a);
    }
    ta.push_back(a);
    tb.push_back(b);
    ratio.push_back(b / a);
  }
  std::printf(
      "{\"type\": \"%s\", \"cols\": %ld, \"rows\": %ld, \"act_rows\": %ld, \"copies\": %ld, \"pairs\": %d, "
      "\"a_us_median\": %.1f, \"b_us_median\": %.1f, \"b_over_a_median\": %.3f, \"b_over_a_q1\": %.3f, "
      "\"b_over_a_q3\": %.3f}\n",
      type.c_str(), long(cols), long(rows), long(nx), long(copies), pairs, quantile(ta, 0.5), quantile(tb, 0.5),
      quantile(ratio, 0.5), quantile(ratio, 0.25), quantile(ratio, 0.75));
  return 0;
}
