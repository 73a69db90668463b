// Paired comparison of two versions of the AVX2 lanes kernel (matmul_lanes_avx2.cpp) — or, built with
// -DAB_ROWLANES, of the AVX-512 row-lane kernel (matmul_rowlanes_avx512.cpp) — in one process, for
// hosts too noisy for separate runs. scripts/lanes-ab.sh compiles each version under its own name
// (lanes_a, lanes_b) and links them here. Both are checked against matmul_rows (the dot kernels) bit for
// bit, then called alternately, `pairs` times, on weights spread over `copies` copies (enough copies put
// them beyond the caches, as an expert's weights are in a prefill); each pair's B/A ratio cancels the
// host's slow drifts, and the median ratio with its quartiles is printed as JSON. AB_THREADS=2 splits each
// call's weight rows into two halves run at once on two threads (a decode's two threads sharing the
// memory bus; times include starting the second thread once per timing, amortised over its calls).
//
//   scripts/lanes-ab.sh OLD.cpp NEW.cpp 1024 3072 16 q6_k 16 [pairs]   # cols rows act_rows type copies
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "ab_pairs.h"
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

#ifdef AB_ROWLANES
constexpr Isa kIsa = Isa::AVX512;
#else
constexpr Isa kIsa = Isa::AVX2;
#endif

int main(int argc, char** argv) {
  ab::Args args;
  if (!ab::parse_args(argc, argv, "lanes_ab", {"q4_k", "q6_k"}, &args)) return 2;
  if (!isa_supported(kIsa)) {
    std::fprintf(stderr, "lanes_ab: this CPU has no %s\n", kIsa == Isa::AVX2 ? "AVX2" : "AVX-512 VNNI");
    return 2;
  }
  const int64_t cols = args.cols, rows = args.rows, nx = args.act_rows, copies = args.copies;
  const GgmlType wt = ab::type_of(args.type);

  std::mt19937 rng(1);
  const uint64_t rs = type_traits(wt).row_bytes(cols);
  const std::vector<uint8_t> weights = ab::quantized_rows(wt, cols, rows * copies, rs, rng);  // [copies][rows]
  const uint64_t xs = activation_row_bytes(wt, cols);
  const std::vector<uint8_t> xq = ab::quantized_rows(GgmlType::Q8_K, cols, nx, xs, rng);
  std::vector<uint8_t> xp = xq;
  if (PrepareFn prep = kernel_traits(wt)->prepare_for(kIsa))
    for (int64_t t = 0; t < nx; ++t) prep(xq.data() + uint64_t(t) * xs, xp.data() + uint64_t(t) * xs, cols);

  std::vector<float> want(size_t(nx * rows)), got(size_t(nx * rows));
  std::vector<float*> want_rows(static_cast<size_t>(nx)), got_rows(static_cast<size_t>(nx));
  for (int64_t t = 0; t < nx; ++t) {
    want_rows[size_t(t)] = want.data() + t * rows;
    got_rows[size_t(t)] = got.data() + t * rows;
  }
  const Status isa = set_kernel_isa(kIsa);
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

  const int reps = ab::calls_per_timing(args);
  const char* threads_env = std::getenv("AB_THREADS");
  const bool two_threads = threads_env && std::atoi(threads_env) == 2;
  const int64_t half = rows / 32 * 16;  // the second thread's rows start on a multiple of 16
  int64_t call = 0;
  auto run_calls = [&](LanesFn fn, int64_t first_call, int64_t o_begin, int64_t o_end) {
    for (int k = 0; k < reps; ++k) {
      const WeightMatrix w{wt, cols, rows, weights.data() + uint64_t((first_call + k) % copies) * rs * uint64_t(rows), rs};
      fn(w, xp.data(), xs, nx, o_begin, o_end, got_rows.data());
    }
  };
  auto time_us = [&](LanesFn fn) {
    const auto t0 = std::chrono::steady_clock::now();
    if (two_threads && half > 0) {
      std::thread second([&] { run_calls(fn, call, half, rows); });
      run_calls(fn, call, 0, half);
      second.join();
    } else {
      run_calls(fn, call, 0, rows);
    }
    call += reps;
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps;
  };
  ab::run_pairs(args, [&] { return time_us(lanes_a); }, [&] { return time_us(lanes_b); });
  return 0;
}
