// Device matrix products (src/gpu/cuda_matmul.h) against the CPU's matmul_preq, bit for bit: every kernel
// case under the scalar reference ISA, the 122B expert shapes at 1, 8, 64 and 67 rows (a partial last
// tile), and a row computed alone against the same row inside a batch. Needs a CUDA build; skips with the reason without a device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <vector>

#include "gpu/cuda_expert_executor.h"
#include "gpu/cuda_matmul.h"
#include "kernels/kernel_cases.h"
#include "kernels/kernel_traits.h"
#include "kernels/matmul.h"
#include "skip.h"

namespace essaim::gpu {
namespace {

#define ESSAIM_SKIP_WITHOUT_GPU()                                                   \
  do {                                                                              \
    const CudaAvailability a = cuda_availability();                                 \
    if (a.devices == 0) ESSAIM_SKIP_MISSING_HARDWARE(a.reason);                    \
  } while (0)

// Device buffer freed at scope exit.
struct Dev {
  void* p = nullptr;
  explicit Dev(size_t n) { EXPECT_EQ(cudaMalloc(&p, n == 0 ? 1 : n), cudaSuccess); }
  ~Dev() { cudaFree(p); }
};

// y of the case on the device (weights and rows uploaded, product, copied back).
std::vector<float> device_product(const KernelProblem& p, const std::vector<uint8_t>& xq, int64_t n_rows) {
  Dev w(p.w.size()), x(xq.size()), y(size_t(n_rows * p.rows) * sizeof(float));
  std::vector<uint8_t> prepared(xq.size());
  prepare_activations(p.type, xq.data(), n_rows, p.cols, prepared.data());
  EXPECT_EQ(cudaMemcpy(w.p, p.w.data(), p.w.size(), cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(x.p, prepared.data(), prepared.size(), cudaMemcpyHostToDevice), cudaSuccess);
  const WeightMatrix hw = p.weights();
  const CudaMatrix dw{.type = p.type, .cols = p.cols, .rows = p.rows, .data = static_cast<const uint8_t*>(w.p),
                      .row_stride = hw.row_stride};
  const Status s = cuda_matmul_preq(dw, static_cast<const uint8_t*>(x.p), n_rows, static_cast<float*>(y.p), nullptr);
  EXPECT_TRUE(s.is_ok()) << s.message();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> out(size_t(n_rows * p.rows));
  EXPECT_EQ(cudaMemcpy(out.data(), y.p, out.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  return out;
}

void expect_case(const KernelCase& c, uint64_t seed) {
  const KernelProblem p = kernel_problem_build(c, seed);
  std::vector<uint8_t> xq(size_t(c.n_rows) * activation_row_bytes(c.type, c.cols));
  quantize_activations(c.type, p.x.data(), c.n_rows, c.cols, xq.data());
  std::vector<float> want(size_t(c.n_rows * c.rows));
  matmul_preq(p.weights(), xq.data(), c.n_rows, want.data(), nullptr);
  const std::vector<float> got = device_product(p, xq, c.n_rows);
  ASSERT_EQ(got.size(), want.size());
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want[i]) && ++bad <= 3)
      ADD_FAILURE() << c.name << " element " << i << ": GPU " << got[i] << ", CPU " << want[i];
  EXPECT_EQ(bad, 0u) << c.name;
}

TEST(GpuMatmulTest, EveryKernelCaseMatchesTheScalarReference) {
  ESSAIM_SKIP_WITHOUT_GPU();
  const Isa before = kernels_isa();
  ASSERT_TRUE(set_kernel_isa(Isa::SCALAR).is_ok());
  for (const KernelCase& c : kernel_cases_correctness())
    if (cuda_matmul_type_supported(c.type)) expect_case(c, 3);
  ASSERT_TRUE(set_kernel_isa(before).is_ok());
}

// The CPU side runs its fastest ISA here: the kernel tests prove it equal to the scalar reference.
TEST(GpuMatmulTest, ExpertShapesMatchTheCpu) {
  ESSAIM_SKIP_WITHOUT_GPU();
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0})
    for (auto [cols, rows] : {std::pair<int64_t, int64_t>{3072, 1024}, {1024, 3072}})
      for (int64_t n : {1, 8, 64, 67})
        expect_case({.name = std::string(type_name(t)) + " " + std::to_string(cols) + "x" + std::to_string(rows) +
                             " n=" + std::to_string(n),
                     .type = t, .cols = cols, .rows = rows, .n_rows = n, .fill = WeightFill::RANDOM_BITS},
                    9);
}

TEST(GpuMatmulTest, ARowAloneEqualsTheRowInABatch) {
  ESSAIM_SKIP_WITHOUT_GPU();
  const KernelCase c{.name = "q4_k batch", .type = GgmlType::Q4_K, .cols = 3072, .rows = 256, .n_rows = 70};
  const KernelProblem p = kernel_problem_build(c, 21);
  const uint64_t xs = activation_row_bytes(c.type, c.cols);
  std::vector<uint8_t> xq(size_t(c.n_rows) * xs);
  quantize_activations(c.type, p.x.data(), c.n_rows, c.cols, xq.data());
  const std::vector<float> batch = device_product(p, xq, c.n_rows);
  for (int64_t t : {int64_t(0), int64_t(33), c.n_rows - 1}) {
    const std::vector<uint8_t> one(xq.begin() + t * xs, xq.begin() + (t + 1) * xs);
    const std::vector<float> alone = device_product(p, one, 1);
    for (int64_t r = 0; r < c.rows; ++r)
      ASSERT_EQ(std::bit_cast<uint32_t>(alone[size_t(r)]), std::bit_cast<uint32_t>(batch[size_t(t * c.rows + r)]));
  }
}

// The grouped launch (all experts of a request at once): three experts of one [3072 -> 256] Q4_K tensor,
// 1, 6 and 9 rows each (partial tiles), against matmul_preq on each expert's rows.
TEST(GpuMatmulTest, GroupedLaunchEqualsEachExpertAlone) {
  ESSAIM_SKIP_WITHOUT_GPU();
  const int64_t cols = 3072, rows = 256, X = 3;
  const KernelCase c{.name = "q4_k experts", .type = GgmlType::Q4_K, .cols = cols, .rows = rows * X, .n_rows = 16};
  const KernelProblem p = kernel_problem_build(c, 31);  // rows * X weight rows = X experts back to back
  const uint64_t xs = activation_row_bytes(c.type, cols), rs = p.weights().row_stride;
  std::vector<uint8_t> xq(size_t(c.n_rows) * xs), xp(xq.size());
  quantize_activations(c.type, p.x.data(), c.n_rows, cols, xq.data());
  prepare_activations(c.type, xq.data(), c.n_rows, cols, xp.data());
  const int64_t counts[X] = {1, 6, 9};
  std::vector<ExpertTile> tiles;
  int64_t row = 0;
  for (int32_t e = 0; e < X; ++e)
    for (int64_t t = 0; t < counts[e]; t += 4) {
      const auto nx = int32_t(std::min<int64_t>(4, counts[e] - t));
      tiles.push_back({.row = row, .expert = e, .nx = nx});
      row += nx;
    }
  ASSERT_EQ(row, c.n_rows);
  Dev w(p.w.size()), x(xp.size()), y(size_t(c.n_rows * rows) * sizeof(float)), td(tiles.size() * sizeof(ExpertTile));
  ASSERT_EQ(cudaMemcpy(w.p, p.w.data(), p.w.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(x.p, xp.data(), xp.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(td.p, tiles.data(), tiles.size() * sizeof(ExpertTile), cudaMemcpyHostToDevice), cudaSuccess);
  const CudaMatrix dw{.type = c.type, .cols = cols, .rows = rows, .data = static_cast<const uint8_t*>(w.p), .row_stride = rs};
  ASSERT_TRUE(cuda_matmul_experts(dw, rs * uint64_t(rows), static_cast<const ExpertTile*>(td.p), int64_t(tiles.size()),
                                  static_cast<const uint8_t*>(x.p), static_cast<float*>(y.p), nullptr).is_ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> got(size_t(c.n_rows * rows));
  ASSERT_EQ(cudaMemcpy(got.data(), y.p, got.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  int64_t first = 0;
  for (int32_t e = 0; e < X; ++e) {
    const WeightMatrix we{.type = c.type, .cols = cols, .rows = rows, .data = p.w.data() + uint64_t(e) * rs * rows, .row_stride = rs};
    std::vector<float> want(size_t(counts[e] * rows));
    matmul_preq(we, xq.data() + first * xs, counts[e], want.data(), nullptr);
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(got[size_t(first * rows) + i]), std::bit_cast<uint32_t>(want[i])) << "expert " << e << " element " << i;
    first += counts[e];
  }
}

}  // namespace
}  // namespace essaim::gpu
