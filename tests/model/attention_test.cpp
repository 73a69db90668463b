// The primitives of the forward pass against naive references written from docs/reference.md 4.3:
// attention (causal GQA over the KV cache) vs a double-precision loop; RMSNorm, NEOX RoPE and the fixed-order
// dot product vs their formulas; batch and thread invariance of attention.
#include <gtest/gtest.h>

#include <bit>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/fp16.h"
#include "model/attention.h"
#include "model/ops.h"

namespace essaim {
namespace {

std::vector<float> gaussian(size_t n, std::mt19937& rng, float stddev = 1.0f) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

struct Problem {
  int32_t H = 8, Hkv = 2, D = 64, T = 21;
  std::vector<float> q, k, v;  // [T][H][D], [T][Hkv][D], [T][Hkv][D]
  explicit Problem(std::mt19937& rng)
      : q(gaussian(size_t(T * H * D), rng)), k(gaussian(size_t(T * Hkv * D), rng)), v(gaussian(size_t(T * Hkv * D), rng)) {}
};

// o[t][h] = Σ_j softmax_j(scale · q·k_j) v_j over j ≤ t, all in double, K/V as the cache holds them.
std::vector<double> naive_attention(const Problem& p, KvType kv) {
  auto stored = [&](float x) { return kv == KvType::F16 ? double(f16_to_f32(f32_to_f16(x))) : double(x); };
  const int32_t G = p.H / p.Hkv;
  const double scale = 1.0 / std::sqrt(double(p.D));
  std::vector<double> o(size_t(p.T * p.H * p.D));
  for (int32_t t = 0; t < p.T; ++t) {
    for (int32_t h = 0; h < p.H; ++h) {
      const int32_t g = h / G;
      std::vector<double> s(size_t(t + 1));
      double m = -INFINITY;
      for (int32_t j = 0; j <= t; ++j) {
        double dot = 0;
        for (int32_t d = 0; d < p.D; ++d)
          dot += double(p.q[size_t((t * p.H + h) * p.D + d)]) * stored(p.k[size_t((j * p.Hkv + g) * p.D + d)]);
        s[size_t(j)] = dot * scale;
        m = std::max(m, s[size_t(j)]);
      }
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - m));
      for (int32_t d = 0; d < p.D; ++d) {
        double acc = 0;
        for (int32_t j = 0; j <= t; ++j) acc += s[size_t(j)] / sum * stored(p.v[size_t((j * p.Hkv + g) * p.D + d)]);
        o[size_t((t * p.H + h) * p.D + d)] = acc;
      }
    }
  }
  return o;
}

std::vector<float> run_attention(const Problem& p, KvType type, size_t batch, ThreadPool* pool) {
  KvCache kv(type, p.Hkv, p.D);
  std::vector<float> out(size_t(p.T * p.H * p.D));
  std::vector<int32_t> pos(static_cast<size_t>(p.T));
  for (int32_t t = 0; t < p.T; ++t) pos[size_t(t)] = t;
  for (int32_t t0 = 0; t0 < p.T; t0 += int32_t(batch)) {
    const int32_t n = std::min(int32_t(batch), p.T - t0);
    for (int32_t t = t0; t < t0 + n; ++t)
      kv.store(t, p.k.data() + size_t(t * p.Hkv * p.D), p.v.data() + size_t(t * p.Hkv * p.D));
    attention({.q = p.q.data() + size_t(t0 * p.H * p.D), .pos = pos.data() + t0, .n_q = n, .n_head = p.H,
               .scale = 1.0f / std::sqrt(float(p.D)), .kv = &kv, .out = out.data() + size_t(t0 * p.H * p.D)},
              pool);
  }
  return out;
}

TEST(Attention, MatchesNaiveDoubleReference) {
  std::mt19937 rng(21);
  const Problem p(rng);
  ASSERT_NE(p.q[0], p.q[1]);
  for (KvType kv : {KvType::F32, KvType::F16}) {
    const std::vector<double> want = naive_attention(p, kv);
    const std::vector<float> got = run_attention(p, kv, size_t(p.T), nullptr);
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
    EXPECT_LT(worst, 2e-6) << (kv == KvType::F16 ? "f16" : "f32") << " cache";
  }
}

TEST(Attention, F16CacheRoundsKAndV) {
  // With K/V that are not f16-representable, the f16 cache must give the f16-rounded answer, not the f32 one.
  std::mt19937 rng(22);
  const Problem p(rng);
  const std::vector<float> f16 = run_attention(p, KvType::F16, size_t(p.T), nullptr);
  const std::vector<float> f32 = run_attention(p, KvType::F32, size_t(p.T), nullptr);
  const std::vector<double> want16 = naive_attention(p, KvType::F16);
  double d16 = 0, d32 = 0;
  for (size_t i = 0; i < want16.size(); ++i) {
    d16 = std::max(d16, std::fabs(f16[i] - want16[i]));
    d32 = std::max(d32, std::fabs(f32[i] - want16[i]));
  }
  EXPECT_LT(d16, 2e-6);
  EXPECT_GT(d32, 1e-5);
}

TEST(KvCache, F16ReadsBackEveryStorablePatternAsTheSoftwareConversion) {
  // Every f16 pattern f32_to_f16 can produce (all non-NaN ones, and its quiet NaN of either sign), stored and
  // read back through whichever conversion this CPU uses (F16C or the table): the bits of f16_to_f32.
  constexpr int32_t D = 200;  // not a multiple of 8: the row tail takes the other path
  std::vector<float> values;
  for (uint32_t h = 0; h < 65536; ++h) {
    const bool nan = (h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0;
    if (!nan) values.push_back(f16_to_f32(uint16_t(h)));
  }
  values.push_back(std::bit_cast<float>(0x7FC00001u));
  values.push_back(std::bit_cast<float>(0xFF800001u));
  while (values.size() % D != 0) values.push_back(0.0f);
  KvCache kv(KvType::F16, 1, D);
  const int32_t n = int32_t(values.size() / D);
  for (int32_t j = 0; j < n; ++j) kv.store(j, values.data() + size_t(j) * D, values.data() + size_t(j) * D);
  std::vector<float> k(values.size()), v(values.size());
  kv.load_k(0, 0, n, k.data());
  kv.load_v(0, 1, n, v.data());  // an offset start
  for (size_t i = 0; i < values.size(); ++i) {
    const uint32_t want = std::bit_cast<uint32_t>(f16_to_f32(f32_to_f16(values[i])));
    ASSERT_EQ(std::bit_cast<uint32_t>(k[i]), want) << "value " << i;
    if (i >= size_t(D)) {
      ASSERT_EQ(std::bit_cast<uint32_t>(v[i - D]), want) << "value " << i;
    }
  }
}

TEST(Attention, BatchSplitAndThreadsAreBitIdentical) {
  std::mt19937 rng(23);
  const Problem p(rng);
  const std::vector<float> whole = run_attention(p, KvType::F16, size_t(p.T), nullptr);
  ThreadPool pool(2);
  for (size_t batch : {size_t(1), size_t(4), size_t(p.T)}) {
    const std::vector<float> got = run_attention(p, KvType::F16, batch, &pool);
    EXPECT_EQ(std::memcmp(got.data(), whole.data(), whole.size() * 4), 0) << "batch " << batch;
  }
}

TEST(Attention, LongContextCrossesConversionBlocks) {
  // More positions than one 64-row conversion block, against the naive reference.
  std::mt19937 rng(24);
  Problem p(rng);
  p.T = 150;
  p.H = 4;
  p.Hkv = 4;
  p.D = 32;
  p.q = gaussian(size_t(p.T * p.H * p.D), rng);
  p.k = gaussian(size_t(p.T * p.Hkv * p.D), rng);
  p.v = gaussian(size_t(p.T * p.Hkv * p.D), rng);
  const std::vector<double> want = naive_attention(p, KvType::F32);
  const std::vector<float> got = run_attention(p, KvType::F32, 50, nullptr);
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
  EXPECT_LT(worst, 2e-6);
}

TEST(Attention, RowTilesAcrossConversionBlocksAreBitIdentical) {
  // A prefill call groups up to eight query rows per item, sharing each converted K/V block; rows of one
  // item attend to different lengths across the 64-position blocks. Every split must equal one-row calls.
  std::mt19937 rng(25);
  Problem p(rng);
  p.T = 150;
  p.H = 4;
  p.Hkv = 2;
  p.D = 32;
  p.q = gaussian(size_t(p.T * p.H * p.D), rng);
  p.k = gaussian(size_t(p.T * p.Hkv * p.D), rng);
  p.v = gaussian(size_t(p.T * p.Hkv * p.D), rng);
  const std::vector<float> one = run_attention(p, KvType::F16, 1, nullptr);
  ThreadPool pool(2);
  for (size_t batch : {size_t(7), size_t(61), size_t(p.T)}) {
    for (ThreadPool* threads : {static_cast<ThreadPool*>(nullptr), &pool}) {
      const std::vector<float> got = run_attention(p, KvType::F16, batch, threads);
      EXPECT_EQ(std::memcmp(got.data(), one.data(), one.size() * 4), 0)
          << "batch " << batch << (threads ? ", 2 threads" : ", 1 thread");
    }
  }
}

TEST(Ops, RmsNormFollowsTheFormula) {
  std::mt19937 rng(25);
  const std::vector<float> x = gaussian(300, rng, 3.0f), w = gaussian(300, rng);
  std::vector<float> y(300);
  rms_norm(x.data(), w.data(), 300, 1e-6f, y.data());
  double ss = 0;
  for (float v : x) ss += double(v) * v;
  const double r = 1.0 / std::sqrt(ss / 300 + 1e-6);
  for (size_t i = 0; i < 300; ++i) EXPECT_NEAR(y[i], x[i] * r * w[i], 1e-6 * std::fabs(x[i] * r * w[i]) + 1e-7);
  // eps is inside the square root: a zero vector stays finite.
  std::vector<float> zeros(8, 0.0f), ones(8, 1.0f), out(8);
  rms_norm(zeros.data(), ones.data(), 8, 1e-6f, out.data());
  for (float v : out) EXPECT_EQ(v, 0.0f);
}

TEST(Ops, RopeNeoxPairsIWithIPlusHalfAndLeavesTheTail) {
  const int32_t D = 16, n_rot = 8;
  std::vector<float> cs(static_cast<size_t>(n_rot));
  rope_cos_sin(3, n_rot, 10000.0f, cs.data());
  std::vector<float> x(static_cast<size_t>(D), 0.0f);
  x[0] = 1.0f;    // rotates into dimension n_rot/2 = 4, not 1
  x[12] = 5.0f;   // beyond n_rot: untouched
  rope_neox(x.data(), n_rot, cs.data());
  EXPECT_FLOAT_EQ(x[0], std::cos(3.0f));
  EXPECT_FLOAT_EQ(x[4], std::sin(3.0f));
  EXPECT_EQ(x[1], 0.0f);
  EXPECT_EQ(x[12], 5.0f);
}

TEST(Ops, RopeAnglesAreIterativeF32Products) {
  // t_{i+1} = t_i · θs in f32 from f32(pos): at a large position this differs from pos · base^(-2i/n) in
  // double (docs/reference.md 10.2), so the test pins the iterative rule exactly.
  const int32_t n_rot = 128, pos = 100000;
  const float base = 1e6f;
  std::vector<float> cs(static_cast<size_t>(n_rot));
  rope_cos_sin(pos, n_rot, base, cs.data());
  const float theta_scale = std::pow(base, -2.0f / float(n_rot));
  float t = float(pos);
  bool differs_from_double = false;
  for (int32_t i = 0; i < n_rot / 2; ++i) {
    EXPECT_EQ(cs[size_t(i)], std::cos(t)) << i;
    EXPECT_EQ(cs[size_t(n_rot / 2 + i)], std::sin(t)) << i;
    const double exact = double(pos) * std::pow(double(base), -2.0 * i / n_rot);
    differs_from_double = differs_from_double || float(std::cos(exact)) != cs[size_t(i)];
    t = t * theta_scale;
  }
  EXPECT_TRUE(differs_from_double);
}

// dot_f32's contract written out: lane l sums the products of indices ≡ l (mod 8), then the fixed fold.
float lane_order_dot(const float* a, const float* b, int64_t n) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < n; ++i) lane[i % 8] = lane[i % 8] + a[i] * b[i];
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

TEST(Ops, DotF32UsesTheDocumentedLaneOrder) {
  std::mt19937 rng(26);
  for (int64_t n : {1, 7, 8, 9, 64, 131}) {
    const std::vector<float> a = gaussian(size_t(n), rng), b = gaussian(size_t(n), rng);
    EXPECT_EQ(dot_f32(a.data(), b.data(), n), lane_order_dot(a.data(), b.data(), n)) << n;
  }
}

// Attention's blocked forms: each row's dot in the documented order, and each value row's step of o += p·v
// in order, exactly as one axpy_f32 after another.
TEST(Ops, DotF32RowsUsesTheDocumentedLaneOrderForEveryRow) {
  std::mt19937 rng(27);
  for (int64_t n : {1, 7, 8, 9, 64, 131, 256})
    for (int64_t n_b : {1, 3, 4, 5, 8, 13, 64}) {
      const int64_t stride = n + 3;
      const std::vector<float> a = gaussian(size_t(n), rng), b = gaussian(size_t(stride * n_b), rng);
      std::vector<float> got(static_cast<size_t>(n_b));
      dot_f32_rows(a.data(), b.data(), stride, n_b, n, got.data());
      for (int64_t r = 0; r < n_b; ++r)
        EXPECT_EQ(std::bit_cast<uint32_t>(got[size_t(r)]),
                  std::bit_cast<uint32_t>(lane_order_dot(a.data(), b.data() + r * stride, n)))
            << "n " << n << " rows " << n_b << " row " << r;
    }
}

TEST(Ops, AxpyF32RowsEqualsOneAxpyPerRowInOrder) {
  std::mt19937 rng(28);
  for (int64_t n : {1, 7, 8, 9, 64, 72, 131, 256})
    for (int64_t n_x : {0, 1, 2, 5, 64}) {
      const int64_t stride = n + 5;
      const std::vector<float> s = gaussian(size_t(n_x), rng), x = gaussian(size_t(stride * n_x), rng);
      std::vector<float> want = gaussian(size_t(n), rng), got = want;
      for (int64_t r = 0; r < n_x; ++r) axpy_f32(s[size_t(r)], x.data() + r * stride, want.data(), n);
      axpy_f32_rows(s.data(), x.data(), stride, n_x, got.data(), n);
      for (int64_t i = 0; i < n; ++i)
        EXPECT_EQ(std::bit_cast<uint32_t>(got[size_t(i)]), std::bit_cast<uint32_t>(want[size_t(i)]))
            << "n " << n << " rows " << n_x << " element " << i;
    }
}

// The two-query forms: each query's results bit for bit the one-query form's (which the tests above pin to
// the documented order), for row counts around the four-row bodies and lengths with and without a tail.
TEST(Ops, DotF32Rows2EqualsOneQueryAtATime) {
  std::mt19937 rng(29);
  for (int64_t n : {1, 7, 8, 9, 64, 131, 256})
    for (int64_t n_b : {1, 3, 4, 5, 8, 13, 64}) {
      const int64_t stride = n + 3;
      const std::vector<float> a0 = gaussian(size_t(n), rng), a1 = gaussian(size_t(n), rng);
      const std::vector<float> b = gaussian(size_t(stride * n_b), rng);
      std::vector<float> want0(static_cast<size_t>(n_b)), want1 = want0, got0 = want0, got1 = want0;
      dot_f32_rows(a0.data(), b.data(), stride, n_b, n, want0.data());
      dot_f32_rows(a1.data(), b.data(), stride, n_b, n, want1.data());
      dot_f32_rows2(a0.data(), a1.data(), b.data(), stride, n_b, n, got0.data(), got1.data());
      for (int64_t r = 0; r < n_b; ++r) {
        EXPECT_EQ(std::bit_cast<uint32_t>(got0[size_t(r)]), std::bit_cast<uint32_t>(want0[size_t(r)]))
            << "n " << n << " rows " << n_b << " row " << r;
        EXPECT_EQ(std::bit_cast<uint32_t>(got1[size_t(r)]), std::bit_cast<uint32_t>(want1[size_t(r)]))
            << "n " << n << " rows " << n_b << " row " << r;
      }
    }
}

TEST(Ops, AxpyF32Rows2EqualsOneOutputAtATime) {
  std::mt19937 rng(30);
  for (int64_t n : {1, 7, 8, 9, 32, 40, 64, 72, 131, 256})
    for (int64_t n_x : {0, 1, 2, 5, 64}) {
      const int64_t stride = n + 5;
      const std::vector<float> s0 = gaussian(size_t(n_x), rng), s1 = gaussian(size_t(n_x), rng);
      const std::vector<float> x = gaussian(size_t(stride * n_x), rng);
      std::vector<float> want0 = gaussian(size_t(n), rng), want1 = gaussian(size_t(n), rng);
      std::vector<float> got0 = want0, got1 = want1;
      axpy_f32_rows(s0.data(), x.data(), stride, n_x, want0.data(), n);
      axpy_f32_rows(s1.data(), x.data(), stride, n_x, want1.data(), n);
      axpy_f32_rows2(s0.data(), s1.data(), x.data(), stride, n_x, got0.data(), got1.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_EQ(std::bit_cast<uint32_t>(got0[size_t(i)]), std::bit_cast<uint32_t>(want0[size_t(i)]))
            << "n " << n << " rows " << n_x << " element " << i;
        EXPECT_EQ(std::bit_cast<uint32_t>(got1[size_t(i)]), std::bit_cast<uint32_t>(want1[size_t(i)]))
            << "n " << n << " rows " << n_x << " element " << i;
      }
    }
}

// The four-query forms likewise: each query's results bit for bit the one-query form's, around the two-row
// dot bodies and the sixteen-element axpy chunks, with and without tails.
TEST(Ops, DotF32Rows4EqualsOneQueryAtATime) {
  std::mt19937 rng(31);
  for (int64_t n : {1, 7, 8, 9, 64, 131, 256})
    for (int64_t n_b : {1, 2, 3, 4, 5, 13, 64}) {
      const int64_t stride = n + 3;
      std::vector<std::vector<float>> a, want, got;
      for (int q = 0; q < 4; ++q) {
        a.push_back(gaussian(size_t(n), rng));
        want.emplace_back(size_t(n_b));
        got.emplace_back(size_t(n_b));
      }
      const std::vector<float> b = gaussian(size_t(stride * n_b), rng);
      for (int q = 0; q < 4; ++q) dot_f32_rows(a[size_t(q)].data(), b.data(), stride, n_b, n, want[size_t(q)].data());
      const float* as[4] = {a[0].data(), a[1].data(), a[2].data(), a[3].data()};
      float* outs[4] = {got[0].data(), got[1].data(), got[2].data(), got[3].data()};
      dot_f32_rows4(as, b.data(), stride, n_b, n, outs);
      for (int q = 0; q < 4; ++q)
        for (int64_t r = 0; r < n_b; ++r)
          EXPECT_EQ(std::bit_cast<uint32_t>(got[size_t(q)][size_t(r)]), std::bit_cast<uint32_t>(want[size_t(q)][size_t(r)]))
              << "n " << n << " rows " << n_b << " query " << q << " row " << r;
    }
}

TEST(Ops, AxpyF32Rows4EqualsOneOutputAtATime) {
  std::mt19937 rng(32);
  for (int64_t n : {1, 7, 8, 9, 16, 24, 40, 64, 131, 256})
    for (int64_t n_x : {0, 1, 2, 5, 64}) {
      const int64_t stride = n + 5;
      std::vector<std::vector<float>> s4, want, got;
      for (int q = 0; q < 4; ++q) {
        s4.push_back(gaussian(size_t(n_x), rng));
        want.push_back(gaussian(size_t(n), rng));
        got.push_back(want.back());
      }
      const std::vector<float> x = gaussian(size_t(stride * n_x), rng);
      for (int q = 0; q < 4; ++q) axpy_f32_rows(s4[size_t(q)].data(), x.data(), stride, n_x, want[size_t(q)].data(), n);
      const float* ss[4] = {s4[0].data(), s4[1].data(), s4[2].data(), s4[3].data()};
      float* ys[4] = {got[0].data(), got[1].data(), got[2].data(), got[3].data()};
      axpy_f32_rows4(ss, x.data(), stride, n_x, ys, n);
      for (int q = 0; q < 4; ++q)
        for (int64_t i = 0; i < n; ++i)
          EXPECT_EQ(std::bit_cast<uint32_t>(got[size_t(q)][size_t(i)]), std::bit_cast<uint32_t>(want[size_t(q)][size_t(i)]))
              << "n " << n << " rows " << n_x << " output " << q << " element " << i;
    }
}

}  // namespace
}  // namespace essaim
