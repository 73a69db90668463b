// The MTP (nextn) block and speculative decoding (docs/speculative.md):
// - the block's logits against a direct computation of its formulas in double precision from the F32 weights
//   of a synth file (models/train/model.py's mtp_logits: eh_proj over [enorm(embedding of token i+1) |
//   hnorm(final normed state of i)], the gated attention on its own positions, the MoE with the shared
//   expert, shared_head_norm and the LM head);
// - the stream of speculative decoding == plain decoding token for token, greedy and seeded sampling,
//   K = 1..4, on a synth model (drafts nearly always rejected) and on the trained model (drafts accepted);
// - after every round the main cache is bit-identical (memcmp of KV and recurrent states) to the cache of
//   plain decoding at the same length, rejected drafts included.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>
#include <variant>

#include "core/thread_pool.h"
#include "model/speculative.h"
#include "model_test_util.h"
#include "moe/executor.h"
#include "synth/synth.h"
#include "text/sampler.h"

namespace essaim {
namespace {

std::string synth_mtp(const std::string& name, SynthTypeMix types, uint64_t seed) {
  SynthOptions o;
  o.arch = SynthArch::QWEN35MOE;
  o.preset = SynthPreset::TINY;
  o.types = types;
  o.seed = seed;
  o.nextn = 1;
  const std::string path = std::string(ESSAIM_BINARY_DIR) + "/" + name + ".gguf";
  Result<SynthPlan> plan = synth_plan(o);
  EXPECT_TRUE(plan.is_ok()) << plan.status().message();
  if (plan) {
    EXPECT_TRUE(synth_write(*plan, path).is_ok());
  }
  return path;
}

std::string trained_model() { return std::string(ESSAIM_SOURCE_DIR) + "/models/kjv-moe-q4_k_m.gguf"; }

// ---------------------------------------------------------------------------------------------------------
// The formulas, in double, from F32 tensors (GGUF: ne[0] is the contiguous input dimension).

struct Ref {
  const GgufFile& f;
  int64_t E, V, H, Hkv, D, n_rot, X, K, Fe, Fs;
  double eps, base;
  int il;

  const float* t(const std::string& name) const {
    const GgufTensor* x = f.find_tensor(name);
    EXPECT_TRUE(x && x->type == GgmlType::F32) << name;
    return reinterpret_cast<const float*>(x->data);
  }
  const float* b(const std::string& what) const { return t("blk." + std::to_string(il) + "." + what + ".weight"); }
  // y[o] = Σ_i W[o][i]·x[i], W [out][in]
  static std::vector<double> mv(const float* W, const std::vector<double>& x, int64_t out) {
    std::vector<double> y(size_t(out), 0.0);
    for (int64_t o = 0; o < out; ++o)
      for (size_t i = 0; i < x.size(); ++i) y[size_t(o)] += double(W[o * int64_t(x.size()) + int64_t(i)]) * x[i];
    return y;
  }
  std::vector<double> norm(const std::vector<double>& x, const float* w) const {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double r = 1.0 / std::sqrt(ss / double(x.size()) + eps);
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * r * w[i];
    return y;
  }
  static double silu(double v) { return v / (1 + std::exp(-v)); }
  static double sigm(double v) { return 1 / (1 + std::exp(-v)); }
  void rope(double* v, int64_t pos) const {  // NEOX on n_rot dims (the tiny sections map every pair to t/h/w)
    const int64_t half = n_rot / 2;
    for (int64_t i = 0; i < half; ++i) {
      const double a = double(pos) * std::pow(base, -2.0 * double(i) / double(n_rot));
      const double x0 = v[i], x1 = v[i + half];
      v[i] = x0 * std::cos(a) - x1 * std::sin(a);
      v[i + half] = x0 * std::sin(a) + x1 * std::cos(a);
    }
  }
  // Gated attention over positions 0..T-1 of a (each [E]); returns the output rows.
  std::vector<std::vector<double>> attention(const std::vector<std::vector<double>>& a) const {
    const size_t T = a.size();
    std::vector<std::vector<double>> q(T), g(T), k(T), v(T), y(T);
    for (size_t p = 0; p < T; ++p) {
      const std::vector<double> qg = mv(b("attn_q"), a[p], 2 * H * D);
      k[p] = mv(b("attn_k"), a[p], Hkv * D);
      v[p] = mv(b("attn_v"), a[p], Hkv * D);
      for (int64_t h = 0; h < H; ++h) {
        std::vector<double> qh(qg.begin() + h * 2 * D, qg.begin() + h * 2 * D + D);
        qh = norm(qh, b("attn_q_norm"));
        rope(qh.data(), int64_t(p));
        q[p].insert(q[p].end(), qh.begin(), qh.end());
        g[p].insert(g[p].end(), qg.begin() + h * 2 * D + D, qg.begin() + (h + 1) * 2 * D);
      }
      for (int64_t h = 0; h < Hkv; ++h) {
        std::vector<double> kh(k[p].begin() + h * D, k[p].begin() + (h + 1) * D);
        kh = norm(kh, b("attn_k_norm"));
        rope(kh.data(), int64_t(p));
        std::copy(kh.begin(), kh.end(), k[p].begin() + h * D);
      }
    }
    for (size_t p = 0; p < T; ++p) {
      std::vector<double> o(static_cast<size_t>(H * D), 0.0);
      for (int64_t h = 0; h < H; ++h) {
        const int64_t kv = h / (H / Hkv);
        std::vector<double> s(p + 1);
        double mx = -1e300, sum = 0;
        for (size_t j = 0; j <= p; ++j) {
          double d = 0;
          for (int64_t c = 0; c < D; ++c) d += q[p][size_t(h * D + c)] * k[j][size_t(kv * D + c)];
          s[j] = d / std::sqrt(double(D));
          mx = std::max(mx, s[j]);
        }
        for (double& x : s) sum += (x = std::exp(x - mx));
        for (size_t j = 0; j <= p; ++j)
          for (int64_t c = 0; c < D; ++c) o[size_t(h * D + c)] += s[j] / sum * v[j][size_t(kv * D + c)];
      }
      for (size_t i = 0; i < o.size(); ++i) o[i] *= sigm(g[p][i]);
      y[p] = mv(b("attn_output"), o, E);
    }
    return y;
  }
  std::vector<double> moe(const std::vector<double>& f) const {
    const std::vector<double> r = mv(b("ffn_gate_inp"), f, X);
    std::vector<double> p(static_cast<size_t>(X));
    const double mx = *std::max_element(r.begin(), r.end());
    double sum = 0;
    for (int64_t e = 0; e < X; ++e) sum += (p[size_t(e)] = std::exp(r[size_t(e)] - mx));
    std::vector<int64_t> ids(static_cast<size_t>(X));
    for (int64_t e = 0; e < X; ++e) ids[size_t(e)] = e, p[size_t(e)] /= sum;
    std::stable_sort(ids.begin(), ids.end(), [&](int64_t a, int64_t c) { return p[size_t(a)] > p[size_t(c)]; });
    double wsum = 0;
    for (int64_t s = 0; s < K; ++s) wsum += p[size_t(ids[size_t(s)])];
    std::vector<double> out(static_cast<size_t>(E), 0.0);
    for (int64_t s = 0; s < K; ++s) {
      const int64_t e = ids[size_t(s)];
      const std::vector<double> gt = mv(b("ffn_gate_exps") + e * Fe * E, f, Fe), up = mv(b("ffn_up_exps") + e * Fe * E, f, Fe);
      std::vector<double> h(static_cast<size_t>(Fe));
      for (int64_t i = 0; i < Fe; ++i) h[size_t(i)] = silu(gt[size_t(i)]) * up[size_t(i)];
      const std::vector<double> y = mv(b("ffn_down_exps") + e * E * Fe, h, E);
      for (int64_t i = 0; i < E; ++i) out[size_t(i)] += p[size_t(e)] / wsum * y[size_t(i)];
    }
    const std::vector<double> gs = mv(b("ffn_gate_shexp"), f, Fs), us = mv(b("ffn_up_shexp"), f, Fs);
    std::vector<double> h(static_cast<size_t>(Fs));
    for (int64_t i = 0; i < Fs; ++i) h[size_t(i)] = silu(gs[size_t(i)]) * us[size_t(i)];
    const std::vector<double> sh = mv(b("ffn_down_shexp"), h, E);
    double gd = 0;
    for (int64_t i = 0; i < E; ++i) gd += double(b("ffn_gate_inp_shexp")[i]) * f[size_t(i)];
    for (int64_t i = 0; i < E; ++i) out[size_t(i)] += sigm(gd) * sh[size_t(i)];
    return out;
  }
  // Logits of the last position: hidden [T][E] (main stack, after output_norm), next_tokens [T].
  std::vector<double> mtp_logits(const std::vector<float>& hidden, const std::vector<int32_t>& next_tokens) const {
    const size_t T = next_tokens.size();
    std::vector<std::vector<double>> x(T), a(T);
    for (size_t p = 0; p < T; ++p) {
      const float* emb = t("token_embd.weight") + int64_t(next_tokens[p]) * E;
      std::vector<double> e(emb, emb + E), h(hidden.begin() + int64_t(p) * E, hidden.begin() + int64_t(p + 1) * E);
      e = norm(e, b("nextn.enorm"));
      h = norm(h, b("nextn.hnorm"));
      e.insert(e.end(), h.begin(), h.end());  // [enorm(e) | hnorm(h)]
      x[p] = mv(b("nextn.eh_proj"), e, E);
      a[p] = norm(x[p], b("attn_norm"));
    }
    const std::vector<std::vector<double>> att = attention(a);
    for (size_t p = 0; p < T; ++p)
      for (int64_t i = 0; i < E; ++i) x[p][size_t(i)] += att[p][size_t(i)];
    std::vector<double> last = x[T - 1];
    const std::vector<double> r = moe(norm(last, b("post_attention_norm")));
    for (int64_t i = 0; i < E; ++i) last[size_t(i)] += r[size_t(i)];
    const GgufTensor* out = f.find_tensor("output.weight");
    return mv(out ? reinterpret_cast<const float*>(out->data) : t("token_embd.weight"),
              norm(last, b("nextn.shared_head_norm")), V);
  }
};

TEST(Nextn, LogitsEqualTheFormulasWithF32Weights) {
  const std::string path = synth_mtp("spec_mtp_f32", SynthTypeMix::F32, 11);
  std::unique_ptr<Model> m = test::load_or_die(path);
  ASSERT_TRUE(m && m->has_nextn());
  const ModelInfo& info = m->info();
  EXPECT_FALSE(m->expert_store().ranges(info.n_layer).empty());  // its experts are served like any layer's
  ThreadPool pool(2);
  LocalExpertExecutor local(m->expert_store(), &pool);
  const std::vector<int32_t> prompt = {9, 120, 33, 7, 250, 101, 64, 18, 200};
  const size_t T = prompt.size(), E = size_t(info.n_embd), V = size_t(info.n_vocab);
  SequenceCache cache = m->new_cache({.kv_type = KvType::F32});
  std::vector<float> logits(T * V), hidden(T * E);
  const BatchItem item{.tokens = prompt, .cache = &cache, .logits_mode = LogitsMode::ALL, .logits = logits,
                       .hidden = hidden};
  ASSERT_TRUE(m->forward_batch({.items = std::span(&item, 1), .experts = &local, .pool = &pool}).is_ok());
  // hidden is the LM head's input: its product with the head gives the logits.
  const float* W = reinterpret_cast<const float*>(m->file().find_tensor("output.weight")
                                                      ? m->file().find_tensor("output.weight")->data
                                                      : m->file().find_tensor("token_embd.weight")->data);
  for (size_t v : {size_t(0), size_t(17), V - 1}) {
    double d = 0;
    for (size_t i = 0; i < E; ++i) d += double(W[v * E + i]) * hidden[(T - 1) * E + i];
    EXPECT_NEAR(d, logits[(T - 1) * V + v], 1e-3 * (1 + std::abs(d)));
  }

  const Ref ref{.f = m->file(), .E = int64_t(E), .V = int64_t(V), .H = 4, .Hkv = 2, .D = 64, .n_rot = 16,
                .X = info.n_expert, .K = info.n_expert_used, .Fe = 256, .Fs = 256, .eps = 1e-6, .base = 1e7,
                .il = info.n_layer};
  std::vector<int32_t> next(prompt.begin() + 1, prompt.end());
  next.push_back(42);
  // In one call, and in two (the block's KV cache carried between them): the same bits, near the formulas.
  std::vector<float> got(V), got2(V), tail_hidden(E);
  SequenceCache nc = m->new_nextn_cache({.kv_type = KvType::F32});
  const NextnItem all{.hidden = hidden, .tokens = next, .cache = &nc, .logits = got, .hidden_out = tail_hidden};
  ASSERT_TRUE(m->forward_nextn_batch({.items = std::span(&all, 1), .experts = &local, .pool = &pool}).is_ok());
  EXPECT_EQ(nc.n_past(), int32_t(T));
  SequenceCache nc2 = m->new_nextn_cache({.kv_type = KvType::F32});
  for (size_t split : {size_t(5), T - 5}) {
    const size_t at = split == 5 ? 0 : 5;
    const NextnItem part{.hidden = std::span<const float>(hidden).subspan(at * E, split * E),
                         .tokens = std::span<const int32_t>(next).subspan(at, split), .cache = &nc2, .logits = got2};
    ASSERT_TRUE(m->forward_nextn_batch({.items = std::span(&part, 1), .experts = &local, .pool = &pool}).is_ok());
  }
  EXPECT_EQ(std::memcmp(got.data(), got2.data(), V * sizeof(float)), 0);

  const std::vector<double> want = ref.mtp_logits(hidden, next);
  double scale = 0, worst = 0;
  for (size_t v = 0; v < V; ++v) scale = std::max(scale, std::abs(want[v]));
  for (size_t v = 0; v < V; ++v) worst = std::max(worst, std::abs(double(got[v]) - want[v]));
  EXPECT_GT(scale, 0.1);
  EXPECT_LT(worst, 2e-4 * scale) << "max |Δ| " << worst << " of max |logit| " << scale;
  EXPECT_EQ(std::max_element(got.begin(), got.end()) - got.begin(),
            std::max_element(want.begin(), want.end()) - want.begin());
  std::remove(path.c_str());
}

// ---------------------------------------------------------------------------------------------------------
// Speculative == plain

struct Decoded {
  std::vector<int32_t> tokens;
  SpecStats stats;
};

SamplerParams sampling(bool greedy) {
  SamplerParams p;
  p.temperature = greedy ? 0.0f : 0.8f;
  p.seed = 7;
  return p;
}

// Plain decoding: the prompt, then one token per forward.
std::vector<int32_t> plain(const Model& m, ExpertExecutor& ex, ThreadPool& pool, const std::vector<int32_t>& prompt,
                           int n, bool greedy) {
  SequenceCache cache = m.new_cache({});
  Sampler sampler(sampling(greedy));
  for (int32_t t : prompt) sampler.accept(t);
  std::vector<float> logits(size_t(m.info().n_vocab));
  EXPECT_TRUE(m.forward({.tokens = prompt, .cache = &cache, .experts = &ex, .pool = &pool,
                         .logits_mode = LogitsMode::LAST, .logits = logits}).is_ok());
  std::vector<int32_t> out;
  while (int(out.size()) < n) {
    const int32_t id = sampler.sample(logits);
    sampler.accept(id);
    out.push_back(id);
    EXPECT_TRUE(m.forward({.tokens = std::span(&out.back(), 1), .cache = &cache, .experts = &ex, .pool = &pool,
                           .logits_mode = LogitsMode::LAST, .logits = logits}).is_ok());
  }
  return out;
}

// Every KV entry and recurrent state of the same length, compared bit for bit.
bool same_cache(const SequenceCache& a, const SequenceCache& b) {
  if (a.n_past() != b.n_past() || a.n_layers() != b.n_layers()) return false;
  for (int32_t il = 0; il < a.n_layers(); ++il) {
    if (const auto* ra = std::get_if<RecurrentState>(&a.layer(il))) {
      const auto& rb = std::get<RecurrentState>(b.layer(il));
      if (ra->conv != rb.conv || std::memcmp(ra->state.data(), rb.state.data(), ra->state.size() * 4) != 0) return false;
    } else if (const auto* ka = std::get_if<KvCache>(&a.layer(il))) {
      const KvCache& kb = std::get<KvCache>(b.layer(il));
      if (ka->size() != a.n_past() || kb.size() != b.n_past()) return false;
      std::vector<float> x(size_t(a.n_past()) * size_t(ka->head_dim())), y(x.size());
      for (int32_t g = 0; g < ka->n_kv_heads(); ++g) {
        ka->load_k(g, 0, a.n_past(), x.data()), kb.load_k(g, 0, b.n_past(), y.data());
        if (std::memcmp(x.data(), y.data(), x.size() * 4) != 0) return false;
        ka->load_v(g, 0, a.n_past(), x.data()), kb.load_v(g, 0, b.n_past(), y.data());
        if (std::memcmp(x.data(), y.data(), x.size() * 4) != 0) return false;
      }
    }
  }
  return true;
}

// Speculative decoding with K drafts; after every round the main cache is compared with a plain cache fed
// the same tokens one by one.
Decoded speculative(const Model& m, ExpertExecutor& ex, ThreadPool& pool, const std::vector<int32_t>& prompt, int n,
                    bool greedy, SpecOptions o) {
  SpecSequence seq(m, {}, o);
  Sampler sampler(sampling(greedy));
  for (int32_t t : prompt) sampler.accept(t);
  const size_t E = size_t(m.info().n_embd), V = size_t(m.info().n_vocab);
  std::vector<float> logits(V), hidden(prompt.size() * E);
  const BatchItem first{.tokens = prompt, .cache = &seq.cache(), .logits = logits, .hidden = hidden};
  EXPECT_TRUE(m.forward_batch({.items = std::span(&first, 1), .experts = &ex, .pool = &pool}).is_ok());
  const auto sample = [&](std::span<const float> l) {
    const int32_t id = sampler.sample(l);
    sampler.accept(id);
    return id;
  };
  Decoded d;
  d.tokens.push_back(sample(logits));
  seq.start(prompt, hidden, d.tokens[0]);
  SequenceCache check = m.new_cache({});
  EXPECT_TRUE(m.forward({.tokens = prompt, .cache = &check, .experts = &ex, .pool = &pool,
                         .logits_mode = LogitsMode::NONE}).is_ok());
  size_t fed = 0;  // stream tokens fed to `check`
  while (int(d.tokens.size()) < n) {
    SpecSequence* one[] = {&seq};
    EXPECT_TRUE(spec_draft(m, one, &ex, &pool).is_ok());
    const BatchItem item = seq.verify_item();
    EXPECT_TRUE(m.forward_batch({.items = std::span(&item, 1), .experts = &ex, .pool = &pool}).is_ok());
    for (int32_t t : seq.accept(sample)) d.tokens.push_back(t);
    for (; fed + 1 < d.tokens.size(); ++fed)
      EXPECT_TRUE(m.forward({.tokens = std::span(&d.tokens[fed], 1), .cache = &check, .experts = &ex, .pool = &pool,
                             .logits_mode = LogitsMode::NONE}).is_ok());
    EXPECT_TRUE(same_cache(seq.cache(), check)) << "after " << d.tokens.size() << " tokens";
  }
  d.tokens.resize(size_t(n));
  d.stats = seq.stats();
  return d;
}

void expect_stream_unchanged(const std::string& path, int n, bool expect_accepts) {
  std::unique_ptr<Model> m = test::load_or_die(path);
  ASSERT_TRUE(m && m->has_nextn());
  ThreadPool pool(2);
  LocalExpertExecutor local(m->expert_store(), &pool);
  const std::vector<int32_t> prompt = {9, 120, 33, 7, 250, 101, 64, 18};
  for (bool greedy : {true, false}) {
    const std::vector<int32_t> want = plain(*m, local, pool, prompt, n, greedy);
    EXPECT_GT(std::set<int32_t>(want.begin(), want.end()).size(), 3u);  // a stream that varies
    for (int32_t k = 1; k <= 4; ++k) {
      const Decoded got = speculative(*m, local, pool, prompt, n, greedy, {.draft_max = k});
      EXPECT_EQ(got.tokens, want) << (greedy ? "greedy" : "sampled") << " K=" << k;
      EXPECT_EQ(got.stats.drafted, got.stats.rounds * k) << "K=" << k;  // never short of room here
      if (expect_accepts && greedy) EXPECT_GT(got.stats.accepted, 0) << "K=" << k;
      EXPECT_LT(got.stats.rounds, int64_t(n));
    }
    const Decoded adaptive = speculative(*m, local, pool, prompt, n, greedy, {.draft_max = 4, .draft_min = 1,
                                                                              .adaptive = true});
    EXPECT_EQ(adaptive.tokens, want) << "adaptive";
  }
}

TEST(Speculative, SynthStreamAndCachesEqualPlainDecoding) {
  const std::string path = synth_mtp("spec_mtp_q4", SynthTypeMix::Q4_K_M, 3);
  expect_stream_unchanged(path, 24, false);
  std::remove(path.c_str());
}

TEST(Speculative, TrainedModelStreamAndCachesEqualPlainDecoding) {
  ASSERT_TRUE(std::filesystem::exists(trained_model())) << trained_model();
  expect_stream_unchanged(trained_model(), 40, true);
}

TEST(Speculative, ModelWithoutNextnDraftsNothing) {
  const std::string path = std::string(ESSAIM_BINARY_DIR) + "/spec_no_mtp.gguf";
  SynthOptions o;
  o.arch = SynthArch::QWEN35MOE;
  o.preset = SynthPreset::TINY;
  o.types = SynthTypeMix::F32;
  Result<SynthPlan> plan = synth_plan(o);
  ASSERT_TRUE(plan.is_ok() && synth_write(*plan, path).is_ok());
  std::unique_ptr<Model> m = test::load_or_die(path);
  ASSERT_TRUE(m);
  EXPECT_FALSE(m->has_nextn());
  SpecSequence seq(*m, {}, {.draft_max = 3});
  EXPECT_EQ(seq.draft_count(), 0);
  SequenceCache c = m->new_nextn_cache({});
  std::vector<float> h(size_t(m->info().n_embd)), l(size_t(m->info().n_vocab));
  const int32_t tok = 1;
  const NextnItem item{.hidden = h, .tokens = std::span(&tok, 1), .cache = &c, .logits = l};
  ThreadPool pool(1);
  LocalExpertExecutor local(m->expert_store(), &pool);
  const Status s = m->forward_nextn_batch({.items = std::span(&item, 1), .experts = &local, .pool = &pool});
  EXPECT_NE(s.message().find("no MTP (nextn) block"), std::string::npos) << s.message();
  std::remove(path.c_str());
}

}  // namespace
}  // namespace essaim
