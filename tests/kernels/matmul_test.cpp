// Matrix products: a row's result never depends on the batch it came in, the thread count, or the
// instruction set (docs/invariants.md invariant 2) — checked bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <set>
#include <vector>

#include "core/fp16.h"
#include "kernels/kernel_cases.h"
#include "kernels/kernel_traits.h"
#include "kernels/matmul.h"

namespace essaim {
namespace {

// Restores the process-wide kernel choice when a test changes it.
class IsaGuard {
 public:
  IsaGuard() : saved_(kernels_isa()) {}
  ~IsaGuard() { (void)set_kernel_isa(saved_); }

 private:
  Isa saved_;
};

std::vector<float> run(const KernelProblem& p, const float* x, int64_t n_rows, ThreadPool* pool) {
  std::vector<float> y(size_t(n_rows * p.rows), -1.0f);
  matmul(p.weights(), x, n_rows, y.data(), pool);
  return y;
}

bool same_bits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

// Shapes where the weight rows span several cache tiles of uneven size.
std::vector<KernelCase> invariance_cases() {
  std::vector<KernelCase> out;
  const std::pair<GgmlType, int64_t> shapes[] = {{GgmlType::Q4_K, 512}, {GgmlType::Q5_K, 768},
                                                 {GgmlType::Q6_K, 768}, {GgmlType::Q8_0, 96},
                                                 {GgmlType::F16, 72},   {GgmlType::BF16, 40},
                                                 {GgmlType::F32, 33}};
  for (auto [type, cols] : shapes)
    out.push_back(KernelCase{.name = std::string(type_name(type)), .type = type, .cols = cols, .rows = 1100,
                             .n_rows = 512});
  return out;
}

TEST(Matmul, RowOfABatchEqualsTheRowAlone) {
  for (const KernelCase& c : invariance_cases()) {
    SCOPED_TRACE(c.name);
    const KernelProblem p = kernel_problem_build(c, 2024);
    const std::vector<float> full = run(p, p.x.data(), c.n_rows, nullptr);
    std::set<uint32_t> distinct(reinterpret_cast<const uint32_t*>(full.data()),
                                reinterpret_cast<const uint32_t*>(full.data()) + full.size());
    EXPECT_GT(distinct.size(), full.size() / 2) << "inputs must vary";
    // Every row alone, and sub-batches of every length 2..7 at odd offsets (every grouping of a row into
    // kernel calls).
    for (int64_t t = 0; t < c.n_rows; ++t) {
      const std::vector<float> one = run(p, p.x.data() + t * c.cols, 1, nullptr);
      ASSERT_TRUE(same_bits(one.data(), full.data() + t * c.rows, size_t(c.rows))) << "row " << t;
    }
    for (int64_t len = 2; len <= 7; ++len) {
      const int64_t t0 = 3 * len + 1;
      const std::vector<float> part = run(p, p.x.data() + t0 * c.cols, len, nullptr);
      ASSERT_TRUE(same_bits(part.data(), full.data() + t0 * c.rows, size_t(len * c.rows))) << "len " << len;
    }
  }
}

TEST(Matmul, ThreadCountDoesNotChangeBits) {
  ThreadPool one(1), two(2), three(3);
  for (const KernelCase& c : invariance_cases()) {
    SCOPED_TRACE(c.name);
    const KernelProblem p = kernel_problem_build(c, 77);
    const std::vector<float> base = run(p, p.x.data(), 37, nullptr);
    for (ThreadPool* pool : {&one, &two, &three}) {
      const std::vector<float> y = run(p, p.x.data(), 37, pool);
      ASSERT_TRUE(same_bits(y.data(), base.data(), y.size())) << pool->size() << " threads";
    }
    const std::vector<float> decode = run(p, p.x.data() + 5 * c.cols, 1, &three);
    ASSERT_TRUE(same_bits(decode.data(), base.data() + 5 * c.rows, size_t(c.rows)));
  }
}

TEST(Matmul, InstructionSetDoesNotChangeBits) {
  IsaGuard guard;
  ThreadPool pool(2);
  for (KernelCase c : invariance_cases()) {
    SCOPED_TRACE(c.name);
    c.rows = 150;  // the scalar reference is slow; a few tiles are enough here
    const KernelProblem p = kernel_problem_build(c, 31);
    ASSERT_TRUE(set_kernel_isa(Isa::SCALAR).is_ok());
    const std::vector<float> ref = run(p, p.x.data(), 9, &pool);
    for (int i = 1; i < int(Isa::COUNT); ++i) {
      const Isa isa = Isa(i);
      if (!isa_supported(isa)) continue;
      ASSERT_TRUE(set_kernel_isa(isa).is_ok());
      const std::vector<float> y = run(p, p.x.data(), 9, &pool);
      ASSERT_TRUE(same_bits(y.data(), ref.data(), y.size())) << isa_name(isa);
    }
  }
}

TEST(Matmul, PrequantisedPathEqualsConvenienceCall) {
  for (const KernelCase& c : invariance_cases()) {
    const KernelProblem p = kernel_problem_build(c, 8);
    const int64_t n = 6;
    std::vector<uint8_t> xq(activation_row_bytes(c.type, c.cols) * n);
    quantize_activations(c.type, p.x.data(), n, c.cols, xq.data());
    std::vector<float> y(size_t(n * c.rows));
    matmul_preq(p.weights(), xq.data(), n, y.data(), nullptr);
    const std::vector<float> z = run(p, p.x.data(), n, nullptr);
    ASSERT_TRUE(same_bits(y.data(), z.data(), y.size())) << c.name;
  }
}

// Several matrices of different types and sizes over one input, as one task set, give the bits of one
// matmul per matrix, whatever the thread count and batch (the byte split lands rows on any thread).
TEST(Matmul, SetOfProductsEqualsSeparateProducts) {
  const int64_t cols = 512;
  const std::pair<GgmlType, int64_t> shapes[] = {
      {GgmlType::Q4_K, 300}, {GgmlType::Q6_K, 7}, {GgmlType::Q8_0, 1100}, {GgmlType::F32, 1}, {GgmlType::Q5_K, 64}};
  std::vector<KernelProblem> problems;
  for (auto [type, rows] : shapes)
    problems.push_back(kernel_problem_build(
        KernelCase{.name = std::string(type_name(type)), .type = type, .cols = cols, .rows = rows, .n_rows = 37},
        int(rows) + 5));
  const float* x = problems[0].x.data();  // one input for all
  ThreadPool two(2), three(3);
  for (int64_t n_rows : {1, 5, 37}) {
    std::vector<std::vector<float>> expected;
    for (const KernelProblem& p : problems) expected.push_back(run(p, x, n_rows, nullptr));
    for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &two, &three}) {
      std::vector<WeightMatrix> ws;
      for (const KernelProblem& p : problems) ws.push_back(p.weights());
      std::vector<std::vector<float>> ys;
      std::vector<MatmulOut> outs;
      for (const WeightMatrix& w : ws) ys.emplace_back(size_t(n_rows * w.rows), -1.0f);
      for (size_t j = 0; j < ws.size(); ++j) outs.push_back({&ws[j], ys[j].data()});
      matmul_set(outs, x, n_rows, pool);
      for (size_t j = 0; j < ws.size(); ++j)
        ASSERT_TRUE(same_bits(ys[j].data(), expected[j].data(), ys[j].size()))
            << type_name(ws[j].type) << " n_rows " << n_rows << " threads " << (pool ? pool->size() : 1);
    }
  }
}

TEST(Matmul, EmptyShapesAreNoOps) {
  const KernelProblem p = kernel_problem_build(
      KernelCase{.name = "q4_k", .type = GgmlType::Q4_K, .cols = 256, .rows = 3, .n_rows = 1}, 1);
  std::vector<float> y(3, 5.0f);
  matmul(p.weights(), p.x.data(), 0, y.data(), nullptr);
  EXPECT_EQ(y[0], 5.0f);
}

}  // namespace
}  // namespace essaim
