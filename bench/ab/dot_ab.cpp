// Paired comparison of two versions of the AVX2 dot kernels (dot_quant_avx2.cpp) in one process, for hosts
// too noisy for separate runs. scripts/dot-ab.sh compiles each version in its own namespace (essaim_a,
// essaim_b) and links them here. Each version runs the products as matmul_rows would — one activation row:
// four weight rows per call through the four-row kernel (Q4_K/Q5_K), the rest one by one; several rows:
// up to eight per call — on its own prepared activations, and both are checked against matmul_rows of the
// library under AVX2 bit for bit; then they are called alternately, `pairs` times, on weights spread over
// `copies` copies (enough copies put them beyond the caches, as a decode streams them), and the median of
// the pairs' B/A ratios with its quartiles is printed as JSON.
//
//   scripts/dot-ab.sh OLD.cpp NEW.cpp 3072 1024 1 q4_k 1 [pairs]   # cols rows act_rows type copies
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "ab_pairs.h"
#include "core/ggml_type.h"
#include "kernels/kernel_traits.h"
#include "kernels/matmul.h"
#include "kernels/quantize.h"

// The two versions' entry points (dot_kernels.h in each version's namespace).
#define ESSAIM_AB_DECLARE(ns)                                                                                   \
  namespace ns {                                                                                                \
  std::atomic<int64_t> g_weight_prefetch_bytes{0};                                                              \
  void vec_dot_q4k_q8k_avx2(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y);              \
  void vec_dot_q5k_q8k_avx2(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y);              \
  void vec_dot_q6k_q8k_avx2(int64_t n, const void* w, const void* x, size_t xs, int nx, float* y);              \
  void dot_q4k_w4_avx2(int64_t n, const void* w, size_t w_stride, const void* x, float* y);                     \
  void dot_q5k_w4_avx2(int64_t n, const void* w, size_t w_stride, const void* x, float* y);                     \
  void prepare_q8k_q45k_avx2(const void* x, void* out, int64_t n);                                              \
  void prepare_q8k_q6k_avx2(const void* x, void* out, int64_t n);                                               \
  }
ESSAIM_AB_DECLARE(essaim_a)
ESSAIM_AB_DECLARE(essaim_b)
#undef ESSAIM_AB_DECLARE

using namespace essaim;

namespace {

using DotFn = void (*)(int64_t, const void*, const void*, size_t, int, float*);
using W4Fn = void (*)(int64_t, const void*, size_t, const void*, float*);
using PrepFn = void (*)(const void*, void*, int64_t);

struct Version {
  DotFn dot;
  W4Fn w4;  // null: one activation row runs one weight row per call
  PrepFn prepare;
  std::atomic<int64_t>* prefetch;
};

Version version(char v, GgmlType t) {
  const bool a = v == 'a';
  if (t == GgmlType::Q6_K)
    return {a ? essaim_a::vec_dot_q6k_q8k_avx2 : essaim_b::vec_dot_q6k_q8k_avx2, nullptr,
            a ? essaim_a::prepare_q8k_q6k_avx2 : essaim_b::prepare_q8k_q6k_avx2,
            a ? &essaim_a::g_weight_prefetch_bytes : &essaim_b::g_weight_prefetch_bytes};
  const bool q5 = t == GgmlType::Q5_K;
  return {a ? (q5 ? essaim_a::vec_dot_q5k_q8k_avx2 : essaim_a::vec_dot_q4k_q8k_avx2)
            : (q5 ? essaim_b::vec_dot_q5k_q8k_avx2 : essaim_b::vec_dot_q4k_q8k_avx2),
          a ? (q5 ? essaim_a::dot_q5k_w4_avx2 : essaim_a::dot_q4k_w4_avx2)
            : (q5 ? essaim_b::dot_q5k_w4_avx2 : essaim_b::dot_q4k_w4_avx2),
          a ? essaim_a::prepare_q8k_q45k_avx2 : essaim_b::prepare_q8k_q45k_avx2,
          a ? &essaim_a::g_weight_prefetch_bytes : &essaim_b::g_weight_prefetch_bytes};
}

// y[t * rows + r] = dot(weight row r, activation row t), as matmul_rows forms it on the AVX2 dot kernels.
void products(const Version& v, const uint8_t* w, uint64_t rs, int64_t rows, int64_t cols, const uint8_t* xp,
              uint64_t xs, int64_t nx, float* y) {
  if (nx == 1) {
    int64_t r = 0;
    if (v.w4 != nullptr)
      for (; r + 4 <= rows; r += 4) v.w4(cols, w + uint64_t(r) * rs, rs, xp, y + r);
    for (; r < rows; ++r) v.dot(cols, w + uint64_t(r) * rs, xp, xs, 1, y + r);
    return;
  }
  float out[8];
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t t = 0; t < nx; t += 8) {
      const int n = int(std::min<int64_t>(8, nx - t));
      v.dot(cols, w + uint64_t(r) * rs, xp + uint64_t(t) * xs, xs, n, out);
      for (int j = 0; j < n; ++j) y[(t + j) * rows + r] = out[j];
    }
}

}  // namespace

int main(int argc, char** argv) {
  ab::Args args;
  if (!ab::parse_args(argc, argv, "dot_ab", {"q4_k", "q5_k", "q6_k"}, &args)) return 2;
  if (!isa_supported(Isa::AVX2)) {
    std::fprintf(stderr, "dot_ab: this CPU has no AVX2\n");
    return 2;
  }
  const int64_t cols = args.cols, rows = args.rows, nx = args.act_rows, copies = args.copies;
  const GgmlType wt = ab::type_of(args.type);
  const Status isa = set_kernel_isa(Isa::AVX2);
  if (!isa.is_ok()) {
    std::fprintf(stderr, "dot_ab: %s\n", isa.message().c_str());
    return 2;
  }

  std::mt19937 rng(1);
  const uint64_t rs = type_traits(wt).row_bytes(cols);
  const std::vector<uint8_t> weights = ab::quantized_rows(wt, cols, rows * copies, rs, rng);  // [copies][rows]
  const uint64_t xs = activation_row_bytes(wt, cols);
  const std::vector<uint8_t> xq = ab::quantized_rows(GgmlType::Q8_K, cols, nx, xs, rng);

  // The library's result under AVX2, then each version on its own prepared rows, with the library's
  // prefetch distance.
  std::vector<float> want(size_t(nx * rows)), got(size_t(nx * rows));
  std::vector<float*> want_rows(static_cast<size_t>(nx));
  for (int64_t t = 0; t < nx; ++t) want_rows[size_t(t)] = want.data() + t * rows;
  std::vector<uint8_t> scratch;
  const uint8_t* lib_x = prepare_rows(wt, xq.data(), nx, cols, scratch);
  matmul_rows(WeightMatrix{wt, cols, rows, weights.data(), rs}, lib_x, nx, 0, rows, want_rows.data());
  Version vs[2] = {version('a', wt), version('b', wt)};
  std::vector<uint8_t> xp[2];
  for (int v = 0; v < 2; ++v) {
    vs[v].prefetch->store(weight_prefetch_bytes());
    xp[v].resize(xq.size());
    for (int64_t t = 0; t < nx; ++t) vs[v].prepare(xq.data() + uint64_t(t) * xs, xp[v].data() + uint64_t(t) * xs, cols);
    products(vs[v], weights.data(), rs, rows, cols, xp[v].data(), xs, nx, got.data());
    if (std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) != 0) {
      std::fprintf(stderr, "dot_ab: version %c does not give matmul_rows' bits\n", v == 0 ? 'A' : 'B');
      return 1;
    }
  }

  const int reps = ab::calls_per_timing(args);
  int64_t call = 0;
  auto time_us = [&](int v) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < reps; ++k, ++call)
      products(vs[v], weights.data() + uint64_t(call % copies) * rs * uint64_t(rows), rs, rows, cols, xp[v].data(), xs,
               nx, got.data());
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps;
  };
  ab::run_pairs(args, [&] { return time_us(0); }, [&] { return time_us(1); });
  return 0;
}
