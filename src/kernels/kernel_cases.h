// Kernel test and benchmark cases, shared so that what the benchmarks time is exactly what the tests check
// (test-backend-ops style: a case is {params, build, tolerance}; tests run it for correctness, benchmarks
// for speed). Not part of the production library.
//
//   for (const KernelCase& c : kernel_cases_correctness()) {
//     KernelProblem p = kernel_problem_build(c, /*seed=*/42);
//     matmul(p.weights(), p.x.data(), c.n_rows, y.data(), nullptr);    // then compare within c.tolerance
//   }
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/ggml_type.h"
#include "kernels/matmul.h"

namespace essaim {

// How weight bytes are made.
enum class WeightFill {
  QUANTIZED,    // seeded Gaussian floats through the reference quantiser: realistic blocks
  RANDOM_BITS,  // seeded random bytes with finite f16 scales: every bit pattern a file may hold
};

struct KernelCase {
  std::string name;  // "q4_k 3072x1024 n=8 quantized"
  GgmlType type = GgmlType::F32;
  int64_t cols = 0;    // input width (ne[0])
  int64_t rows = 0;    // output width (ne[1])
  int64_t n_rows = 1;  // activation rows (tokens)
  WeightFill fill = WeightFill::QUANTIZED;
  // Bound on |kernel - exact| / Σ_i |w_i x_i| for one output, where exact is the f64 dot of the dequantised
  // weights and the dequantised (vec_dot-format) activations: only f32 accumulation error remains.
  double tolerance = 1e-5;
};

struct KernelProblem {
  GgmlType type = GgmlType::F32;
  int64_t cols = 0, rows = 0, n_rows = 0;
  std::vector<uint8_t> w;  // rows * row_bytes(cols), row-major
  std::vector<float> x;    // n_rows * cols activations
  WeightMatrix weights() const;
};

// Seeded build of a case's operands. Activation rows vary in scale and include outliers; with several
// rows, row 1 starts with an all-zero super-block (the Q8_K amax == 0 path).
KernelProblem kernel_problem_build(const KernelCase& c, uint64_t seed);

// Small shapes for tests: every computable type, one block, several blocks, odd block counts, both fills.
std::vector<KernelCase> kernel_cases_correctness();

// Qwen3.5-122B expert shapes (3072 -> 1024 gate/up, 1024 -> 3072 down) for Q4_K, Q6_K and Q8_0 at
// 1, 8, 64 and 512 activation rows.
std::vector<KernelCase> kernel_cases_benchmark();

}  // namespace essaim
