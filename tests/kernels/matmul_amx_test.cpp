// The AMX tile path for Q4_K and Q6_K (matmul_amx.h) against the dot kernels and the scalar reference, bit
// for bit: every activation-row count around the 16-row groups and the 256-row passes, weight-row ranges
// that start and end inside a 16-row block, the largest integers a block can produce, and activation rows
// from elsewhere whose bsums are not their values' sums (Q4_K's tiles must decline those; Q6_K's ignore
// them, as its reference does). Skipped where the CPU or
// the OS does not grant the tiles; the model bit pins then cover only the dot kernels.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/blocks.h"
#include "kernels/kernel_cases.h"
#include "kernels/kernel_traits.h"
#include "kernels/matmul.h"
#include "product_test_util.h"
#if defined(__x86_64__)
#include "kernels/matmul_amx.h"
#endif

namespace essaim {
namespace {

using namespace product_test;

// All weight rows of w through the tiles and through the scalar reference: the same bits, and not all zero.
void expect_tiles_give_the_reference(const WeightMatrix& w, const std::vector<uint8_t>& xq, int64_t n) {
  ASSERT_TRUE(set_kernel_isa(Isa::AVX512).is_ok());
  set_amx_enabled(true);
  const std::vector<float> tiles = rows_product(w, xq, n, 0, w.rows);
  ASSERT_TRUE(set_kernel_isa(Isa::SCALAR).is_ok());
  const std::vector<float> ref = rows_product(w, xq, n, 0, w.rows);
  ASSERT_TRUE(same_bits(tiles, ref));
  EXPECT_NE(ref[0], 0.0f);
}

#define SKIP_WITHOUT_AMX()                                                                                    \
  if (!amx_supported() || !isa_supported(Isa::AVX512)) GTEST_SKIP() << "this CPU or OS grants no AMX tiles"

TEST(Amx, EqualsTheDotKernelsAndTheScalarReference) {
  SKIP_WITHOUT_AMX();
  KernelChoiceGuard guard;
  for (const GgmlType type : {GgmlType::Q4_K, GgmlType::Q6_K})
  for (const WeightFill fill : {WeightFill::QUANTIZED, WeightFill::RANDOM_BITS})
  for (const int64_t cols : {256, 768, 3072}) {
    const KernelProblem p = kernel_problem_build(
        KernelCase{.name = "amx", .type = type, .cols = cols, .rows = 70, .n_rows = 300, .fill = fill},
        uint64_t(cols) + (fill == WeightFill::QUANTIZED ? 1 : 2));
    for (const int64_t n : {4, 5, 15, 16, 17, 33, 100, 256, 257, 300}) {
      const std::vector<uint8_t> xq = quantised(p, n);
      for (const auto& [o_begin, o_end] : {std::pair<int64_t, int64_t>{0, 70}, {3, 65}, {16, 32}, {69, 70}}) {
        SCOPED_TRACE(std::string(type_name(type)) + ", " + std::to_string(cols) + " cols, " + std::to_string(n) +
                     " rows, weight rows " + std::to_string(o_begin) + ".." + std::to_string(o_end));
        ASSERT_TRUE(set_kernel_isa(Isa::AVX512).is_ok());
        set_amx_enabled(true);
        ASSERT_TRUE(amx_enabled());
        const std::vector<float> tiles = rows_product(p.weights(), xq, n, o_begin, o_end);
#if defined(__x86_64__)
        {  // the tiles took these rows (a declined call would compare the dot kernels with themselves)
          std::vector<uint8_t> scratch;
          const uint8_t* xp = prepared(p.weights(), xq, n, scratch);
          std::vector<float> y(size_t(n * 70));
          std::vector<float*> y_rows = row_pointers(y, n, 70);
          ASSERT_TRUE(amx_matmul_rows(p.weights(), xp, activation_row_bytes(type, cols), n, o_begin, o_end,
                                      y_rows.data()));
        }
#endif
        set_amx_enabled(false);
        const std::vector<float> dots = rows_product(p.weights(), xq, n, o_begin, o_end);
        ASSERT_TRUE(same_bits(tiles, dots));
        if (cols == 768 && (n == 17 || n == 257)) {  // the scalar reference is slow: two counts suffice
          ASSERT_TRUE(set_kernel_isa(Isa::SCALAR).is_ok());
          ASSERT_TRUE(same_bits(tiles, rows_product(p.weights(), xq, n, o_begin, o_end)));
        }
      }
    }
  }
}

// Every nibble 15 and every scale and min 63 against activations of -128 (and of 127): the largest
// |A| = 256·945·128 and |M| the tiles can form, still exact.
TEST(AmxQ4k, LargestIntegersStayExact) {
  SKIP_WITHOUT_AMX();
  KernelChoiceGuard guard;
  const int64_t cols = 512, rows = 20, n = 18;
  expect_tiles_give_the_reference(ExtremeWeights(GgmlType::Q4_K, rows, cols).matrix(), extreme_activations(n, cols, 2), n);
}

// Q6_K: every value 0 (q - 32 = -32) with every scale -128, and every value 63 with every scale 127,
// against activations of -128 and 127: the largest products each digit tile and their sum can hold.
TEST(AmxQ6k, LargestIntegersStayExact) {
  SKIP_WITHOUT_AMX();
  KernelChoiceGuard guard;
  const int64_t cols = 512, rows = 20, n = 18;
  expect_tiles_give_the_reference(ExtremeWeights(GgmlType::Q6_K, rows, cols).matrix(), extreme_activations(n, cols, 3), n);
}

// Q6_K reads no bsums: rows with foreign ones still give the reference's bits through the tiles.
TEST(AmxQ6k, ForeignBsumsChangeNothing) {
  SKIP_WITHOUT_AMX();
  KernelChoiceGuard guard;
  const KernelProblem p = kernel_problem_build(
      KernelCase{.name = "q6_k", .type = GgmlType::Q6_K, .cols = 512, .rows = 40, .n_rows = 24}, 98);
  std::vector<uint8_t> xq = quantised(p, 24);
  give_foreign_bsums(xq);
  ASSERT_TRUE(set_kernel_isa(Isa::AVX512).is_ok());
  set_amx_enabled(true);
  const std::vector<float> tiles = rows_product(p.weights(), xq, 24, 0, 40);
  ASSERT_TRUE(set_kernel_isa(Isa::SCALAR).is_ok());
  ASSERT_TRUE(same_bits(tiles, rows_product(p.weights(), xq, 24, 0, 40)));
}

// Activation rows that did not come from essaim's quantiser may carry any bsums; the reference uses them
// as given. The tiles cannot (they form M from the values), so they decline the call, write nothing, and
// matmul_rows gives the dot kernels' bits.
TEST(AmxQ4k, ForeignBsumsAreDeclinedAndStillExact) {
  SKIP_WITHOUT_AMX();
  KernelChoiceGuard guard;
  const KernelProblem p = kernel_problem_build(
      KernelCase{.name = "q4_k", .type = GgmlType::Q4_K, .cols = 512, .rows = 40, .n_rows = 24}, 99);
  std::vector<uint8_t> xq = quantised(p, 24);
  auto* blocks = reinterpret_cast<BlockQ8K*>(xq.data());
  blocks[2 * 13 + 1].bsums[7] = int16_t(blocks[2 * 13 + 1].bsums[7] + 1);  // row 13, second super-block
  blocks[2 * 20].bsums[0] = -32768;
  ASSERT_TRUE(set_kernel_isa(Isa::AVX512).is_ok());
  set_amx_enabled(true);
#if defined(__x86_64__)
  std::vector<uint8_t> scratch;
  const uint8_t* xp = prepared(p.weights(), xq, 24, scratch);
  std::vector<float> y(size_t(24 * 40), 7.0f);
  std::vector<float*> y_rows = row_pointers(y, 24, 40);
  EXPECT_FALSE(amx_matmul_rows(p.weights(), xp, activation_row_bytes(GgmlType::Q4_K, 512), 24, 0, 40,
                               y_rows.data()));
  for (float v : y) ASSERT_EQ(v, 7.0f) << "a declined call writes nothing";
#endif
  const std::vector<float> tiles = rows_product(p.weights(), xq, 24, 0, 40);
  ASSERT_TRUE(set_kernel_isa(Isa::SCALAR).is_ok());
  ASSERT_TRUE(same_bits(tiles, rows_product(p.weights(), xq, 24, 0, 40)));
}

TEST(Amx, EnvChild) {
  const char* want = std::getenv("ESSAIM_AMX_EXPECT");
  if (want == nullptr) GTEST_SKIP() << "runs as a child of EnvironmentTurnsTheTilesOff";
  EXPECT_EQ(amx_enabled() ? "1" : "0", std::string(want));
}

TEST(Amx, EnvironmentTurnsTheTilesOff) {
  auto run_child = [](const std::string& env) { return run_self("Amx.EnvChild", "ESSAIM_AMX", env); };
  const std::string by_default = amx_supported() && isa_supported(Isa::AVX512) ? "1" : "0";
  EXPECT_EQ(run_child("ESSAIM_AMX_EXPECT=" + by_default), 0);
  EXPECT_NE(run_child(std::string("ESSAIM_AMX_EXPECT=") + (by_default == "1" ? "0" : "1")), 0)
      << "the child must be able to fail";
  EXPECT_EQ(run_child("ESSAIM_AMX=0 ESSAIM_AMX_EXPECT=0"), 0);
  EXPECT_EQ(run_child("ESSAIM_AMX=1 ESSAIM_ISA=avx2 ESSAIM_AMX_EXPECT=0"), 0) << "the tiles read the AVX-512 layout";
  EXPECT_EQ(run_child("ESSAIM_AMX=yes ESSAIM_AMX_EXPECT=" + by_default), 0);
}

}  // namespace
}  // namespace essaim
