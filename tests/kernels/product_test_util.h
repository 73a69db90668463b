// What the tests of the multi-row product paths (AMX tiles, AVX2 lanes, AVX-512 row lanes) share: a guard that restores the
// process-wide kernel choices, products through matmul_rows, activation rows at their extremes, weights
// at theirs, rows with bsums from elsewhere, and a child run of the test binary under an environment.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "kernels/blocks.h"
#include "kernels/kernel_cases.h"
#include "kernels/kernel_traits.h"
#include "kernels/matmul.h"

namespace essaim::product_test {

// Restores the kernel ISA and the AMX and lanes switches a test changes (the lanes switch itself: it serves
// the AVX2 lanes and the AVX-512 row lanes, so lanes_enabled() under one ISA does not say what it was).
class KernelChoiceGuard {
 public:
  KernelChoiceGuard() : isa_(kernels_isa()), amx_(amx_enabled()), lanes_(lanes_switch()) {}
  ~KernelChoiceGuard() {
    (void)set_kernel_isa(isa_);
    set_amx_enabled(amx_);
    set_lanes_enabled(lanes_);
    set_lane_pass_bytes(0);
  }
  KernelChoiceGuard(const KernelChoiceGuard&) = delete;
  KernelChoiceGuard& operator=(const KernelChoiceGuard&) = delete;

 private:
  Isa isa_;
  bool amx_, lanes_;
};

// n_rows prepared activation rows of w's layout under the current ISA, and the row pointers of y ([n][rows]).
inline const uint8_t* prepared(const WeightMatrix& w, const std::vector<uint8_t>& xq, int64_t n_rows,
                               std::vector<uint8_t>& scratch) {
  return prepare_rows(w.type, xq.data(), n_rows, w.cols, scratch);
}
inline std::vector<float*> row_pointers(std::vector<float>& y, int64_t n_rows, int64_t row_len) {
  std::vector<float*> rows(static_cast<size_t>(n_rows));
  for (int64_t t = 0; t < n_rows; ++t) rows[size_t(t)] = y.data() + t * row_len;
  return rows;
}

// y[t][o] for o in [o_begin, o_end) through matmul_rows under the current choices; other entries stay NaN.
inline std::vector<float> rows_product(const WeightMatrix& w, const std::vector<uint8_t>& xq, int64_t n_rows,
                                       int64_t o_begin, int64_t o_end) {
  std::vector<uint8_t> scratch;
  const uint8_t* xp = prepared(w, xq, n_rows, scratch);
  std::vector<float> y(size_t(n_rows * w.rows), std::nanf(""));
  std::vector<float*> y_rows = row_pointers(y, n_rows, w.rows);
  matmul_rows(w, xp, n_rows, o_begin, o_end, y_rows.data());
  return y;
}

inline std::vector<uint8_t> quantised(const KernelProblem& p, int64_t n_rows) {
  std::vector<uint8_t> xq(activation_row_bytes(p.type, p.cols) * uint64_t(n_rows));
  quantize_activations(p.type, p.x.data(), n_rows, p.cols, xq.data());
  return xq;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A multi-row path's entry point, with matmul_rows's contract (lanes_matmul_rows, rowlanes_matmul_rows).
using RowsFn = void (*)(const WeightMatrix& w, const uint8_t* xprep, uint64_t x_stride, int64_t n_rows,
                        int64_t o_begin, int64_t o_end, float* const* y);

// y[t][o] for o in [o_begin, o_end) straight from `path` under `isa`, activations prepared for it (so a test
// cannot compare the dot kernels with themselves should matmul_rows stop choosing the path); the other
// entries, and all of them where there is no path (null: not built for this machine), stay NaN.
inline std::vector<float> direct_product(RowsFn path, Isa isa, const WeightMatrix& w, const std::vector<uint8_t>& xq,
                                         int64_t n_rows, int64_t o_begin, int64_t o_end) {
  std::vector<float> y(size_t(n_rows * w.rows), std::nanf(""));
  if (path == nullptr) return y;
  EXPECT_TRUE(set_kernel_isa(isa).is_ok());
  std::vector<uint8_t> scratch;
  const uint8_t* xp = prepared(w, xq, n_rows, scratch);
  std::vector<float*> y_rows = row_pointers(y, n_rows, w.rows);
  path(w, xp, activation_row_bytes(w.type, w.cols), n_rows, o_begin, o_end, y_rows.data());
  return y;
}

// The path over all of w and the scalar reference: the same bits, and not all zero.
inline void expect_direct_gives_the_reference(RowsFn path, Isa isa, const WeightMatrix& w,
                                              const std::vector<uint8_t>& xq, int64_t n) {
  const std::vector<float> out = direct_product(path, isa, w, xq, n, 0, w.rows);
  ASSERT_TRUE(set_kernel_isa(Isa::SCALAR).is_ok());
  const std::vector<float> ref = rows_product(w, xq, n, 0, w.rows);
  ASSERT_TRUE(same_bits(out, ref));
  EXPECT_NE(ref[0], 0.0f);
}

// What a multi-row path gave for weight rows [o_begin, o_end) (`path`) against matmul_rows under the current
// ISA with the lanes switch on and off (the dot kernels), and where with_scalar also against the scalar
// reference: the same bits each time. Leaves the lanes switch off and, with_scalar, the ISA scalar.
inline void expect_same_as_matmul_rows(const std::vector<float>& path, const WeightMatrix& w,
                                       const std::vector<uint8_t>& xq, int64_t n, int64_t o_begin, int64_t o_end,
                                       bool with_scalar) {
  set_lanes_enabled(true);
  ASSERT_TRUE(same_bits(path, rows_product(w, xq, n, o_begin, o_end)));
  set_lanes_enabled(false);
  ASSERT_TRUE(same_bits(path, rows_product(w, xq, n, o_begin, o_end))) << "against the dot kernels";
  if (with_scalar) {
    ASSERT_TRUE(set_kernel_isa(Isa::SCALAR).is_ok());
    ASSERT_TRUE(same_bits(path, rows_product(w, xq, n, o_begin, o_end)));
  }
}

// n activation rows of cols values, every value of super-block i (in row order) -128, or 127 where
// (i / 2) % period != 0, with consistent bsums: the extremes of a quantised row.
inline std::vector<uint8_t> extreme_activations(int64_t n, int64_t cols, int period) {
  std::vector<BlockQ8K> x(size_t(n * cols / kQK_K));
  for (size_t i = 0; i < x.size(); ++i) {
    const int8_t v = (i / 2) % size_t(period) ? int8_t(127) : int8_t(-128);
    x[i].d = 1.0f / 64;
    std::memset(x[i].qs, uint8_t(v), sizeof(x[i].qs));
    for (int16_t& s : x[i].bsums) s = int16_t(16 * v);
  }
  std::vector<uint8_t> xq(x.size() * sizeof(BlockQ8K));
  std::memcpy(xq.data(), x.data(), xq.size());
  return xq;
}

// Weights at their extremes, rows x cols: Q4_K every nibble 15 and every scale and min 63 (d 1.0, dmin
// 0.5); Q6_K row by row every value 63 with every scale 127, or every value 0 (q - 32 = -32) with every
// scale -128. The bytes live as long as the object; matrix() views them.
class ExtremeWeights {
 public:
  ExtremeWeights(GgmlType type, int64_t rows, int64_t cols) : type_(type), rows_(rows), cols_(cols) {
    const size_t blocks = size_t(rows * cols / kQK_K);
    if (type == GgmlType::Q4_K) {
      std::vector<BlockQ4K> w(blocks);
      for (BlockQ4K& b : w) {
        b.d = 0x3c00;
        b.dmin = 0x3800;
        std::memset(b.scales, 0xFF, sizeof(b.scales));
        std::memset(b.qs, 0xFF, sizeof(b.qs));
      }
      keep(w);
    } else {
      std::vector<BlockQ6K> w(blocks);
      for (size_t i = 0; i < w.size(); ++i) {
        const bool high = (i / size_t(cols / kQK_K)) % 2 == 1;
        std::memset(w[i].ql, high ? 0xFF : 0x00, sizeof(w[i].ql));
        std::memset(w[i].qh, high ? 0xFF : 0x00, sizeof(w[i].qh));
        std::memset(w[i].scales, high ? 0x7F : 0x80, sizeof(w[i].scales));
        w[i].d = 0x3c00;
      }
      keep(w);
    }
  }
  WeightMatrix matrix() const {
    return WeightMatrix{.type = type_, .cols = cols_, .rows = rows_, .data = bytes_.data(),
                        .row_stride = bytes_.size() / uint64_t(rows_)};
  }

 private:
  template <typename Block>
  void keep(const std::vector<Block>& w) {
    bytes_.resize(w.size() * sizeof(Block));
    std::memcpy(bytes_.data(), w.data(), bytes_.size());
  }
  GgmlType type_;
  int64_t rows_, cols_;
  std::vector<uint8_t> bytes_;
};

// Rows from elsewhere: bsums that are not their values' sums, down to -32768, in every fifth super-block.
inline void give_foreign_bsums(std::vector<uint8_t>& xq) {
  auto* blocks = reinterpret_cast<BlockQ8K*>(xq.data());
  const int64_t n = int64_t(xq.size() / sizeof(BlockQ8K));
  for (int64_t b = 0; b < n; b += 5) blocks[b].bsums[b % 16] = int16_t(-32768 + 977 * b);
}

// The exit status of this test binary run with only `filter`, ESSAIM_ISA and `unset` removed from the
// environment and `env` (NAME=value ...) added (under $ESSAIM_TEST_EMULATOR where one is set, as for ARM64).
inline int run_self(const std::string& filter, const std::string& unset, const std::string& env) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const char* emulator = std::getenv("ESSAIM_TEST_EMULATOR");
  const std::string prefix = emulator != nullptr && *emulator != '\0' ? std::string(emulator) + " " : "";
  const std::string cmd = "env -u " + unset + " -u ESSAIM_ISA " + env + " " + prefix + "'" + self +
                          "' --gtest_filter=" + filter + " > /dev/null 2>&1";
  return std::system(cmd.c_str());
}

}  // namespace essaim::product_test
