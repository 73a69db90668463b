// The AVX2 lane-per-row Q4_K and Q6_K products (matmul_lanes_avx2.h) against the dot kernels and the scalar
// reference, bit for bit: activation-row counts around the eight-row groups and the passes of groups,
// weight-row ranges that start and end inside a 16-row chunk, the largest integers a block can produce,
// and activation rows from elsewhere whose bsums are not their values' sums (Q4_K's reference uses them as
// given, Q6_K's reads only the values, and so must these products). Skipped where the CPU has no AVX2.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/blocks.h"
#include "kernels/kernel_cases.h"
#include "kernels/kernel_traits.h"
#include "kernels/matmul.h"
#include "product_test_util.h"
#if defined(__x86_64__)
#include "kernels/matmul_lanes_avx2.h"
#endif

namespace essaim {
namespace {

using namespace product_test;

#if defined(__x86_64__)
constexpr RowsFn kPath = lanes_matmul_rows;
#else
constexpr RowsFn kPath = nullptr;  // not built here; the tests skip
#endif

std::vector<float> lanes_product(const WeightMatrix& w, const std::vector<uint8_t>& xq, int64_t n_rows,
                                 int64_t o_begin, int64_t o_end) {
  return direct_product(kPath, Isa::AVX2, w, xq, n_rows, o_begin, o_end);
}

void expect_lanes_give_the_reference(const WeightMatrix& w, const std::vector<uint8_t>& xq, int64_t n) {
  expect_direct_gives_the_reference(kPath, Isa::AVX2, w, xq, n);
}

#define SKIP_WITHOUT_AVX2() \
  if (!isa_supported(Isa::AVX2)) GTEST_SKIP() << "this CPU has no AVX2"

TEST(Lanes, EqualsTheDotKernelsAndTheScalarReference) {
  SKIP_WITHOUT_AVX2();
  KernelChoiceGuard guard;
  for (const GgmlType type : {GgmlType::Q4_K, GgmlType::Q6_K})
  for (const WeightFill fill : {WeightFill::QUANTIZED, WeightFill::RANDOM_BITS})
  for (const int64_t cols : {256, 768, 3072}) {
    const KernelProblem p = kernel_problem_build(
        KernelCase{.name = "lanes", .type = type, .cols = cols, .rows = 70, .n_rows = 300, .fill = fill},
        uint64_t(cols) + (fill == WeightFill::QUANTIZED ? 11 : 12));
    // Groups of eight in pairs (sixteen rows at once), an odd last group alone; 3072 columns hold six groups
    // per pass of 192 KiB and ten of 320 KiB (lanes_pass_bytes): 63, 100 and 300 rows take several passes
    // with the first (100 ends on a pass of one group), 100 and 300 with the second (100 ends on five groups:
    // pairs and one alone).
    for (const uint64_t pass_bytes : {192u * 1024, 320u * 1024})
    for (const int64_t n : {5, 7, 8, 9, 13, 16, 17, 24, 63, 100, 300}) {
      set_lane_pass_bytes(pass_bytes);
      const std::vector<uint8_t> xq = quantised(p, n);
      for (const auto& [o_begin, o_end] : {std::pair<int64_t, int64_t>{0, 70}, {3, 65}, {15, 17}, {69, 70}}) {
        SCOPED_TRACE(std::string(type_name(type)) + ", " + std::to_string(cols) + " cols, " + std::to_string(n) + " rows, weight rows " +
                     std::to_string(o_begin) + ".." + std::to_string(o_end));
        ASSERT_TRUE(set_kernel_isa(Isa::AVX2).is_ok());
        const std::vector<float> lanes = lanes_product(p.weights(), xq, n, o_begin, o_end);
        set_lanes_enabled(true);
        ASSERT_TRUE(lanes_enabled());
        // The scalar reference is slow: two counts suffice.
        ASSERT_NO_FATAL_FAILURE(expect_same_as_matmul_rows(lanes, p.weights(), xq, n, o_begin, o_end,
                                                           cols == 768 && (n == 9 || n == 100)));
      }
    }
  }
}

// Every nibble 15 and every scale and min 63 against activations of -128 (and 127) with their bsums: the
// largest 16-bit word sums (8·2·15·128) and the largest |A| and |M| a block can produce, still exact.
TEST(LanesQ4k, LargestIntegersStayExact) {
  SKIP_WITHOUT_AVX2();
  KernelChoiceGuard guard;
  const int64_t cols = 512, rows = 40, n = 18;
  expect_lanes_give_the_reference(ExtremeWeights(GgmlType::Q4_K, rows, cols).matrix(), extreme_activations(n, cols, 2), n);
}

// Q6_K: every value 0 (q - 32 = -32) with every scale -128, and every value 63 with every scale 127,
// against activations of -128 and 127: the largest word sums (2·2·63·128) and the largest |A|.
TEST(LanesQ6k, LargestIntegersStayExact) {
  SKIP_WITHOUT_AVX2();
  KernelChoiceGuard guard;
  const int64_t cols = 512, rows = 40, n = 18;
  expect_lanes_give_the_reference(ExtremeWeights(GgmlType::Q6_K, rows, cols).matrix(), extreme_activations(n, cols, 3), n);
}

// Activation rows that did not come from essaim's quantiser may carry any bsums; Q4_K's reference uses
// them as given and Q6_K's reads only the values, and so do the lanes.
TEST(Lanes, ForeignBsumsGiveTheReference) {
  SKIP_WITHOUT_AVX2();
  KernelChoiceGuard guard;
  for (const GgmlType type : {GgmlType::Q4_K, GgmlType::Q6_K}) {
    SCOPED_TRACE(type_name(type));
    const KernelProblem p =
        kernel_problem_build(KernelCase{.name = "bsums", .type = type, .cols = 512, .rows = 40, .n_rows = 24}, 97);
    std::vector<uint8_t> xq = quantised(p, 24);
    give_foreign_bsums(xq);
    auto* blocks = reinterpret_cast<BlockQ8K*>(xq.data());
    blocks[7].bsums[3] = 32767;
    blocks[7].bsums[2] = 32767;
    expect_lanes_give_the_reference(p.weights(), xq, 24);
  }
}

TEST(Lanes, EnvChild) {
  const char* want = std::getenv("ESSAIM_LANES_EXPECT");
  if (want == nullptr) GTEST_SKIP() << "runs as a child of EnvironmentTurnsThemOff";
  EXPECT_EQ(lanes_enabled() ? "1" : "0", std::string(want));
}

TEST(Lanes, EnvironmentTurnsThemOff) {
  auto run_child = [](const std::string& env) { return run_self("Lanes.EnvChild", "ESSAIM_LANES", env); };
  const bool avx2 = isa_supported(Isa::AVX2);
  const std::string on = avx2 ? "1" : "0";
  EXPECT_EQ(run_child("ESSAIM_ISA=avx2 ESSAIM_LANES_EXPECT=" + on), 0);
  EXPECT_NE(run_child("ESSAIM_ISA=avx2 ESSAIM_LANES_EXPECT=" + std::string(avx2 ? "0" : "1")), 0)
      << "the child must be able to fail";
  EXPECT_EQ(run_child("ESSAIM_ISA=avx2 ESSAIM_LANES=0 ESSAIM_LANES_EXPECT=0"), 0);
  EXPECT_EQ(run_child("ESSAIM_ISA=scalar ESSAIM_LANES_EXPECT=0"), 0) << "only the AVX2 kernels use them";
  EXPECT_EQ(run_child("ESSAIM_ISA=avx2 ESSAIM_LANES=yes ESSAIM_LANES_EXPECT=" + on), 0);
}

}  // namespace
}  // namespace essaim
