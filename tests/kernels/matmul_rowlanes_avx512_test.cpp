// The AVX-512 row-lane Q4_K and Q6_K products (matmul_rowlanes_avx512.h) against the dot kernels and the scalar
// reference, bit for bit: activation-row counts from one row to several passes, weight-row ranges that
// start and end inside a sixteen-row vector, the largest integers a block can produce, and activation rows
// from elsewhere whose bsums are not their values' sums (Q4_K's reference uses them as given, Q6_K's reads
// only the values, and so must these products). Skipped where the CPU has no AVX-512 VNNI.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "kernels/blocks.h"
#include "kernels/kernel_cases.h"
#include "kernels/kernel_traits.h"
#include "kernels/matmul.h"
#include "product_test_util.h"
#if defined(__x86_64__)
#include "kernels/matmul_rowlanes_avx512.h"
#endif

namespace essaim {
namespace {

using namespace product_test;

#if defined(__x86_64__)
constexpr RowsFn kPath = rowlanes_matmul_rows;
#else
constexpr RowsFn kPath = nullptr;  // not built here; the tests skip
#endif

std::vector<float> rowlanes_product(const WeightMatrix& w, const std::vector<uint8_t>& xq, int64_t n_rows,
                                    int64_t o_begin, int64_t o_end) {
  return direct_product(kPath, Isa::AVX512, w, xq, n_rows, o_begin, o_end);
}

void expect_rowlanes_give_the_reference(const WeightMatrix& w, const std::vector<uint8_t>& xq, int64_t n) {
  expect_direct_gives_the_reference(kPath, Isa::AVX512, w, xq, n);
}

#define SKIP_WITHOUT_AVX512() \
  if (!isa_supported(Isa::AVX512)) GTEST_SKIP() << "this CPU has no AVX-512 VNNI"

TEST(RowLanes, EqualTheDotKernelsAndTheScalarReference) {
  SKIP_WITHOUT_AVX512();
  KernelChoiceGuard guard;
  set_amx_enabled(false);  // the tiles would take these rows first where the CPU has them
  for (const GgmlType type : {GgmlType::Q4_K, GgmlType::Q6_K})
  for (const WeightFill fill : {WeightFill::QUANTIZED, WeightFill::RANDOM_BITS})
  for (const int64_t cols : {256, 768, 3072}) {
    const KernelProblem p = kernel_problem_build(
        KernelCase{.name = "rowlanes", .type = type, .cols = cols, .rows = 70, .n_rows = 300, .fill = fill},
        uint64_t(cols) + (fill == WeightFill::QUANTIZED ? 21 : 22));
    // 3072 columns keep 56 rows per pass of 192 KiB and 149 of 512 KiB (rowlanes_pass_bytes): 63, 100 and
    // 300 rows take several passes with the first, 300 with the second.
    for (const uint64_t pass_bytes : {192u * 1024, 512u * 1024})
    for (const int64_t n : {1, 2, 3, 4, 5, 6, 7, 9, 16, 17, 63, 100, 300}) {
      set_lane_pass_bytes(pass_bytes);
      const std::vector<uint8_t> xq = quantised(p, n);
      for (const auto& [o_begin, o_end] : {std::pair<int64_t, int64_t>{0, 70}, {3, 65}, {15, 17}, {69, 70}}) {
        SCOPED_TRACE(std::string(type_name(type)) + ", " + std::to_string(cols) + " cols, " + std::to_string(n) + " rows, weight rows " +
                     std::to_string(o_begin) + ".." + std::to_string(o_end));
        const std::vector<float> lanes = rowlanes_product(p.weights(), xq, n, o_begin, o_end);
        set_lanes_enabled(true);
        ASSERT_TRUE(rowlanes_enabled());
        // The scalar reference is slow: two counts suffice.
        ASSERT_NO_FATAL_FAILURE(expect_same_as_matmul_rows(lanes, p.weights(), xq, n, o_begin, o_end,
                                                           cols == 768 && (n == 9 || n == 100)));
      }
    }
  }
}

// Q4_K: every nibble 15 and every scale and min 63; Q6_K: every value 0 with every scale -128 and every
// value 63 with every scale 127 — against activations of -128 (and 127) with their bsums: the largest half
// sub-block sums (Q4_K: 16·15·128, which must fit the low word vpdpwssd reads) and the largest |A| and |M|
// a block can produce, still exact.
TEST(RowLanes, LargestIntegersStayExact) {
  SKIP_WITHOUT_AVX512();
  KernelChoiceGuard guard;
  const int64_t cols = 512, rows = 40, n = 18;
  for (const GgmlType type : {GgmlType::Q4_K, GgmlType::Q6_K})
    for (const int period : {1, 2, 3}) {
      SCOPED_TRACE(std::string(type_name(type)) + ", period " + std::to_string(period));
      expect_rowlanes_give_the_reference(ExtremeWeights(type, rows, cols).matrix(), extreme_activations(n, cols, period), n);
    }
}

// Activation rows that did not come from essaim's quantiser may carry any bsums, down to -32768 and up to
// 32767 side by side; Q4_K's reference uses them as given, Q6_K's reads only the values, and so do the row
// lanes.
TEST(RowLanes, ForeignBsumsGiveTheReference) {
  SKIP_WITHOUT_AVX512();
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
    blocks[9].bsums[0] = -32768;
    blocks[9].bsums[1] = -32768;
    expect_rowlanes_give_the_reference(p.weights(), xq, 24);
    // One row alone (Q4_K: the decode form, rowlanes_one_row_q4k): rows 3 and 4 hold pairs whose sum is no
    // 16-bit word (32767 + 32767, -32768 + -32768), rows 0 and 5 single foreign values — a form that summed
    // pairs of bsums as words without checking would fail here (it was tried, docs/engine.md).
    const size_t row_bytes = xq.size() / 24;
    for (const size_t r : {0, 3, 4, 5, 6}) {
      SCOPED_TRACE("activation row " + std::to_string(r) + " alone");
      const std::vector<uint8_t> one(xq.begin() + std::ptrdiff_t(r * row_bytes), xq.begin() + std::ptrdiff_t((r + 1) * row_bytes));
      expect_rowlanes_give_the_reference(p.weights(), one, 1);
    }
  }
}

// The weight rows of a matrix inside a larger buffer, with a row stride beyond their bytes (as a fused
// gate_up view or an expert stride presents them): rows are read at o·row_stride, never past them.
TEST(RowLanes, RowStrideWiderThanTheRow) {
  SKIP_WITHOUT_AVX512();
  KernelChoiceGuard guard;
  for (const GgmlType type : {GgmlType::Q4_K, GgmlType::Q6_K}) {
  SCOPED_TRACE(type_name(type));
  const KernelProblem p =
      kernel_problem_build(KernelCase{.name = "stride", .type = type, .cols = 512, .rows = 33, .n_rows = 11}, 5);
  const WeightMatrix tight = p.weights();
  const uint64_t stride = tight.row_stride + 2 * (type == GgmlType::Q4_K ? sizeof(BlockQ4K) : sizeof(BlockQ6K));
  std::vector<uint8_t> wide(stride * uint64_t(tight.rows), 0xA5);
  for (int64_t o = 0; o < tight.rows; ++o)
    std::memcpy(wide.data() + uint64_t(o) * stride, tight.data + uint64_t(o) * tight.row_stride, tight.row_stride);
  WeightMatrix w = tight;
  w.data = wide.data();
  w.row_stride = stride;
  const std::vector<uint8_t> xq = quantised(p, 11);
  ASSERT_TRUE(same_bits(rowlanes_product(w, xq, 11, 0, 33), rowlanes_product(tight, xq, 11, 0, 33)));
  expect_rowlanes_give_the_reference(w, xq, 11);
  }
}

TEST(RowLanes, EnvChild) {
  const char* want = std::getenv("ESSAIM_LANES_EXPECT");
  if (want == nullptr) GTEST_SKIP() << "runs as a child of EnvironmentTurnsThemOff";
  EXPECT_EQ(rowlanes_enabled() ? "1" : "0", std::string(want));
}

TEST(RowLanes, EnvironmentTurnsThemOff) {
  auto run_child = [](const std::string& env) { return run_self("RowLanes.EnvChild", "ESSAIM_LANES", env); };
  const bool avx512 = isa_supported(Isa::AVX512);
  const std::string on = avx512 ? "1" : "0";
  EXPECT_EQ(run_child("ESSAIM_ISA=avx512 ESSAIM_LANES_EXPECT=" + on), 0);
  EXPECT_NE(run_child("ESSAIM_ISA=avx512 ESSAIM_LANES_EXPECT=" + std::string(avx512 ? "0" : "1")), 0)
      << "the child must be able to fail";
  EXPECT_EQ(run_child("ESSAIM_ISA=avx512 ESSAIM_LANES=0 ESSAIM_LANES_EXPECT=0"), 0);
  EXPECT_EQ(run_child("ESSAIM_ISA=avx2 ESSAIM_LANES_EXPECT=0"), 0) << "only the AVX-512 kernels use them";
}

}  // namespace
}  // namespace essaim
