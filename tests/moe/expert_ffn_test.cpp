// The expert FFN (the cut point) against
//   (a) a naive float implementation: dequantised weights, unquantised activations, double sums — within a
//       tolerance that the activation quantisation explains (stated below);
//   (b) the same kernels called directly, expert by expert, row by row — bit-identical, so grouping by
//       expert, gathering and scattering change nothing;
// plus batch invariance, the -1 "not requested" slot, split expert ranges, and refusal of bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <tuple>
#include <random>
#include <vector>

#include "kernels/quantize.h"
#include "moe/executor.h"
#include "moe/expert_ffn.h"
#include "moe/numerics.h"

namespace essaim {
namespace {

// X experts of [rows][cols], random N(0, 1/cols) weights quantised to `type`, with the float original kept.
struct ExpertWeights {
  GgmlType type;
  int64_t cols, rows, n_experts;
  std::vector<uint8_t> bytes;
  std::vector<float> dequant;  // [X][rows][cols] what the bytes decode to

  ExpertWeights(GgmlType t, int64_t c, int64_t r, int64_t x, std::mt19937& rng)
      : type(t), cols(c), rows(r), n_experts(x) {
    const uint64_t rb = type_traits(t).row_bytes(uint64_t(c));
    bytes.resize(size_t(rb * uint64_t(r * x)));
    dequant.resize(size_t(c * r * x));
    std::normal_distribution<float> dist(0.0f, 1.0f / std::sqrt(float(c)));
    std::vector<float> row(static_cast<size_t>(c));
    for (int64_t i = 0; i < r * x; ++i) {
      for (float& v : row) v = dist(rng);
      quantize_row(t, row.data(), bytes.data() + size_t(i) * rb, c);
      dequantize_row(t, bytes.data() + size_t(i) * rb, dequant.data() + size_t(i * c), c);
    }
  }
  ExpertLayer::Tensor3d tensor() const { return {type, cols, rows, n_experts, bytes.data()}; }
};

// Reference quantisation is slow; each (type, shape, seed) is built once per test binary.
const ExpertWeights& weights(GgmlType t, int64_t c, int64_t r, int64_t x, uint32_t seed) {
  static std::map<std::tuple<GgmlType, int64_t, int64_t, int64_t, uint32_t>, std::unique_ptr<ExpertWeights>> cache;
  std::unique_ptr<ExpertWeights>& w = cache[{t, c, r, x, seed}];
  if (!w) {
    std::mt19937 rng(seed);
    w = std::make_unique<ExpertWeights>(t, c, r, x, rng);
  }
  return *w;
}

struct Case {
  GgmlType gate_up, down;
  double float_tolerance;  // max relative L2 error of an output row vs the all-float computation
};

// The naive reference dequantises the weights and multiplies in double. Two comparisons:
// - with the activations quantised the way the kernels consume them (f and each a_k converted to the
//   weights' vec_dot format, then decoded back): only the summation order differs — and, rarely, the last-bit
//   difference in g·u moves one element of a across a rounding boundary of its format (one F16 ulp of one
//   element is ~2e-5 of a row) — so every row must agree to 1e-4 relative L2, for every type;
// - with plain float activations: the activation quantisation itself shows. Q8_K/Q8_0 steps are amax/127
//   per block, ~0.7 % relative error per element for Gaussian f and more for the heavy-tailed a = silu(g)·u;
//   measured worst rows are about 2.4 %, bounded here by 5 %. F16 activations round to 11 bits (~1e-3).
constexpr double kQuantisedActTolerance = 1e-4;
const Case kCases[] = {
    {GgmlType::F32, GgmlType::F32, 1e-5},
    {GgmlType::F16, GgmlType::F16, 5e-3},
    {GgmlType::Q8_0, GgmlType::Q8_0, 5e-2},
    {GgmlType::Q4_K, GgmlType::Q6_K, 5e-2},  // the Q4_K_M mix
    {GgmlType::Q5_K, GgmlType::Q4_K, 5e-2},
};

constexpr int64_t E = 256, F = 512, X = 6;
constexpr int32_t K = 2;

std::vector<float> random_rows(int64_t n, int64_t width, std::mt19937& rng) {
  std::normal_distribution<float> dist;
  std::vector<float> v(size_t(n * width));
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<int32_t> random_ids(int64_t n, std::mt19937& rng) {
  std::vector<int32_t> ids(size_t(n * K));
  std::uniform_int_distribution<int32_t> pick(0, X - 1);
  for (int64_t r = 0; r < n; ++r) {
    ids[size_t(r * K)] = pick(rng);
    do ids[size_t(r * K + 1)] = pick(rng);
    while (ids[size_t(r * K + 1)] == ids[size_t(r * K)]);
  }
  return ids;
}

std::vector<uint8_t> quantize_rows(const ExpertLayer& l, const std::vector<float>& f, int64_t n) {
  std::vector<uint8_t> q(size_t(n) * l.activation_row_bytes());
  quantize_activations(l.gate.type, f.data(), n, l.n_embd, q.data());
  return q;
}

class ExpertFfn : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    gate = &weights(GetParam().gate_up, E, F, X, 1);
    up = &weights(GetParam().gate_up, E, F, X, 2);
    down = &weights(GetParam().down, F, E, X, 3);
    layer = ExpertLayer::separate(gate->tensor(), up->tensor(), down->tensor());
    ASSERT_TRUE(layer.validate().is_ok()) << layer.validate().message();
  }
  const ExpertWeights* gate = nullptr;
  const ExpertWeights* up = nullptr;
  const ExpertWeights* down = nullptr;
  ExpertLayer layer;
};

// The activation format round trip: x -> w's vec_dot format -> f32.
std::vector<double> through_activation_format(GgmlType weight_type, const double* x, int64_t n) {
  std::vector<float> xf(static_cast<size_t>(n)), back(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) xf[size_t(i)] = float(x[i]);
  std::vector<uint8_t> q(activation_row_bytes(weight_type, n));
  quantize_activations(weight_type, xf.data(), 1, n, q.data());
  dequantize_row(type_traits(weight_type).vec_dot_type, q.data(), back.data(), n);
  return std::vector<double>(back.begin(), back.end());
}

// y = W_down[e] · (silu(W_gate[e] · f) ⊙ W_up[e] · f) in double over dequantised weights; with
// quantised_acts, f and a pass through the kernels' activation formats first.
std::vector<double> naive_expert(const ExpertWeights& gate, const ExpertWeights& up, const ExpertWeights& down,
                                 int32_t e, const float* f_row, bool quantised_acts) {
  std::vector<double> f(f_row, f_row + E);
  if (quantised_acts) f = through_activation_format(gate.type, f.data(), E);
  std::vector<double> a(static_cast<size_t>(F));
  for (int64_t o = 0; o < F; ++o) {
    double g = 0, u = 0;
    for (int64_t i = 0; i < E; ++i) {
      g += double(gate.dequant[size_t((e * F + o) * E + i)]) * f[size_t(i)];
      u += double(up.dequant[size_t((e * F + o) * E + i)]) * f[size_t(i)];
    }
    a[size_t(o)] = g / (1.0 + std::exp(-g)) * u;
  }
  if (quantised_acts) a = through_activation_format(down.type, a.data(), F);
  std::vector<double> y(static_cast<size_t>(E));
  for (int64_t o = 0; o < E; ++o)
    for (int64_t i = 0; i < F; ++i) y[size_t(o)] += double(down.dequant[size_t((e * E + o) * F + i)]) * a[size_t(i)];
  return y;
}

double relative_l2(const float* got, const std::vector<double>& want) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    err += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  return norm > 0 ? std::sqrt(err / norm) : INFINITY;
}

TEST_P(ExpertFfn, MatchesNaiveFloatWithinTolerance) {
  const int64_t N = 7;
  std::mt19937 rng(7);
  const std::vector<float> f = random_rows(N, E, rng);
  const std::vector<int32_t> ids = random_ids(N, rng);
  const std::vector<uint8_t> fq = quantize_rows(layer, f, N);
  std::vector<float> out(size_t(N * K * E));
  ASSERT_TRUE(expert_ffn(layer, fq.data(), N, K, ids.data(), out.data(), nullptr).is_ok());

  double worst_q = 0, worst_f = 0;
  for (int64_t r = 0; r < N; ++r) {
    for (int32_t s = 0; s < K; ++s) {
      const int32_t e = ids[size_t(r * K + s)];
      const float* got = out.data() + size_t((r * K + s) * E);
      worst_q = std::max(worst_q, relative_l2(got, naive_expert(*gate, *up, *down, e, f.data() + r * E, true)));
      worst_f = std::max(worst_f, relative_l2(got, naive_expert(*gate, *up, *down, e, f.data() + r * E, false)));
    }
  }
  EXPECT_LT(worst_q, kQuantisedActTolerance) << "with the activation formats reproduced";
  EXPECT_LT(worst_f, GetParam().float_tolerance) << "against all-float activations";
  RecordProperty("worst_relative_error_quantised_acts", std::to_string(worst_q));
  RecordProperty("worst_relative_error_float_acts", std::to_string(worst_f));
}

TEST_P(ExpertFfn, BitIdenticalToPerExpertKernelCalls) {
  const int64_t N = 9;
  std::mt19937 rng(8);
  const std::vector<float> f = random_rows(N, E, rng);
  const std::vector<int32_t> ids = random_ids(N, rng);
  const std::vector<uint8_t> fq = quantize_rows(layer, f, N);
  std::vector<float> out(size_t(N * K * E));
  ThreadPool pool(2);
  ASSERT_TRUE(expert_ffn(layer, fq.data(), N, K, ids.data(), out.data(), &pool).is_ok());

  const uint64_t act = layer.activation_row_bytes();
  for (int64_t r = 0; r < N; ++r) {
    for (int32_t s = 0; s < K; ++s) {
      const int32_t e = ids[size_t(r * K + s)];
      std::vector<float> g(static_cast<size_t>(F)), u(static_cast<size_t>(F)), y(static_cast<size_t>(E));
      matmul_preq(layer.gate.expert(e), fq.data() + size_t(r) * act, 1, g.data(), nullptr);
      matmul_preq(layer.up.expert(e), fq.data() + size_t(r) * act, 1, u.data(), nullptr);
      for (int64_t i = 0; i < F; ++i) g[size_t(i)] = silu(g[size_t(i)]) * u[size_t(i)];
      matmul(layer.down.expert(e), g.data(), 1, y.data(), nullptr);
      EXPECT_EQ(std::memcmp(y.data(), out.data() + size_t((r * K + s) * E), size_t(E) * 4), 0) << r << "," << s;
    }
  }
}

TEST_P(ExpertFfn, RowsDoNotDependOnTheirBatch) {
  const int64_t N = 6;
  std::mt19937 rng(9);
  const std::vector<float> f = random_rows(N, E, rng);
  const std::vector<int32_t> ids = random_ids(N, rng);
  const std::vector<uint8_t> fq = quantize_rows(layer, f, N);
  std::vector<float> all(size_t(N * K * E));
  ASSERT_TRUE(expert_ffn(layer, fq.data(), N, K, ids.data(), all.data(), nullptr).is_ok());
  const uint64_t act = layer.activation_row_bytes();
  for (int64_t r = 0; r < N; ++r) {
    std::vector<float> one(size_t(K * E));
    ASSERT_TRUE(expert_ffn(layer, fq.data() + size_t(r) * act, 1, K, ids.data() + r * K, one.data(), nullptr).is_ok());
    EXPECT_EQ(std::memcmp(one.data(), all.data() + size_t(r * K * E), one.size() * 4), 0) << "row " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Types, ExpertFfn, ::testing::ValuesIn(kCases), [](const auto& info) {
  return std::string(type_name(info.param.gate_up)) + "_" + std::string(type_name(info.param.down));
});

class ExpertFfnQ4 : public ExpertFfn {};
INSTANTIATE_TEST_SUITE_P(Q4KM, ExpertFfnQ4, ::testing::Values(Case{GgmlType::Q4_K, GgmlType::Q6_K, 1e-2}));

TEST_P(ExpertFfnQ4, UnrequestedSlotsAreLeftUntouched) {
  const int64_t N = 3;
  std::mt19937 rng(10);
  const std::vector<float> f = random_rows(N, E, rng);
  std::vector<int32_t> ids = random_ids(N, rng);
  const std::vector<uint8_t> fq = quantize_rows(layer, f, N);
  std::vector<float> full(size_t(N * K * E));
  ASSERT_TRUE(expert_ffn(layer, fq.data(), N, K, ids.data(), full.data(), nullptr).is_ok());
  ids[1] = -1;
  ids[4] = -1;
  std::vector<float> part(size_t(N * K * E), 12345.0f);
  ASSERT_TRUE(expert_ffn(layer, fq.data(), N, K, ids.data(), part.data(), nullptr).is_ok());
  for (int64_t pair = 0; pair < N * K; ++pair) {
    for (int64_t i = 0; i < E; ++i) {
      const float got = part[size_t(pair * E + i)];
      if (pair == 1 || pair == 4) ASSERT_EQ(got, 12345.0f);
      else ASSERT_EQ(got, full[size_t(pair * E + i)]);
    }
  }
}

TEST_P(ExpertFfnQ4, UnheldExpertIsAnErrorNamingIt) {
  std::mt19937 rng(11);
  const std::vector<float> f = random_rows(1, E, rng);
  const std::vector<uint8_t> fq = quantize_rows(layer, f, 1);
  std::vector<float> out(size_t(K * E));
  for (int32_t bad : {int32_t(X), -2, 1000}) {
    const int32_t ids[K] = {0, bad};
    Status s = expert_ffn(layer, fq.data(), 1, K, ids, out.data(), nullptr);
    ASSERT_FALSE(s.is_ok());
    EXPECT_NE(s.message().find("expert " + std::to_string(bad)), std::string::npos) << s.message();
  }
}

TEST_P(ExpertFfnQ4, SplitRangesInAStoreGiveTheSameBits) {
  // Experts 0..2 and 3..5 as two ranges (what a worker holding two slices sees) vs one range of all six.
  const uint64_t g_slab = layer.gate.expert_stride, u_slab = layer.up.expert_stride, d_slab = layer.down.expert_stride;
  ExpertLayer::Tensor3d g = gate->tensor(), u = up->tensor(), d = down->tensor();
  g.n_experts = u.n_experts = d.n_experts = 3;
  ExpertLayer low = ExpertLayer::separate(g, u, d, 0);
  g.data += 3 * g_slab;
  u.data += 3 * u_slab;
  d.data += 3 * d_slab;
  ExpertLayer high = ExpertLayer::separate(g, u, d, 3);
  ExpertStore whole, split;
  ASSERT_TRUE(whole.add(0, layer).is_ok());
  ASSERT_TRUE(split.add(0, high).is_ok());
  ASSERT_TRUE(split.add(0, low).is_ok());
  EXPECT_FALSE(split.add(0, layer).is_ok());  // overlaps
  EXPECT_EQ(split.find(0, 4), &split.ranges(0)[0]);
  EXPECT_EQ(split.find(1, 0), nullptr);

  const int64_t N = 8;
  std::mt19937 rng(12);
  const std::vector<float> f = random_rows(N, E, rng);
  const std::vector<int32_t> ids = random_ids(N, rng);
  const std::vector<uint8_t> fq = quantize_rows(layer, f, N);
  const ExpertBatch batch{.layer = 0, .n_rows = N, .k = K, .act_type = layer.activation_type(), .act = fq, .ids = ids};
  std::vector<float> a(size_t(N * K * E)), b(size_t(N * K * E));
  ThreadPool pool(2);
  LocalExpertExecutor ex_whole(whole, &pool), ex_split(split, nullptr);
  ASSERT_TRUE(ex_whole.compute(batch, a).is_ok());
  ASSERT_TRUE(ex_split.compute(batch, b).is_ok());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
}

TEST_P(ExpertFfnQ4, ExecutorRefusesInconsistentBatches) {
  ExpertStore store;
  ASSERT_TRUE(store.add(3, layer).is_ok());
  LocalExpertExecutor ex(store, nullptr);
  std::mt19937 rng(13);
  const std::vector<float> f = random_rows(2, E, rng);
  const std::vector<uint8_t> fq = quantize_rows(layer, f, 2);
  const std::vector<int32_t> ids = {0, 1, 2, 3};
  std::vector<float> out(size_t(2 * K * E));
  ExpertBatch ok{.layer = 3, .n_rows = 2, .k = K, .act_type = GgmlType::Q8_K, .act = fq, .ids = ids};
  EXPECT_TRUE(ex.compute(ok, out).is_ok());

  ExpertBatch b = ok;
  b.layer = 2;
  EXPECT_NE(ex.compute(b, out).message().find("no experts held for layer 2"), std::string::npos);
  b = ok;
  b.act_type = GgmlType::Q8_0;
  EXPECT_NE(ex.compute(b, out).message().find("activations are Q8_0"), std::string::npos);
  b = ok;
  b.act = std::span<const uint8_t>(fq).first(fq.size() - 1);
  EXPECT_FALSE(ex.compute(b, out).is_ok());
  b = ok;
  b.ids = std::span<const int32_t>(ids).first(3);
  EXPECT_FALSE(ex.compute(b, out).is_ok());
  EXPECT_FALSE(ex.compute(ok, std::span<float>(out).first(out.size() - 1)).is_ok());
  const std::vector<int32_t> bad = {0, 1, 2, 6};
  b = ok;
  b.ids = bad;
  EXPECT_NE(ex.compute(b, out).message().find("expert 6 is not held"), std::string::npos);
}

TEST(ExpertLayerValidate, RefusesMismatchedShapesAndTypes) {
  const ExpertWeights &g = weights(GgmlType::Q4_K, E, F, X, 1), &u = weights(GgmlType::Q4_K, E, F, X, 2),
                      &d = weights(GgmlType::Q6_K, F, E, X, 3);
  EXPECT_TRUE(ExpertLayer::separate(g.tensor(), u.tensor(), d.tensor()).validate().is_ok());
  const ExpertWeights& u8 = weights(GgmlType::Q8_0, E, F, X, 2);
  Status s = ExpertLayer::separate(g.tensor(), u8.tensor(), d.tensor()).validate();
  EXPECT_NE(s.message().find("different activation formats"), std::string::npos) << s.message();
  const ExpertWeights& wrong = weights(GgmlType::Q6_K, F, 2 * E, X, 4);
  s = ExpertLayer::separate(g.tensor(), u.tensor(), wrong.tensor()).validate();
  EXPECT_NE(s.message().find("expert down weights are [512, 512], expected [512, 256]"), std::string::npos)
      << s.message();
  ExpertLayer::Tensor3d iq = g.tensor();
  iq.type = GgmlType::IQ2_XXS;
  s = ExpertLayer::separate(iq, u.tensor(), d.tensor()).validate();
  EXPECT_NE(s.message().find("IQ2_XXS"), std::string::npos) << s.message();
}

TEST(ExpertLayerFused, FusedGateUpEqualsSeparateTensors) {
  // ffn_gate_up_exps [E, 2F, X]: per expert, rows 0..F-1 gate, F..2F-1 up.
  std::mt19937 rng(15);
  const ExpertWeights &g = weights(GgmlType::Q4_K, E, F, X, 1), &u = weights(GgmlType::Q4_K, E, F, X, 2),
                      &d = weights(GgmlType::Q6_K, F, E, X, 3);
  const uint64_t slab = g.bytes.size() / X;
  std::vector<uint8_t> fused;
  for (int64_t e = 0; e < X; ++e) {
    fused.insert(fused.end(), g.bytes.begin() + long(e * slab), g.bytes.begin() + long((e + 1) * slab));
    fused.insert(fused.end(), u.bytes.begin() + long(e * slab), u.bytes.begin() + long((e + 1) * slab));
  }
  const ExpertLayer sep = ExpertLayer::separate(g.tensor(), u.tensor(), d.tensor());
  const ExpertLayer fus = ExpertLayer::fused({GgmlType::Q4_K, E, 2 * F, X, fused.data()}, d.tensor());
  ASSERT_TRUE(fus.validate().is_ok()) << fus.validate().message();
  const int64_t N = 5;
  const std::vector<float> f = random_rows(N, E, rng);
  const std::vector<int32_t> ids = random_ids(N, rng);
  const std::vector<uint8_t> fq = quantize_rows(sep, f, N);
  std::vector<float> a(size_t(N * K * E)), b(size_t(N * K * E));
  ASSERT_TRUE(expert_ffn(sep, fq.data(), N, K, ids.data(), a.data(), nullptr).is_ok());
  ASSERT_TRUE(expert_ffn(fus, fq.data(), N, K, ids.data(), b.data(), nullptr).is_ok());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
}

}  // namespace
}  // namespace essaim
