// Dot kernels: every instruction-set variant equals the scalar reference bit for bit, for every row count
// a call may take, and the reference agrees with the dequantised operands to f32 accuracy.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "core/fp16.h"
#include "kernels/blocks.h"
#include "kernels/dot_kernels.h"
#include "kernels/kernel_cases.h"
#include "kernels/kernel_traits.h"
#include "kernels/matmul.h"
#include "kernels/quantize.h"

namespace essaim {
namespace {

struct Prepared {
  KernelProblem p;
  const KernelTraits* k;
  const KernelTraits* act;
  std::vector<uint8_t> xq;
  uint64_t w_row = 0, x_row = 0;
  const uint8_t* w(int64_t r) const { return p.w.data() + uint64_t(r) * w_row; }
  const uint8_t* x(int64_t t) const { return xq.data() + uint64_t(t) * x_row; }
};

Prepared prepare(const KernelCase& c, uint64_t seed) {
  Prepared s{.p = kernel_problem_build(c, seed), .k = kernel_traits(c.type), .act = nullptr, .xq = {}};
  s.act = kernel_traits(s.k->vec_dot_type);
  s.w_row = s.k->row_bytes(c.cols);
  s.x_row = s.act->row_bytes(c.cols);
  s.xq.resize(s.x_row * uint64_t(c.n_rows));
  quantize_activations(c.type, s.p.x.data(), c.n_rows, c.cols, s.xq.data());
  return s;
}

// Every SIMD set this CPU runs (x86: AVX2, AVX-512; AArch64: NEON, NEON + dotprod).
std::vector<Isa> simd_isas() {
  std::vector<Isa> out;
  for (int i = 1; i < int(Isa::COUNT); ++i)
    if (isa_supported(Isa(i))) out.push_back(Isa(i));
  return out;
}

uint32_t bits(float f) { return f32_bits(f); }

void check_every_variant_against_the_scalar_reference(const std::vector<Isa>& isas) {
  for (const KernelCase& c : kernel_cases_correctness()) {
    SCOPED_TRACE(c.name);
    const Prepared s = prepare(c, 1234);
    const VecDotFn ref = s.k->vec_dot[size_t(Isa::SCALAR)];
    std::set<uint32_t> distinct;
    // Each variant reads the activation layout its prepare function makes (a copy for most).
    std::vector<std::vector<uint8_t>> prepared(static_cast<size_t>(Isa::COUNT));
    for (Isa isa : isas) {
      prepared[size_t(isa)].resize(s.xq.size());
      prepare_activations(*s.k, isa, s.xq.data(), c.n_rows, c.cols, prepared[size_t(isa)].data());
    }
    for (int64_t r = 0; r < c.rows; ++r) {
      std::vector<float> want(size_t(c.n_rows));
      for (int64_t t = 0; t < c.n_rows; ++t) ref(c.cols, s.w(r), s.x(t), s.x_row, 1, &want[size_t(t)]);
      for (float v : want) distinct.insert(bits(v));
      for (Isa isa : isas) {
        // The kernel this ISA runs: its own, or the next narrower one (dotprod reuses NEON where SDOT
        // would not help), exactly as matmul picks it.
        const VecDotFn fn = s.k->dot(isa);
        ASSERT_NE(fn, nullptr) << isa_name(isa);
        ASSERT_NE(fn, ref) << isa_name(isa) << " must have a SIMD kernel of its family";
        const std::vector<uint8_t>& xp = prepared[size_t(isa)];
        // Every row count a call can take, starting at every row, so each output is computed in every
        // position of a multi-row call.
        for (int nx = 1; nx <= kDotMaxRows; ++nx) {
          for (int64_t t0 = 0; t0 + nx <= c.n_rows; ++t0) {
            float got[kDotMaxRows];
            fn(c.cols, s.w(r), xp.data() + uint64_t(t0) * s.x_row, s.x_row, nx, got);
            for (int j = 0; j < nx; ++j)
              ASSERT_EQ(bits(got[j]), bits(want[size_t(t0 + j)]))
                  << isa_name(isa) << " row " << r << " act " << t0 + j << " nx " << nx << ": " << got[j]
                  << " vs " << want[size_t(t0 + j)];
          }
        }
      }
    }
    EXPECT_GT(distinct.size(), size_t(c.rows * c.n_rows / 2)) << "inputs must vary";
  }
}

TEST(Dot, EveryVariantEqualsTheScalarReferenceBitForBit) {
  const std::vector<Isa> isas = simd_isas();
  if (isas.empty()) GTEST_SKIP() << "no SIMD variant runs on this CPU";
  check_every_variant_against_the_scalar_reference(isas);
}

// Prefetch hints only move when weight bytes arrive: every variant keeps the reference's bits with none,
// with the hints inside the row, and with them far past its end.
TEST(Dot, PrefetchDistanceDoesNotChangeBits) {
  const std::vector<Isa> isas = simd_isas();
  if (isas.empty()) GTEST_SKIP() << "no SIMD variant runs on this CPU";
  const int64_t before = weight_prefetch_bytes();
  for (int64_t ahead : {int64_t(0), int64_t(64), int64_t(1536), int64_t(65536)}) {
    set_weight_prefetch_bytes(ahead);
    ASSERT_EQ(weight_prefetch_bytes(), ahead);
    check_every_variant_against_the_scalar_reference(isas);
  }
  set_weight_prefetch_bytes(-5);
  EXPECT_EQ(weight_prefetch_bytes(), 0);
  set_weight_prefetch_bytes(int64_t(1) << 40);
  EXPECT_EQ(weight_prefetch_bytes(), 65536);
  set_weight_prefetch_bytes(before);
}

#if defined(__x86_64__)
// The AVX2 four-weight-row Q4_K/Q5_K decode kernels (dot_q4k_w4_avx2, dot_q5k_w4_avx2) straight, against
// the scalar reference row by row: random bits and quantised weights, one to twelve super-blocks, weights
// at their extremes (every nibble 15, every scale and min 63), activations with foreign bsums (the
// reference reads them as given; their pair sums overflow a 16-bit word), and prefetch distances from none
// to far past the rows. Then matmul_rows on one activation row over weight-row ranges that are not multiples of four
// (the four-row calls and the one-row rest) under AVX2 against the scalar ISA.
TEST(Dot, Avx2FourWeightRowsEqualTheReference) {
  if (!isa_supported(Isa::AVX2)) GTEST_SKIP() << "no AVX2 on this CPU";
  const int64_t before = weight_prefetch_bytes();
  const Isa isa_before = kernels_isa();
  for (GgmlType type : {GgmlType::Q4_K, GgmlType::Q5_K})
    for (WeightFill fill : {WeightFill::RANDOM_BITS, WeightFill::QUANTIZED})
      for (int64_t blocks : {1, 2, 5, 12}) {
        const KernelCase c = {.name = "w4", .type = type, .cols = blocks * kQK_K, .rows = 11, .n_rows = 2, .fill = fill};
        Prepared s = prepare(c, 91 + uint64_t(blocks));
        if (blocks == 5 && type == GgmlType::Q4_K) {  // rows 0..3 at the extremes
          auto* b = reinterpret_cast<BlockQ4K*>(s.p.w.data());
          for (int64_t i = 0; i < 4 * blocks; ++i) {
            b[i].d = 0x3c00;
            b[i].dmin = 0x3800;
            std::memset(b[i].scales, 0xFF, sizeof(b[i].scales));
            std::memset(b[i].qs, 0xFF, sizeof(b[i].qs));
          }
        }
        if (blocks == 2 || blocks == 5) {  // activation row 1 with foreign bsums (pair sums past a 16-bit word)
          auto* x1 = reinterpret_cast<BlockQ8K*>(s.xq.data() + s.x_row);
          for (int64_t k = 0; k < blocks; ++k)
            for (int g = 0; g < 16; ++g) x1[k].bsums[g] = int16_t(k % 2 == 0 ? (g % 3 == 0 ? -32768 : 32767) : 16384 - g);
        }
        std::vector<uint8_t> xp(s.xq.size());
        prepare_activations(*s.k, Isa::AVX2, s.xq.data(), c.n_rows, c.cols, xp.data());
        const auto w4 = type == GgmlType::Q4_K ? dot_q4k_w4_avx2 : dot_q5k_w4_avx2;
        for (int64_t ahead : {int64_t(0), int64_t(1536), int64_t(65536)}) {
          set_weight_prefetch_bytes(ahead);
          for (int64_t t = 0; t < c.n_rows; ++t)
            for (int64_t r0 = 0; r0 + 4 <= c.rows; r0 += 3) {
              float got[4];
              w4(c.cols, s.w(r0), s.w_row, xp.data() + uint64_t(t) * s.x_row, got);
              for (int j = 0; j < 4; ++j) {
                float want = 0;
                s.k->vec_dot[size_t(Isa::SCALAR)](c.cols, s.w(r0 + j), s.x(t), s.x_row, 1, &want);
                ASSERT_EQ(bits(got[j]), bits(want)) << type_name(type) << " blocks " << blocks << " row " << r0 + j
                                                    << " act " << t << " ahead " << ahead;
              }
            }
        }
        set_weight_prefetch_bytes(before);
        const WeightMatrix w{.type = type, .cols = c.cols, .rows = c.rows, .data = s.p.w.data(), .row_stride = s.w_row};
        for (const auto& [o_begin, o_end] : {std::pair<int64_t, int64_t>{0, 11}, {1, 10}, {2, 7}, {3, 4}}) {
          float y_avx2[11], y_ref[11];
          float* rows_avx2[1] = {y_avx2};
          float* rows_ref[1] = {y_ref};
          ASSERT_TRUE(set_kernel_isa(Isa::AVX2).is_ok());
          matmul_rows(w, xp.data(), 1, o_begin, o_end, rows_avx2);
          ASSERT_TRUE(set_kernel_isa(Isa::SCALAR).is_ok());
          matmul_rows(w, s.xq.data(), 1, o_begin, o_end, rows_ref);
          for (int64_t o = o_begin; o < o_end; ++o)
            ASSERT_EQ(bits(y_avx2[o]), bits(y_ref[o])) << type_name(type) << " blocks " << blocks << " row " << o;
        }
        ASSERT_TRUE(set_kernel_isa(isa_before).is_ok());
      }
}

// The AVX-512 Q4_K/Q5_K one-row kernel reduces up to eight super-blocks at once (dot_q45k_avx512.cpp):
// every group size 1..8, and more than one group, against the reference, on rows of random bits.
TEST(Dot, Avx512Q45kOneRowEveryBlockCount) {
  if (!isa_supported(Isa::AVX512)) GTEST_SKIP() << "no AVX-512 on this CPU";
  for (GgmlType type : {GgmlType::Q4_K, GgmlType::Q5_K}) {
    for (int64_t blocks = 1; blocks <= 18; ++blocks) {
      const KernelCase c = {.name = "one row", .type = type, .cols = blocks * kQK_K, .rows = 2, .n_rows = 2,
                            .fill = WeightFill::RANDOM_BITS};
      const Prepared s = prepare(c, 77 + uint64_t(blocks));
      std::vector<uint8_t> xp(s.xq.size());
      prepare_activations(*s.k, Isa::AVX512, s.xq.data(), c.n_rows, c.cols, xp.data());
      for (int64_t r = 0; r < c.rows; ++r)
        for (int64_t t = 0; t < c.n_rows; ++t) {
          float want = 0, got = 0;
          s.k->vec_dot[size_t(Isa::SCALAR)](c.cols, s.w(r), s.x(t), s.x_row, 1, &want);
          s.k->dot(Isa::AVX512)(c.cols, s.w(r), xp.data() + uint64_t(t) * s.x_row, s.x_row, 1, &got);
          ASSERT_EQ(bits(got), bits(want)) << type_name(type) << " blocks " << blocks << " row " << r << " act " << t;
        }
    }
  }
}

#endif

// The AVX-512 Q6_K kernel on the extreme integer sums (|A| up to 2^27: all activations -128, all weights
// at -32 or +31, all scales -128 or 127) and on activation rows whose bsums disagree with their qs (the
// reference reads only qs; the kernel's prepare recomputes the bsums it uses), for every nx.
TEST(Dot, Q6kAvx512AtTheBoundsAndWithForeignBsums) {
  if (!isa_supported(Isa::AVX512)) GTEST_SKIP() << "no AVX-512 on this CPU";
  const KernelTraits& k = *kernel_traits(GgmlType::Q6_K);
  constexpr int64_t kCols = 3 * kQK_K;
  constexpr int kRows = 9;
  std::vector<BlockQ6K> w(3 * 4);  // four weight rows of three super-blocks
  for (size_t b = 0; b < w.size(); ++b) {
    const uint8_t bits_all = (b / 3) % 2 == 0 ? 0x00 : 0xFF;  // 6-bit values 0 (q - 32 = -32) or 63 (+31)
    std::memset(w[b].ql, bits_all, sizeof(w[b].ql));
    std::memset(w[b].qh, bits_all, sizeof(w[b].qh));
    for (int s = 0; s < 16; ++s) w[b].scales[s] = int8_t(b / 6 == 0 ? -128 : (s % 2 ? 127 : -128));
    w[b].d = f32_to_f16(b % 2 ? 1.0f : 0.5f);
  }
  std::vector<BlockQ8K> x(size_t(kRows) * 3);
  uint32_t seed = 7;
  for (size_t b = 0; b < x.size(); ++b) {
    x[b].d = 1.0f + float(b) / 64.0f;
    for (int i = 0; i < kQK_K; ++i) {
      seed = seed * 1664525u + 1013904223u;
      x[b].qs[i] = int8_t(b < 6 ? -128 : int8_t(seed >> 24));  // rows 0, 1: all -128
    }
    for (int g = 0; g < 16; ++g) {
      seed = seed * 1664525u + 1013904223u;
      x[b].bsums[g] = int16_t(seed >> 16);  // not the sums of qs
    }
  }
  const auto* xb = reinterpret_cast<const uint8_t*>(x.data());
  const size_t x_row = 3 * sizeof(BlockQ8K);
  const VecDotFn ref = k.vec_dot[size_t(Isa::SCALAR)];
  for (Isa isa : {Isa::AVX512}) {
    const VecDotFn fn = k.dot(isa);
    std::vector<uint8_t> xp(x.size() * sizeof(BlockQ8K));
    prepare_activations(k, isa, xb, kRows, kCols, xp.data());
    for (int r = 0; r < 4; ++r) {
      const void* wr = w.data() + 3 * r;
      for (int nx = 1; nx <= kDotMaxRows; ++nx)
        for (int t0 = 0; t0 + nx <= kRows; ++t0) {
          float got[kDotMaxRows], want;
          fn(kCols, wr, xp.data() + size_t(t0) * x_row, x_row, nx, got);
          for (int j = 0; j < nx; ++j) {
            ref(kCols, wr, xb + size_t(t0 + j) * x_row, x_row, 1, &want);
            ASSERT_EQ(bits(got[j]), bits(want)) << isa_name(isa) << " row " << r << " act " << t0 + j << " nx " << nx;
          }
        }
    }
  }
}

// The Q6_K reference reads only an activation block's qs; a kernel may use bsums for its −32 offset only if
// its prepare function recomputes them. Rows whose bsums are garbage and whose qs include -128 (no
// quantiser writes either) must still give the reference's bits on every ISA.
TEST(Dot, Q6kIgnoresTheActivationBsumsAndTakesEveryByte) {
  const KernelCase c{.name = "q6_k 512x7 hostile activations", .type = GgmlType::Q6_K, .cols = 512, .rows = 7,
                     .n_rows = 9, .fill = WeightFill::QUANTIZED};
  Prepared s = prepare(c, 4321);
  uint32_t state = 12345;
  auto next = [&state] { return state = state * 1664525u + 1013904223u; };
  for (int64_t t = 0; t < c.n_rows; ++t)
    for (int64_t b = 0; b < c.cols / kQK_K; ++b) {
      auto* blk = reinterpret_cast<BlockQ8K*>(s.xq.data() + uint64_t(t) * s.x_row) + b;
      for (int g = 0; g < kQK_K / 16; ++g) blk->bsums[g] = int16_t(next() >> 16);
      for (int i = 0; i < kQK_K; i += 7) blk->qs[i] = (next() >> 31) != 0 ? int8_t(-128) : int8_t(next() >> 24);
    }
  const VecDotFn ref = s.k->vec_dot[size_t(Isa::SCALAR)];
  for (Isa isa : simd_isas()) {
    std::vector<uint8_t> xp(s.xq.size());
    prepare_activations(*s.k, isa, s.xq.data(), c.n_rows, c.cols, xp.data());
    for (int64_t r = 0; r < c.rows; ++r)
      for (int nx = 1; nx <= kDotMaxRows; ++nx) {
        float got[kDotMaxRows];
        s.k->dot(isa)(c.cols, s.w(r), xp.data() + s.x_row, s.x_row, nx, got);
        for (int j = 0; j < nx; ++j) {
          float want = 0;
          ref(c.cols, s.w(r), s.x(1 + j), s.x_row, 1, &want);
          ASSERT_EQ(bits(got[j]), bits(want)) << isa_name(isa) << " row " << r << " nx " << nx << " act " << 1 + j;
        }
      }
  }
}

TEST(Dot, ScalarReferenceIsIndependentOfRowsPerCall) {
  for (const KernelCase& c : kernel_cases_correctness()) {
    const Prepared s = prepare(c, 99);
    const VecDotFn ref = s.k->vec_dot[size_t(Isa::SCALAR)];
    float four[kDotMaxRows], one;
    ref(c.cols, s.w(0), s.x(2), s.x_row, 4, four);
    for (int j = 0; j < 4; ++j) {
      ref(c.cols, s.w(0), s.x(2 + j), s.x_row, 1, &one);
      ASSERT_EQ(bits(one), bits(four[j])) << c.name;
    }
  }
}

// For K-quants, the two parts of a dequantised value (d*sc*q and dmin*m) may nearly cancel; rounding error
// scales with their magnitudes, not with the difference. Returns |scale part| + |min part| per element.
std::vector<float> magnitude_per_element(GgmlType type, const uint8_t* row, int64_t cols) {
  const KernelTraits& k = *kernel_traits(type);
  std::vector<float> out(static_cast<size_t>(cols)), part(static_cast<size_t>(cols));
  dequantize_row(type, row, out.data(), cols);
  if (type != GgmlType::Q4_K && type != GgmlType::Q5_K) {
    for (float& v : out) v = std::fabs(v);
    return out;
  }
  std::vector<uint8_t> scale_only(row, row + k.row_bytes(cols)), min_only = scale_only;
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    uint8_t* sb = scale_only.data() + b * k.type_size;
    uint8_t* mb = min_only.data() + b * k.type_size;
    std::memset(sb + 2, 0, 2);                        // dmin = 0
    std::memset(mb + 16, 0, k.type_size - 16);        // all q = 0 (qh and qs)
  }
  dequantize_row(type, scale_only.data(), out.data(), cols);
  dequantize_row(type, min_only.data(), part.data(), cols);
  for (int64_t i = 0; i < cols; ++i) out[size_t(i)] = std::fabs(out[size_t(i)]) + std::fabs(part[size_t(i)]);
  return out;
}

TEST(Dot, AgreesWithTheDequantisedOperands) {
  for (const KernelCase& c : kernel_cases_correctness()) {
    SCOPED_TRACE(c.name);
    const Prepared s = prepare(c, 5);
    std::vector<float> w(size_t(c.cols)), x(size_t(c.cols));
    double worst = 0;
    for (int64_t r = 0; r < c.rows; ++r) {
      dequantize_row(c.type, s.w(r), w.data(), c.cols);
      const std::vector<float> mag = magnitude_per_element(c.type, s.w(r), c.cols);
      for (int64_t t = 0; t < c.n_rows; ++t) {
        dequantize_row(s.k->vec_dot_type, s.x(t), x.data(), c.cols);
        double exact = 0, scale = 0;
        for (int64_t i = 0; i < c.cols; ++i) {
          exact += double(w[size_t(i)]) * x[size_t(i)];
          scale += double(mag[size_t(i)]) * std::fabs(x[size_t(i)]);
        }
        float got;
        s.k->vec_dot[size_t(Isa::SCALAR)](c.cols, s.w(r), s.x(t), s.x_row, 1, &got);
        const double err = std::fabs(double(got) - exact);
        if (scale > 0) {
          worst = std::max(worst, err / scale);
        }
        ASSERT_LE(err, c.tolerance * scale + 1e-30) << "row " << r << " act " << t;
      }
    }
    RecordProperty("worst_relative_error", std::to_string(worst));
  }
}

TEST(KernelTable, IsaSelection) {
  EXPECT_EQ(isa_from_name("avx2"), Isa::AVX2);
  EXPECT_EQ(isa_from_name("neon"), Isa::NEON);
  EXPECT_EQ(isa_from_name("neon-dotprod"), Isa::NEON_DOTPROD);
  EXPECT_EQ(isa_from_name("mmx"), std::nullopt);
  for (int i = 0; i < int(Isa::COUNT); ++i) EXPECT_EQ(isa_from_name(isa_name(Isa(i))), Isa(i));
#if defined(__aarch64__)
  EXPECT_TRUE(isa_supported(Isa::NEON));
  EXPECT_FALSE(isa_supported(Isa::AVX2));
#elif defined(__x86_64__)
  EXPECT_FALSE(isa_supported(Isa::NEON));
  EXPECT_FALSE(isa_supported(Isa::NEON_DOTPROD));
#endif
  EXPECT_TRUE(isa_supported(Isa::SCALAR));
  const Isa before = kernels_isa();
  ASSERT_TRUE(set_kernel_isa(Isa::SCALAR).is_ok());
  EXPECT_EQ(kernels_isa(), Isa::SCALAR);
  ASSERT_TRUE(set_kernel_isa(before).is_ok());
  if (!isa_supported(Isa::AVX512)) {
    EXPECT_FALSE(set_kernel_isa(Isa::AVX512).is_ok());
  }
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K,
                     GgmlType::Q6_K}) {
    const KernelTraits* k = kernel_traits(t);
    ASSERT_NE(k, nullptr);
    EXPECT_EQ(k->block_size, type_traits(t).block_size);
    EXPECT_EQ(k->type_size, type_traits(t).type_size);
    EXPECT_EQ(k->vec_dot_type, type_traits(t).vec_dot_type);
    EXPECT_NE(k->dot(best_isa()), nullptr);
  }
  EXPECT_EQ(kernel_traits(GgmlType::Q2_K), nullptr);
  EXPECT_TRUE(matmul_type_supported(GgmlType::Q6_K));
  EXPECT_FALSE(matmul_type_supported(GgmlType::Q8_K));
  EXPECT_FALSE(matmul_type_supported(GgmlType::Q2_K));
  EXPECT_TRUE(kernel_type_supported(GgmlType::Q8_K));
  EXPECT_EQ(kernel_traits(GgmlType::Q8_K)->dot(Isa::SCALAR), nullptr);
}

// ESSAIM_ISA picks the initial variant. The choice is made once per process, so the check runs in a child:
// this binary again, with the variable set, running only EnvChild.
TEST(KernelTable, EnvChild) {
  const char* want = std::getenv("ESSAIM_ISA_EXPECT");
  if (want == nullptr) GTEST_SKIP() << "runs as a child of EnvironmentChoosesTheInitialIsa";
  EXPECT_EQ(isa_name(kernels_isa()), want);
}

TEST(KernelTable, PrefetchEnvChild) {
  const char* want = std::getenv("ESSAIM_PREFETCH_EXPECT");
  if (want == nullptr) GTEST_SKIP() << "runs as a child of EnvironmentSetsThePrefetchDistance";
  if (const char* to = std::getenv("ESSAIM_PREFETCH_SWITCH_TO")) {  // the kernels change after start-up
    const std::optional<Isa> isa = isa_from_name(to);
    ASSERT_TRUE(isa.has_value()) << to;
    ASSERT_TRUE(set_kernel_isa(*isa)) << to;
  }
  EXPECT_EQ(std::to_string(weight_prefetch_bytes()), want);
}

TEST(KernelTable, EnvironmentSetsThePrefetchDistance) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const char* emulator = std::getenv("ESSAIM_TEST_EMULATOR");
  const std::string prefix = emulator != nullptr && *emulator != '\0' ? std::string(emulator) + " " : "";
  auto run_child = [&](const std::string& env) {
    const std::string cmd =
        "env -u ESSAIM_PREFETCH_BYTES " + env + " " + prefix + "'" + self + "' --gtest_filter=KernelTable.PrefetchEnvChild > /dev/null 2>&1";
    return std::system(cmd.c_str());
  };
  EXPECT_EQ(run_child("ESSAIM_PREFETCH_BYTES=4096 ESSAIM_PREFETCH_EXPECT=4096"), 0);
  EXPECT_NE(run_child("ESSAIM_PREFETCH_BYTES=4096 ESSAIM_PREFETCH_EXPECT=4095"), 0) << "the child must be able to fail";
  EXPECT_EQ(run_child("ESSAIM_PREFETCH_BYTES=0 ESSAIM_PREFETCH_EXPECT=0"), 0);
  EXPECT_EQ(run_child("ESSAIM_PREFETCH_BYTES=999999 ESSAIM_PREFETCH_EXPECT=65536"), 0);
  // Unset, the AVX2 kernels are hinted on every x86 CPU (they were tuned with hints; an AMD CPU with AVX-512
  // leaves its AVX-512 kernels unhinted).
  if (isa_supported(Isa::AVX2)) {
    EXPECT_EQ(run_child("ESSAIM_ISA=avx2 ESSAIM_PREFETCH_EXPECT=1536"), 0);
    EXPECT_EQ(run_child("ESSAIM_ISA=avx2 ESSAIM_PREFETCH_BYTES=0 ESSAIM_PREFETCH_EXPECT=0"), 0);
    EXPECT_EQ(run_child("ESSAIM_ISA=scalar ESSAIM_PREFETCH_SWITCH_TO=avx2 ESSAIM_PREFETCH_EXPECT=1536"), 0);
    EXPECT_EQ(run_child("ESSAIM_ISA=scalar ESSAIM_PREFETCH_BYTES=64 ESSAIM_PREFETCH_SWITCH_TO=avx2 "
                        "ESSAIM_PREFETCH_EXPECT=64"), 0);
  }
  // Not a number: the CPU's default, the value a child without the variable has.
  const std::string fallback = std::to_string(weight_prefetch_bytes());
  if (std::getenv("ESSAIM_PREFETCH_BYTES") == nullptr) {
    EXPECT_EQ(run_child("ESSAIM_PREFETCH_BYTES=lots ESSAIM_PREFETCH_EXPECT=" + fallback), 0);
  }
}

TEST(KernelTable, EnvironmentChoosesTheInitialIsa) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  // Under user-mode emulation (the ARM64 build run by qemu-aarch64) the child needs the emulator too.
  const char* emulator = std::getenv("ESSAIM_TEST_EMULATOR");
  const std::string prefix = emulator != nullptr && *emulator != '\0' ? std::string(emulator) + " " : "";
  auto run_child = [&](const std::string& env) {
    const std::string cmd = env + " " + prefix + "'" + self + "' --gtest_filter=KernelTable.EnvChild > /dev/null 2>&1";
    return std::system(cmd.c_str());
  };
  EXPECT_EQ(run_child("ESSAIM_ISA=scalar ESSAIM_ISA_EXPECT=scalar"), 0);
  EXPECT_NE(run_child("ESSAIM_ISA=scalar ESSAIM_ISA_EXPECT=avx2"), 0) << "the child must be able to fail";
  // Unknown or unsupported names fall back to the best supported set.
  const std::string best(isa_name(best_isa()));
  EXPECT_EQ(run_child("ESSAIM_ISA=mmx ESSAIM_ISA_EXPECT=" + best), 0);
  const std::string foreign = isa_supported(Isa::NEON) ? "avx2" : "neon";
  EXPECT_EQ(run_child("ESSAIM_ISA=" + foreign + " ESSAIM_ISA_EXPECT=" + best), 0);
  for (Isa isa : {Isa::AVX2, Isa::NEON})
    if (isa_supported(isa)) {
      const std::string name(isa_name(isa));
      EXPECT_EQ(run_child("ESSAIM_ISA=" + name + " ESSAIM_ISA_EXPECT=" + name), 0);
    }
}

}  // namespace
}  // namespace essaim
