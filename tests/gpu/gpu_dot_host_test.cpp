// The CUDA kernels' dot products (src/gpu/dot_device.h), compiled here as plain C++ for the host, against
// the scalar reference (src/kernels/dot_scalar.cpp): bit-identical on every kernel case, both weight fills,
// one to several blocks, and the 122B expert shapes. This runs on every machine, GPU or not; what it cannot
// check is the device's own arithmetic (__fmaf_rn, __fmul_rn, __fadd_rn, __half2float), which are IEEE
// single-rounding operations by specification, and gpu_matmul_test checks on a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "gpu/dot_device.h"
#include "gpu/dot_device_tiles.h"
#include "gpu/upload_plan.h"
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

// The tile kernels (several activation rows per weight row, dp4a on lanes4 rows for Q4_K / Q5_K, dp4a for
// Q8_0) against the reference: every tile size 1..kTileRows at every starting row, every case.
using TileFn = void (*)(int64_t, const void*, const void*, uint64_t, int, float*);

TileFn tile_of(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_K: return gpu::dot_q45k_tile<BlockQ4K>;
    case GgmlType::Q5_K: return gpu::dot_q45k_tile<BlockQ5K>;
    case GgmlType::Q6_K: return gpu::dot_q6k_tile;
    case GgmlType::Q8_0: return gpu::dot_q8_0_tile;
    default: return nullptr;
  }
}

void expect_tiles_equal(const KernelCase& c, uint64_t seed) {
  const KernelProblem p = kernel_problem_build(c, seed);
  const TileFn tile = tile_of(c.type);
  const VecDotFn reference = kernels_of(c.type).reference;
  const uint64_t xs = activation_row_bytes(c.type, c.cols);
  std::vector<uint8_t> xq(size_t(c.n_rows) * xs), xp(xq.size());
  quantize_activations(c.type, p.x.data(), c.n_rows, c.cols, xq.data());
  const bool lanes4 = c.type == GgmlType::Q4_K || c.type == GgmlType::Q5_K;
  for (int64_t t = 0; t < c.n_rows; ++t) {
    if (lanes4) gpu::prepare_q8k_lanes4(xq.data() + t * xs, xp.data() + t * xs, c.cols);
    else std::memcpy(xp.data() + t * xs, xq.data() + t * xs, xs);
  }
  if (lanes4 && c.n_rows > 0) {
    EXPECT_NE(std::memcmp(xp.data(), xq.data(), xs), 0) << c.name << ": lanes4 moved nothing";
  }
  const WeightMatrix w = p.weights();
  int mismatches = 0;
  for (int nx = 1; nx <= gpu::kTileRows; ++nx)
    for (int64_t t0 = 0; t0 + nx <= c.n_rows; ++t0)
      for (int64_t r = 0; r < c.rows; ++r) {
        const uint8_t* wr = w.data + uint64_t(r) * w.row_stride;
        float got[gpu::kTileRows];
        tile(c.cols, wr, xp.data() + t0 * xs, xs, nx, got);
        for (int j = 0; j < nx; ++j) {
          float want = 0;
          reference(c.cols, wr, xq.data() + (t0 + j) * xs, xs, 1, &want);
          if (std::bit_cast<uint32_t>(got[j]) != std::bit_cast<uint32_t>(want) && ++mismatches <= 3)
            ADD_FAILURE() << c.name << " nx " << nx << " row " << t0 + j << " output " << r << ": tile " << got[j]
                          << ", reference " << want;
        }
      }
  EXPECT_EQ(mismatches, 0) << c.name;
}

TEST(GpuDotHostTest, TileKernelsMatchTheScalarReference) {
  int covered = 0;
  for (KernelCase c : kernel_cases_correctness()) {
    if (tile_of(c.type) == nullptr) continue;
    c.n_rows = std::max<int64_t>(c.n_rows, 5);  // room for every tile size and several starting rows
    expect_tiles_equal(c, 13);
    ++covered;
  }
  EXPECT_GE(covered, 8);
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0})
    for (WeightFill fill : {WeightFill::QUANTIZED, WeightFill::RANDOM_BITS})
      expect_tiles_equal({.name = std::string(type_name(t)) + " 3072x16 tiles", .type = t, .cols = 3072, .rows = 16,
                          .n_rows = 6, .fill = fill}, 17);
}

// prepare_q8k_lanes4 is a permutation of each sub-block's bytes: byte 4l + c is element 8c + l.
TEST(GpuDotHostTest, Lanes4PlacesElementEightCPlusLAtByteFourLPlusC) {
  BlockQ8K in{}, out{};
  in.d = 0.5f;
  for (int i = 0; i < kQK_K; ++i) in.qs[i] = int8_t(i % 32 + 32 * ((i / 32) % 3));
  for (int g = 0; g < 16; ++g) in.bsums[g] = int16_t(g * 3 - 7);
  gpu::prepare_q8k_lanes4(&in, &out, kQK_K);
  EXPECT_EQ(out.d, in.d);
  for (int g = 0; g < 16; ++g) EXPECT_EQ(out.bsums[g], in.bsums[g]);
  for (int s = 0; s < 8; ++s)
    for (int l = 0; l < 8; ++l)
      for (int c = 0; c < 4; ++c) EXPECT_EQ(out.qs[32 * s + 4 * l + c], in.qs[32 * s + 8 * c + l]);
  // The register transpose puts the same bytes in the same places for weight words.
  uint32_t v[8], lanes[8];
  for (int wd = 0; wd < 8; ++wd) v[wd] = uint32_t(4 * wd) | uint32_t(4 * wd + 1) << 8 | uint32_t(4 * wd + 2) << 16 | uint32_t(4 * wd + 3) << 24;
  gpu::to_lanes4(v, lanes);
  for (int l = 0; l < 8; ++l)
    for (int c = 0; c < 4; ++c) EXPECT_EQ((lanes[l] >> (8 * c)) & 0xFF, uint32_t(8 * c + l)) << "lane " << l << " byte " << c;
}

// What the executor uploads: separate tensors stay three spans; the two halves of a fused gate_up tensor
// become one span covering the whole tensor, each view at its own offset; nothing is read past a tensor.
TEST(GpuDotHostTest, UploadPlanMergesFusedGateUpAndPlacesEveryView) {
  std::vector<uint8_t> gate_up(2 * 4 * 3 * 144), gate(4 * 3 * 144), up(4 * 3 * 144), down(4 * 3 * 210 + 16);
  const int64_t cols = 256, F = 3;  // 4 experts of [256 -> 3] Q4_K, down [3*... ] stand-in of 3 rows of Q6_K
  const ExpertLayer::Tensor3d dn{GgmlType::Q6_K, 256, 3, 4, down.data() + 16};
  const ExpertLayer fused = ExpertLayer::fused({GgmlType::Q4_K, cols, 2 * F, 4, gate_up.data()}, dn);
  const gpu::UploadPlan pf = gpu::upload_plan(fused);
  ASSERT_EQ(pf.spans.size(), 2u);
  const size_t gu = pf.spans[0].begin == gate_up.data() ? 0 : 1;
  EXPECT_EQ(pf.spans[gu].begin, gate_up.data());
  EXPECT_EQ(pf.spans[gu].size(), gate_up.size());  // exactly the tensor: the gate half stops F rows short
  EXPECT_EQ(pf.gate.span, gu);
  EXPECT_EQ(pf.gate.offset, 0u);
  EXPECT_EQ(pf.up.span, gu);
  EXPECT_EQ(pf.up.offset, uint64_t(F) * 144);
  EXPECT_EQ(pf.spans[pf.down.span].begin, down.data() + 16);
  EXPECT_EQ(pf.spans[pf.down.span].size(), down.size() - 16);
  EXPECT_EQ(pf.down.offset, 0u);

  const ExpertLayer sep = ExpertLayer::separate({GgmlType::Q4_K, cols, F, 4, gate.data()},
                                                {GgmlType::Q4_K, cols, F, 4, up.data()}, dn);
  const gpu::UploadPlan ps = gpu::upload_plan(sep);
  EXPECT_EQ(ps.spans.size(), 3u);
  EXPECT_EQ(ps.spans[ps.gate.span].begin, gate.data());
  EXPECT_EQ(ps.spans[ps.gate.span].size(), gate.size());
  EXPECT_EQ(ps.spans[ps.up.span].begin, up.data());
  EXPECT_EQ(ps.gate.offset + ps.up.offset + ps.down.offset, 0u);
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
