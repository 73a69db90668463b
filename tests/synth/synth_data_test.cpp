// The weights: byte-identical for one seed whatever the thread count, different for another seed, every
// quantised block's f16 fields finite, dequantised values with the intended means and spreads, and router
// skew that measurably concentrates expert choices.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "synth/synth_vocab.h"
#include "synth_test_util.h"

namespace essaim {
namespace {

using namespace synth_test;

struct Moments {
  double mean = 0, std = 0;
};

Moments moments(const std::vector<float>& v) {
  double s = 0, s2 = 0;
  for (float x : v) {
    s += x;
    s2 += double(x) * x;
  }
  Moments m;
  m.mean = s / double(v.size());
  m.std = std::sqrt(std::max(0.0, s2 / double(v.size()) - m.mean * m.mean));
  return m;
}

TEST(SynthData, SameSeedSameBytesAnyThreadCountOtherSeedDiffers) {
  for (SynthArch arch : {SynthArch::QWEN3MOE, SynthArch::QWEN35MOE}) {
    const SynthOptions base{.arch = arch, .types = SynthTypeMix::Q4_K_M, .seed = 42, .router_skew = 2.0f};
    SynthOptions one = base, two = base, other = base;
    one.threads = 1;
    two.threads = 3;  // uneven chunking on purpose
    other.seed = 43;
    const std::string p1 = scratch_file("det_1.gguf"), p2 = scratch_file("det_2.gguf"),
                      p3 = scratch_file("det_3.gguf");
    write_model(one, p1);
    write_model(two, p2);
    write_model(other, p3);
    const std::vector<uint8_t> a = read_bytes(p1), b = read_bytes(p2), c = read_bytes(p3);
    ASSERT_GT(a.size(), 100000u);
    EXPECT_TRUE(a == b) << synth_arch_name(arch);
    ASSERT_EQ(a.size(), c.size());  // same layout...
    Result<GgufFile> fa = GgufFile::open(p1), fc = GgufFile::open(p3);
    ASSERT_TRUE(fa.is_ok() && fc.is_ok());
    // ...but every tensor's data differs (norms too: they carry noise).
    for (size_t i = 0; i < fa->tensors().size(); ++i) {
      const GgufTensor& ta = fa->tensors()[i];
      const GgufTensor& tc = fc->tensors()[i];
      EXPECT_FALSE(std::equal(ta.data, ta.data + ta.nbytes, tc.data)) << ta.name;
    }
  }
}

// Every Q4_K block's d and dmin and every Q6_K block's d are finite f16 (docs/reference.md 1.8 check 20).
TEST(SynthData, QuantisedScaleFieldsAreFinite) {
  const std::string path = scratch_file("finite.gguf");
  write_model({.arch = SynthArch::QWEN35MOE, .types = SynthTypeMix::Q4_K_M, .seed = 3, .router_skew = 3.0f,
               .nextn = 1},
              path);
  Result<GgufFile> f = GgufFile::open(path);
  ASSERT_TRUE(f.is_ok());
  size_t n_q4 = 0, n_q6 = 0;
  for (const GgufTensor& t : f->tensors()) {
    if (t.type == GgmlType::Q4_K) {
      for (uint64_t b = 0; b < t.nbytes / 144; ++b, ++n_q4) {
        uint16_t d, dmin;
        std::memcpy(&d, t.data + 144 * b, 2);
        std::memcpy(&dmin, t.data + 144 * b + 2, 2);
        ASSERT_TRUE(std::isfinite(f16_to_f32(d)) && std::isfinite(f16_to_f32(dmin))) << t.name << " block " << b;
        ASSERT_GT(f16_to_f32(d), 0.0f) << t.name;
      }
    } else if (t.type == GgmlType::Q6_K) {
      for (uint64_t b = 0; b < t.nbytes / 210; ++b, ++n_q6) {
        uint16_t d;
        std::memcpy(&d, t.data + 210 * b + 208, 2);
        ASSERT_TRUE(std::isfinite(f16_to_f32(d))) << t.name << " block " << b;
        ASSERT_GT(f16_to_f32(d), 0.0f) << t.name;
      }
    }
  }
  EXPECT_GT(n_q4, 1000u);
  EXPECT_GT(n_q6, 100u);
}

// Dequantised weights have the spread the initialisation asks for (gain / sqrt(fan-in)) and no bias; norms
// sit at 1; ssm_a is negative (already -exp(A_log)); dt_bias is softplus^-1 of a small dt.
TEST(SynthData, ValuesHaveTheIntendedDistribution) {
  for (SynthTypeMix mix : {SynthTypeMix::F32, SynthTypeMix::Q4_K_M}) {
    const std::string path = scratch_file("dist.gguf");
    write_model({.arch = SynthArch::QWEN35MOE, .types = mix, .seed = 11}, path);
    Result<GgufFile> f = GgufFile::open(path);
    ASSERT_TRUE(f.is_ok());
    const auto values = [&](const char* name) { return tensor_values(*f->find_tensor(name)); };
    struct Case {
      const char* name;
      double std;
    };
    const double kE = 1.0 / 16.0;  // 1 / sqrt(256)
    for (const Case c : {Case{"blk.0.ffn_gate_exps.weight", kE}, Case{"blk.1.ffn_down_exps.weight", 0.5 * kE},
                         Case{"blk.3.ffn_down_exps.weight", 0.5 * kE}, Case{"blk.0.attn_qkv.weight", kE},
                         Case{"blk.3.attn_q.weight", kE}, Case{"blk.0.ffn_gate_inp.weight", kE},
                         Case{"token_embd.weight", 1.0}}) {
      const Moments m = moments(values(c.name));
      EXPECT_NEAR(m.std, c.std, 0.1 * c.std) << c.name << " " << synth_type_mix_name(mix);
      EXPECT_NEAR(m.mean, 0.0, 0.05 * c.std) << c.name << " " << synth_type_mix_name(mix);
    }
    // The LM head: logits_scale / sqrt(E) for plain-text tokens, a quarter of it for special tokens and
    // stray bytes.
    const std::vector<float> out = values("output.weight");
    const std::vector<std::string>& tokens = *f->get_string_array("tokenizer.ggml.tokens");
    const GgufValue& types = *f->find_kv("tokenizer.ggml.token_type");
    std::vector<float> plain, damped;
    for (size_t t = 0; t < tokens.size(); ++t) {
      const bool is_plain = types.ints[t] == 1 && synth_token_is_plain_text(tokens[t]);
      (is_plain ? plain : damped).insert((is_plain ? plain : damped).end(), out.begin() + long(t * 256),
                                         out.begin() + long((t + 1) * 256));
    }
    EXPECT_GT(plain.size(), 256u * 380);  // the 95 printable ASCII bytes, tab, newline and every merge
    EXPECT_GT(damped.size(), 256u * 150);
    EXPECT_NEAR(moments(plain).std, 0.5, 0.05) << synth_type_mix_name(mix);
    EXPECT_NEAR(moments(damped).std, 0.125, 0.0125) << synth_type_mix_name(mix);
    for (const char* norm : {"blk.0.attn_norm.weight", "blk.3.attn_q_norm.weight", "blk.0.ssm_norm.weight",
                             "output_norm.weight"}) {
      const Moments m = moments(values(norm));
      EXPECT_NEAR(m.mean, 1.0, 0.01) << norm;
      EXPECT_NEAR(m.std, 0.02, 0.01) << norm;
    }
    for (float a : values("blk.0.ssm_a")) EXPECT_TRUE(a <= -1.0f && a >= -16.0f) << a;
    for (float b : values("blk.0.ssm_dt.bias")) EXPECT_TRUE(b >= -6.9f && b <= -2.3f) << b;
  }
}

// Router choices on the inputs layer 0 actually sees: each token's embedding, RMS-normalised and scaled by
// ffn_norm (qwen3moe) or post_attention_norm (qwen35moe), top-K of the router logits.
std::vector<double> expert_shares(const GgufFile& f, const std::string& arch) {
  const GgufTensor& emb = *f.find_tensor("token_embd.weight");
  const GgufTensor& router = *f.find_tensor("blk.0.ffn_gate_inp.weight");
  const GgufTensor& norm = *f.find_tensor(arch == "qwen3moe" ? "blk.0.ffn_norm.weight"
                                                              : "blk.0.post_attention_norm.weight");
  const std::vector<float> e = tensor_values(emb), r = tensor_values(router), w = tensor_values(norm);
  const size_t E = size_t(emb.ne[0]), V = size_t(emb.ne[1]), X = size_t(router.ne[1]);
  const size_t K = *f.get_u32(arch + ".expert_used_count");
  std::vector<double> count(X, 0.0);
  std::vector<float> x(E), logits(X);
  for (size_t t = 0; t < V; ++t) {
    double ss = 0;
    for (size_t i = 0; i < E; ++i) ss += double(e[t * E + i]) * e[t * E + i];
    const float scale = float(1.0 / std::sqrt(ss / double(E) + 1e-6));
    for (size_t i = 0; i < E; ++i) x[i] = e[t * E + i] * scale * w[i];
    for (size_t k = 0; k < X; ++k) {
      double dot = 0;
      for (size_t i = 0; i < E; ++i) dot += double(r[k * E + i]) * x[i];
      logits[k] = float(dot);
    }
    std::vector<size_t> idx(X);
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + long(K), idx.end(),
                      [&](size_t a, size_t b) { return logits[a] > logits[b]; });
    for (size_t k = 0; k < K; ++k) count[idx[k]] += 1.0;
  }
  for (double& c : count) c /= double(V * K);
  std::sort(count.rbegin(), count.rend());
  return count;  // shares of all selections, most popular first
}

TEST(SynthRouterSkew, SkewConcentratesExpertChoices) {
  for (SynthArch arch : {SynthArch::QWEN3MOE, SynthArch::QWEN35MOE}) {
    for (SynthTypeMix mix : {SynthTypeMix::F32, SynthTypeMix::Q4_K_M}) {
      const std::string name(synth_arch_name(arch));
      const std::string flat = scratch_file("skew0.gguf"), skewed = scratch_file("skew4.gguf");
      write_model({.arch = arch, .types = mix, .seed = 5, .router_skew = 0.0f}, flat);
      write_model({.arch = arch, .types = mix, .seed = 5, .router_skew = 4.0f}, skewed);
      Result<GgufFile> f0 = GgufFile::open(flat), f4 = GgufFile::open(skewed);
      ASSERT_TRUE(f0.is_ok() && f4.is_ok());
      const std::vector<double> s0 = expert_shares(*f0, name), s4 = expert_shares(*f4, name);
      // 6 experts, top-2: a uniform router gives each expert 1/6 of the selections.
      EXPECT_LT(s0[0], 0.30) << name;
      // Skew 4: the most popular expert wins nearly every token (share near 1/K = 0.5), and the two most
      // popular together take most of the traffic.
      EXPECT_GT(s4[0], 0.45) << name;
      EXPECT_GT(s4[0] + s4[1], 0.75) << name;
      EXPECT_LT(s4.back(), 0.05) << name;
      std::printf("%s %s: top expert share %.3f (skew 0) -> %.3f (skew 4); top two %.3f -> %.3f\n", name.c_str(),
                  std::string(synth_type_mix_name(mix)).c_str(), s0[0], s4[0], s0[0] + s0[1], s4[0] + s4[1]);
    }
  }
}

}  // namespace
}  // namespace essaim
