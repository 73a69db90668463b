// qwen35moe's layer primitives against naive references written straight from docs/reference.md 5.5-5.7:
// - Gated DeltaNet: a per-head, per-step double-precision loop of the formulas of 5.6 (projections, conv,
//   SiLU, L2 norms, tiled head mapping, decay → delta → update → read-out, gated RMSNorm, ssm_out) for
//   several sequence lengths, head sizes (with and without an 8-lane tail) and chunkings. The engine runs in
//   f32, the reference in f64: the bound is |y − y_ref| ≤ 2e-5 · max|y_ref| (measured ≤ 2.1e-6 here) and the
//   same for the state. Chunked runs, token-by-token runs, in-place state and 1 vs 2 threads must all give
//   bit-identical outputs and states (memcmp): the recurrence is the same sequence of operations.
// - IMRoPE: the general section rule vs the table of 5.5, and for text positions equal to NEOX RoPE.
// - Shared expert: σ(gate_inp·f)·(W_down(silu(W_gate f) ⊙ W_up f)) added after the routed sum.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/kernel_traits.h"
#include "model/gated_attention.h"
#include "model/gated_deltanet.h"
#include "model/ops.h"
#include "model/shared_expert.h"

namespace essaim {
namespace {

std::vector<float> gaussian(size_t n, std::mt19937& rng, float stddev) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<float> uniform(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

WeightMatrix f32_matrix(const std::vector<float>& w, int64_t cols, int64_t rows) {
  EXPECT_EQ(w.size(), size_t(cols * rows));
  return WeightMatrix{.type = GgmlType::F32, .cols = cols, .rows = rows,
                      .data = reinterpret_cast<const uint8_t*>(w.data()), .row_stride = uint64_t(cols) * 4};
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Seeded random GDN layer with F32 weights (the engine's matmul on F32 weights multiplies f32 activations, so
// the only difference from the f64 reference is rounding).
struct GdnProblem {
  GdnShape s;
  std::vector<float> qkv, gate, beta, alpha, conv1d, dt_bias, a, norm, out;
  GdnWeights w;
  GdnProblem(GdnShape shape, uint32_t seed) : s(shape) {
    std::mt19937 rng(seed);
    const int64_t E = s.n_embd, C = s.conv_channels(), VD = s.value_dim(), Hv = s.n_v_heads;
    qkv = gaussian(size_t(E * C), rng, 1.0f / std::sqrt(float(E)));
    gate = gaussian(size_t(E * VD), rng, 1.0f / std::sqrt(float(E)));
    beta = gaussian(size_t(E * Hv), rng, 1.0f / std::sqrt(float(E)));
    alpha = gaussian(size_t(E * Hv), rng, 1.0f / std::sqrt(float(E)));
    conv1d = gaussian(size_t(C * s.conv_kernel), rng, 0.5f);
    dt_bias = uniform(size_t(Hv), rng, -6.9f, -2.3f);
    a = uniform(size_t(Hv), rng, -16.0f, -1.0f);
    norm = uniform(size_t(s.head_dim), rng, 0.8f, 1.2f);
    out = gaussian(size_t(VD * E), rng, 1.0f / std::sqrt(float(VD)));
    w = GdnWeights{.qkv = f32_matrix(qkv, E, C), .gate = f32_matrix(gate, E, VD), .beta = f32_matrix(beta, E, Hv),
                   .alpha = f32_matrix(alpha, E, Hv), .conv1d = conv1d.data(), .dt_bias = dt_bias.data(),
                   .a = a.data(), .norm = norm.data(), .out = f32_matrix(out, VD, E)};
  }
};

// docs/reference.md 5.6 in double precision, one token at a time, state S[h][r][c] (key-major, as the text
// writes it — the engine's value-major layout is a different memory order of the same numbers).
struct NaiveGdn {
  const GdnProblem& p;
  std::vector<double> conv;   // [Kc-1][C]
  std::vector<double> state;  // [Hv][Dk][Dv]
  bool grouped = false;       // Hugging Face's head pairing h / (Hv/Hk) instead of the GGUF's h mod Hk
  explicit NaiveGdn(const GdnProblem& prob)
      : p(prob), conv(p.s.conv_state_size(), 0.0), state(size_t(p.s.n_v_heads) * p.s.head_dim * p.s.head_dim, 0.0) {}

  static double silu(double x) { return x / (1.0 + std::exp(-x)); }

  std::vector<double> step(const float* a_row) {
    const GdnShape& s = p.s;
    const int64_t E = s.n_embd, C = s.conv_channels(), KD = s.key_dim(), VD = s.value_dim(), Hv = s.n_v_heads,
                  Hk = s.n_k_heads, D = s.head_dim, Kc = s.conv_kernel;
    auto proj = [&](const std::vector<float>& w, int64_t rows) {
      std::vector<double> y(size_t(rows), 0.0);
      for (int64_t o = 0; o < rows; ++o)
        for (int64_t i = 0; i < E; ++i) y[size_t(o)] += double(w[size_t(o * E + i)]) * double(a_row[i]);
      return y;
    };
    const std::vector<double> mix = proj(p.qkv, C), z = proj(p.gate, VD), b = proj(p.beta, Hv),
                              al = proj(p.alpha, Hv);
    std::vector<double> u(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; ++c) {
      double sum = 0;
      for (int64_t j = 0; j < Kc; ++j) {
        const double x = j < Kc - 1 ? conv[size_t(j * C + c)] : mix[size_t(c)];
        sum += double(p.conv1d[size_t(c * Kc + j)]) * x;
      }
      u[size_t(c)] = silu(sum);
    }
    for (int64_t j = 0; j + 1 < Kc - 1; ++j)
      for (int64_t c = 0; c < C; ++c) conv[size_t(j * C + c)] = conv[size_t((j + 1) * C + c)];
    if (Kc > 1)
      for (int64_t c = 0; c < C; ++c) conv[size_t((Kc - 2) * C + c)] = mix[size_t(c)];
    for (int64_t h = 0; h < 2 * Hk; ++h) {  // L2 norm of every q and k head, floor eps on the norm
      double ss = 0;
      for (int64_t r = 0; r < D; ++r) ss += u[size_t(h * D + r)] * u[size_t(h * D + r)];
      const double n = std::max(std::sqrt(ss), double(s.eps));
      for (int64_t r = 0; r < D; ++r) u[size_t(h * D + r)] /= n;
    }
    std::vector<double> y_heads(static_cast<size_t>(VD));
    for (int64_t h = 0; h < Hv; ++h) {
      const int64_t j = grouped ? h / (Hv / Hk) : h % Hk;  // tiled in GGUF files
      const double* q = u.data() + j * D;
      const double* k = u.data() + KD + j * D;
      const double* v = u.data() + 2 * KD + h * D;
      const double beta = 1.0 / (1.0 + std::exp(-b[size_t(h)]));
      const double x = al[size_t(h)] + double(p.dt_bias[size_t(h)]);
      const double g = (x > 20.0 ? x : std::log1p(std::exp(x))) * double(p.a[size_t(h)]);
      double* S = state.data() + h * D * D;  // S[r][c]
      for (int64_t i = 0; i < D * D; ++i) S[i] *= std::exp(g);
      std::vector<double> delta(static_cast<size_t>(D));
      for (int64_t c = 0; c < D; ++c) {
        double sk = 0;
        for (int64_t r = 0; r < D; ++r) sk += S[r * D + c] * k[r];
        delta[size_t(c)] = (v[c] - sk) * beta;
      }
      for (int64_t r = 0; r < D; ++r)
        for (int64_t c = 0; c < D; ++c) S[r * D + c] += k[r] * delta[size_t(c)];
      std::vector<double> o(static_cast<size_t>(D));
      double ss = 0;
      for (int64_t c = 0; c < D; ++c) {
        double sq = 0;
        for (int64_t r = 0; r < D; ++r) sq += S[r * D + c] * q[r];
        o[size_t(c)] = sq / std::sqrt(double(D));
        ss += o[size_t(c)] * o[size_t(c)];
      }
      const double rr = 1.0 / std::sqrt(ss / double(D) + double(s.eps));
      for (int64_t c = 0; c < D; ++c)
        y_heads[size_t(h * D + c)] = o[size_t(c)] * rr * double(p.norm[size_t(c)]) * silu(z[size_t(h * D + c)]);
    }
    std::vector<double> y(size_t(E), 0.0);
    for (int64_t e = 0; e < E; ++e)
      for (int64_t i = 0; i < VD; ++i) y[size_t(e)] += double(p.out[size_t(e * VD + i)]) * y_heads[size_t(i)];
    return y;
  }
  // The state in the engine's value-major layout [Hv][Dv][Dk].
  std::vector<double> state_value_major() const {
    const int64_t D = p.s.head_dim;
    std::vector<double> out(state.size());
    for (int64_t h = 0; h < p.s.n_v_heads; ++h)
      for (int64_t r = 0; r < D; ++r)
        for (int64_t c = 0; c < D; ++c) out[size_t((h * D + c) * D + r)] = state[size_t((h * D + r) * D + c)];
    return out;
  }
};

struct GdnRun {
  std::vector<float> y, conv, state;
};

// The engine over T tokens in chunks of `chunk`, from a zero state; out-of-place state buffers unless
// in_place.
GdnRun run_engine(const GdnProblem& p, const std::vector<float>& a, int64_t T, int64_t chunk, ThreadPool* pool,
               bool in_place) {
  GdnRun r{std::vector<float>(size_t(T * p.s.n_embd)), std::vector<float>(p.s.conv_state_size(), 0.0f),
        std::vector<float>(p.s.recurrent_state_size(), 0.0f)};
  std::vector<float> conv2(r.conv.size()), state2(r.state.size());
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t n = std::min(chunk, T - t0);
    GdnStateIo io{.conv_in = r.conv.data(), .state_in = r.state.data(), .conv_out = r.conv.data(),
                  .state_out = r.state.data()};
    if (!in_place) io.conv_out = conv2.data(), io.state_out = state2.data();
    gated_deltanet_forward(p.s, p.w, a.data() + t0 * p.s.n_embd, n, io, r.y.data() + t0 * p.s.n_embd, pool);
    if (!in_place) r.conv.swap(conv2), r.state.swap(state2);
  }
  return r;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

struct GdnCase {
  const char* name;
  GdnShape shape;
  int64_t T;
};

void PrintTo(const GdnCase& c, std::ostream* os) { *os << c.name; }

class GatedDeltaNet : public ::testing::TestWithParam<GdnCase> {};

// The layer's input a, [T][E], seeded.
std::vector<float> layer_input(const GdnCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  return gaussian(size_t(c.T * c.shape.n_embd), rng, 1.0f);
}

TEST_P(GatedDeltaNet, MatchesDoublePrecisionFormulasAtEveryStep) {
  const GdnCase& c = GetParam();
  const GdnProblem p(c.shape, 7);
  const std::vector<float> a = layer_input(c, 11);
  ThreadPool pool(2);
  const GdnRun got = run_engine(p, a, c.T, c.T, &pool, false);

  NaiveGdn ref(p);
  double worst = 0;  // max over steps of |y − y_ref| / max|y_ref|
  for (int64_t t = 0; t < c.T; ++t) {
    const std::vector<double> y = ref.step(a.data() + t * c.shape.n_embd);
    const double scale = max_abs(y);
    ASSERT_GT(scale, 1e-3) << "step " << t << ": output vanishes, the test would prove nothing";
    for (int64_t e = 0; e < c.shape.n_embd; ++e)
      worst = std::max(worst, std::fabs(double(got.y[size_t(t * c.shape.n_embd + e)]) - y[size_t(e)]) / scale);
  }
  EXPECT_LE(worst, 2e-5) << "output";
  const std::vector<double> st = ref.state_value_major();
  const double st_scale = max_abs(st);
  ASSERT_GT(st_scale, 1e-3);
  double st_worst = 0;
  for (size_t i = 0; i < st.size(); ++i) st_worst = std::max(st_worst, std::fabs(double(got.state[i]) - st[i]) / st_scale);
  EXPECT_LE(st_worst, 2e-5) << "state";
  // The conv window holds the raw projections of the last Kc-1 tokens.
  for (size_t i = 0; i < ref.conv.size(); ++i)
    ASSERT_NEAR(got.conv[i], ref.conv[i], 1e-5 * (1 + std::fabs(ref.conv[i]))) << "conv window entry " << i;
  std::printf("%s T=%lld: max rel |dy| %.3g, max rel |dS| %.3g\n", c.name, (long long)c.T, worst, st_worst);
}

TEST_P(GatedDeltaNet, ChunkingsThreadsAndInPlaceStateAreBitIdentical) {
  const GdnCase& c = GetParam();
  const GdnProblem p(c.shape, 3);
  const std::vector<float> a = layer_input(c, 5);
  ThreadPool pool(2);
  const GdnRun whole = run_engine(p, a, c.T, c.T, nullptr, false);
  for (int64_t chunk : {int64_t(1), int64_t(2), int64_t(3), int64_t(16), c.T}) {
    for (bool in_place : {false, true}) {
      for (ThreadPool* tp : {static_cast<ThreadPool*>(nullptr), &pool}) {
        const GdnRun r = run_engine(p, a, c.T, chunk, tp, in_place);
        EXPECT_TRUE(same_bits(r.y, whole.y)) << "chunk " << chunk << " in_place " << in_place << " pool " << !!tp;
        EXPECT_TRUE(same_bits(r.state, whole.state)) << "chunk " << chunk;
        EXPECT_TRUE(same_bits(r.conv, whole.conv)) << "chunk " << chunk;
      }
    }
  }
}

// The delta rule runs the form of the kernels' ISA (the baseline x86-64 code, or its AVX2 clone): every
// ISA gives the same bits, for whole runs and token by token, with column counts that leave a tail of
// single columns after the groups of eight.
TEST_P(GatedDeltaNet, EveryIsaGivesTheSameBits) {
  const GdnCase& c = GetParam();
  const GdnProblem p(c.shape, 13);
  const std::vector<float> a = layer_input(c, 17);
  ThreadPool pool(2);
  const Isa saved = kernels_isa();
  ASSERT_TRUE(set_kernel_isa(Isa::SCALAR).is_ok());
  const GdnRun want = run_engine(p, a, c.T, c.T, &pool, true);
  int compared = 0;
  for (Isa isa : {Isa::AVX2, Isa::AVX512, Isa::NEON, Isa::NEON_DOTPROD}) {
    if (!isa_supported(isa)) continue;
    ASSERT_TRUE(set_kernel_isa(isa).is_ok());
    for (int64_t chunk : {int64_t(1), c.T}) {
      const GdnRun got = run_engine(p, a, c.T, chunk, &pool, chunk == 1);
      EXPECT_TRUE(same_bits(got.y, want.y)) << isa_name(isa) << " chunk " << chunk;
      EXPECT_TRUE(same_bits(got.state, want.state)) << isa_name(isa) << " chunk " << chunk;
      ++compared;
    }
  }
  ASSERT_TRUE(set_kernel_isa(saved).is_ok());
  if (compared == 0) GTEST_SKIP() << "this CPU has no ISA beyond the baseline";
}

// Dk = 12 exercises the dot products' scalar tail; Dk = 11 leaves three single columns after the 8s; Kc = 1 has no conv window at all; Hv = 2·Hk makes the
// tiled mapping (h mod Hk) differ from the grouped one (h / 2).
INSTANTIATE_TEST_SUITE_P(
    Shapes, GatedDeltaNet,
    ::testing::Values(
        GdnCase{"Hk2_Hv4_D16", {.n_embd = 40, .conv_kernel = 4, .n_k_heads = 2, .n_v_heads = 4, .head_dim = 16, .eps = 1e-6f}, 37},
        GdnCase{"Hk1_Hv3_D12", {.n_embd = 24, .conv_kernel = 3, .n_k_heads = 1, .n_v_heads = 3, .head_dim = 12, .eps = 1e-6f}, 9},
        GdnCase{"Hk2_Hv2_D32_Kc1", {.n_embd = 32, .conv_kernel = 1, .n_k_heads = 2, .n_v_heads = 2, .head_dim = 32, .eps = 1e-6f}, 1},
        GdnCase{"Hk1_Hv2_D11", {.n_embd = 20, .conv_kernel = 4, .n_k_heads = 1, .n_v_heads = 2, .head_dim = 11, .eps = 1e-6f}, 6},
        GdnCase{"Hk2_Hv4_D40_long", {.n_embd = 64, .conv_kernel = 4, .n_k_heads = 2, .n_v_heads = 4, .head_dim = 40, .eps = 1e-6f}, 70}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(GatedDeltaNetHeads, ValueHeadsReadKeyHeadsTiledNotGrouped) {
  // With Hv = 2·Hk the GGUF (tiled) rule h mod Hk and Hugging Face's grouped rule h / 2 pair different heads:
  // the engine must agree with the first and visibly disagree with the second.
  const GdnShape s{.n_embd = 32, .conv_kernel = 2, .n_k_heads = 2, .n_v_heads = 4, .head_dim = 8, .eps = 1e-6f};
  const GdnProblem p(s, 21);
  std::mt19937 rng(2);
  const std::vector<float> a = gaussian(size_t(6 * s.n_embd), rng, 1.0f);
  const GdnRun got = run_engine(p, a, 6, 6, nullptr, false);
  NaiveGdn tiled(p), grouped(p);
  grouped.grouped = true;
  for (int t = 0; t < 6; ++t) {
    tiled.step(a.data() + t * s.n_embd);
    grouped.step(a.data() + t * s.n_embd);
  }
  auto worst = [&](const NaiveGdn& ref) {
    const std::vector<double> st = ref.state_value_major();
    double w = 0;
    for (size_t i = 0; i < st.size(); ++i) w = std::max(w, std::fabs(double(got.state[i]) - st[i]));
    return w / max_abs(st);
  };
  EXPECT_LE(worst(tiled), 2e-5);
  EXPECT_GE(worst(grouped), 1e-2);
}

TEST(ImRope, SectionRuleFollowsTheTable) {
  // Distinct position components show which one each pair took.
  const std::array<int32_t, 4> pos = {3, 50, 700, 9000};
  const std::array<int32_t, 4> sections = {2, 1, 1, 3};  // S = 7
  const int32_t n_rot = 24;                               // 12 pairs: σ = 0..6, 0..4
  const float base = 10000.0f;
  std::vector<float> cs(static_cast<size_t>(n_rot));
  imrope_cos_sin(pos, n_rot, base, sections, cs.data());
  const float ts = std::pow(base, -2.0f / float(n_rot));
  for (int32_t i = 0; i < n_rot / 2; ++i) {
    const int32_t sg = i % 7;
    int c = 3;
    if (sg % 3 == 1 && sg < 3 * sections[1]) c = 1;
    else if (sg % 3 == 2 && sg < 3 * sections[2]) c = 2;
    else if (sg % 3 == 0 && sg < 3 * sections[0]) c = 0;
    float theta = float(pos[size_t(c)]);
    for (int32_t k = 0; k < i; ++k) theta = theta * ts;
    EXPECT_EQ(cs[size_t(i)], std::cos(theta)) << "pair " << i;
    EXPECT_EQ(cs[size_t(n_rot / 2 + i)], std::sin(theta)) << "pair " << i;
  }
  // σ = 0 → t, 1 → h, 2 → w, 3 → t (3 < 6), 4 → e (4 ≥ 3·s1), 5 → e, 6 → e: every component is used.
  EXPECT_EQ(cs[0], std::cos(float(pos[0])));
  EXPECT_EQ(cs[1], std::cos(float(pos[1]) * ts));
  EXPECT_EQ(cs[2], std::cos(float(pos[2]) * ts * ts));
}

TEST(ImRope, TextPositionsWithQwenSectionsAreNeoxRope) {
  for (int32_t pos : {0, 1, 17, 4095, 100000}) {
    std::vector<float> a(64), b(64);
    imrope_cos_sin(imrope_text_position(pos), 64, 1e7f, {11, 11, 10, 0}, a.data());
    rope_cos_sin(pos, 64, 1e7f, b.data());
    EXPECT_TRUE(same_bits(a, b)) << "pos " << pos;
  }
  // A section layout that reaches p_e leaves those pairs unrotated for text (angle 0).
  std::vector<float> cs(16);
  imrope_cos_sin(imrope_text_position(5), 16, 10000.0f, {1, 1, 1, 5}, cs.data());  // S = 8, σ ≥ 3 → p_e
  for (int i = 3; i < 8; ++i) EXPECT_EQ(cs[size_t(i)], 1.0f) << "pair " << i;
  EXPECT_NE(cs[0], 1.0f);
}

TEST(SharedExpert, GatedSumAddedAfterTheRoutedSum) {
  const int64_t E = 32, Fs = 24, n = 3;
  std::mt19937 rng(9);
  const std::vector<float> gi = gaussian(size_t(E), rng, 0.3f), wg = gaussian(size_t(E * Fs), rng, 0.2f),
                           wu = gaussian(size_t(E * Fs), rng, 0.2f), wd = gaussian(size_t(Fs * E), rng, 0.2f),
                           f = gaussian(size_t(n * E), rng, 1.0f), routed = gaussian(size_t(n * E), rng, 1.0f);
  const SharedExpert se{.gate_inp = gi.data(), .gate = f32_matrix(wg, E, Fs), .up = f32_matrix(wu, E, Fs),
                        .down = f32_matrix(wd, Fs, E)};
  std::vector<float> out = routed;
  shared_expert_add(se, f.data(), n, out.data(), nullptr);
  for (int64_t r = 0; r < n; ++r) {
    const float* fr = f.data() + r * E;
    double gdot = 0;
    for (int64_t i = 0; i < E; ++i) gdot += double(gi[size_t(i)]) * fr[i];
    const double gamma = 1.0 / (1.0 + std::exp(-gdot));
    std::vector<double> act(static_cast<size_t>(Fs));
    for (int64_t o = 0; o < Fs; ++o) {
      double g = 0, u = 0;
      for (int64_t i = 0; i < E; ++i) {
        g += double(wg[size_t(o * E + i)]) * fr[i];
        u += double(wu[size_t(o * E + i)]) * fr[i];
      }
      act[size_t(o)] = g / (1.0 + std::exp(-g)) * u;
    }
    for (int64_t e = 0; e < E; ++e) {
      double sh = 0;
      for (int64_t o = 0; o < Fs; ++o) sh += double(wd[size_t(e * Fs + o)]) * act[size_t(o)];
      EXPECT_NEAR(out[size_t(r * E + e)], double(routed[size_t(r * E + e)]) + gamma * sh, 1e-5) << r << "," << e;
    }
  }
}

}  // namespace
}  // namespace essaim
