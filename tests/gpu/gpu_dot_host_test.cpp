// The CUDA kernels' dot products (src/gpu/dot_device.h), compiled here as plain C++ for the host, against
// the scalar reference (src/kernels/dot_scalar.cpp): bit-identical on every kernel case, both weight fills,
// one to several blocks, and the 122B expert shapes. This runs on every machine, GPU or not; what it cannot
// check is the device's own arithmetic (__fmaf_rn, __fmul_rn, __fadd_rn, __half2float), which are IEEE
// single-rounding operations by specification, and gpu_matmul_test checks on a device.
#include <gtest/gtest.h>

#include <bit>
#include <random>
#include <set>
#include <vector>

#include "gpu/dot_device.h"
#include "kernels/dot_kernels.h"
#include "kernels/kernel_cases.h"
#include "kernels/kernel_traits.h"
#include "kernels/matmul.h"

namespace essaim {
namespace {

using DotOne = float (*)(int64_t, const void*, const void*);

struct Pair {
  DotOne device_code;
  VecDotFn reference;
};

Pair kernels_of(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return {gpu::dot_f32, vec_dot_f32_f32_scalar};
    case GgmlType::F16: return {gpu::dot_f16, vec_dot_f16_f16_scalar};
    case GgmlType::BF16: return {gpu::dot_bf16, vec_dot_bf16_bf16_scalar};
    case GgmlType::Q8_0: return {gpu::dot_q8_0, vec_dot_q8_0_q8_0_scalar};
    case GgmlType::Q4_K: return {gpu::dot_q4k, vec_dot_q4k_q8k_scalar};
    case GgmlType::Q5_K: return {gpu::dot_q5k, vec_dot_q5k_q8k_scalar};
    case GgmlType::Q6_K: return {gpu::dot_q6k, vec_dot_q6k_q8k_scalar};
    default: return {nullptr, nullptr};
  }
}

// Every output of the case: device code == reference, bit for bit. Returns the distinct output bit
// patterns seen (the inputs are seeded random, so they must vary).
size_t expect_case_equal(const KernelCase& c, uint64_t seed) {
  const KernelProblem p = kernel_problem_build(c, seed);
  const Pair k = kernels_of(c.type);
  EXPECT_NE(k.device_code, nullptr) << c.name;
  if (k.device_code == nullptr) return 0;
  const uint64_t xs = activation_row_bytes(c.type, c.cols);
  std::vector<uint8_t> xq(size_t(c.n_rows) * xs);
  quantize_activations(c.type, p.x.data(), c.n_rows, c.cols, xq.data());
  const WeightMatrix w = p.weights();
  std::set<uint32_t> seen;
  int mismatches = 0;
  for (int64_t t = 0; t < c.n_rows; ++t)
    for (int64_t r = 0; r < c.rows; ++r) {
      const uint8_t* wr = w.data + uint64_t(r) * w.row_stride;
      const uint8_t* xr = xq.data() + uint64_t(t) * xs;
      float want = 0;
      k.reference(c.cols, wr, xr, xs, 1, &want);
      const float got = k.device_code(c.cols, wr, xr);
      seen.insert(std::bit_cast<uint32_t>(want));
      if (std::bit_cast<uint32_t>(got) != std::bit_cast<uint32_t>(want) && ++mismatches <= 3)
        ADD_FAILURE() << c.name << " row " << t << " output " << r << ": device code " << got << " ("
                      << std::hex << std::bit_cast<uint32_t>(got) << "), reference " << want << " ("
                      << std::bit_cast<uint32_t>(want) << ")" << std::dec;
    }
  EXPECT_EQ(mismatches, 0) << c.name;
  return seen.size();
}

TEST(GpuDotHostTest, EveryCorrectnessCaseMatchesTheScalarReference) {
  const std::vector<KernelCase> cases = kernel_cases_correctness();
  ASSERT_FALSE(cases.empty());
  std::set<GgmlType> types;
  for (const KernelCase& c : cases) {
    if (kernels_of(c.type).device_code == nullptr) continue;
    types.insert(c.type);
    const size_t distinct = expect_case_equal(c, 7);
    EXPECT_GT(distinct, size_t(1)) << c.name << ": outputs do not vary";
  }
  // Every type the GPU worker computes has cases.
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K,
                     GgmlType::Q6_K})
    EXPECT_TRUE(types.count(t)) << type_name(t);
}

// The 122B expert shapes (gate/up 3072 -> 1024, down 1024 -> 3072) at one and two activation rows, for each
// type the worker serves, both fills.
TEST(GpuDotHostTest, ExpertShapesMatchTheScalarReference) {
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0})
    for (WeightFill fill : {WeightFill::QUANTIZED, WeightFill::RANDOM_BITS})
      for (auto [cols, rows] : {std::pair<int64_t, int64_t>{3072, 64}, {1024, 192}}) {
        const KernelCase c{.name = std::string(type_name(t)) + " " + std::to_string(cols) + "x" + std::to_string(rows) +
                                   (fill == WeightFill::QUANTIZED ? " quantized" : " random bits"),
                           .type = t, .cols = cols, .rows = rows, .n_rows = 2, .fill = fill};
        EXPECT_GT(expect_case_equal(c, 11), size_t(1)) << c.name;
      }
}

// The device's unpacking of the 12 packed scale bytes equals blocks.h's, for random patterns.
TEST(GpuDotHostTest, ScaleUnpackingMatchesBlocksH) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 2000; ++trial) {
    uint8_t s[12];
    for (uint8_t& b : s) b = uint8_t(rng());
    for (int j = 0; j < 8; ++j) {
      uint8_t sc0, m0, sc1, m1;
      q4k_scale_min(s, j, &sc0, &m0);
      gpu::scale_min_k4(s, j, &sc1, &m1);
      ASSERT_EQ(sc0, sc1);
      ASSERT_EQ(m0, m1);
    }
  }
}

}  // namespace
}  // namespace essaim
