#include "model/gated_deltanet.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/status.h"
#include "kernels/kernel_traits.h"
#include "model/ops.h"
#include "moe/numerics.h"

namespace essaim {
namespace {

// State columns per work item: 16 columns of Dk = 128 floats are 8 KiB, resident in L1 for the whole run.
constexpr int64_t kColumnBlock = 16;

// Same element-wise IEEE lanes as ops.cpp's dot_f32 (GCC/Clang vector extension; no FMA under
// -ffp-contract=off), so the dot products below reduce exactly in dot_f32's documented order.
typedef float v8f __attribute__((vector_size(32)));

// Vectors never cross a function boundary (no AVX calling convention is assumed): loads and stores are
// memcpys in the loop bodies.
#define ESSAIM_LOAD8(v, p) __builtin_memcpy(&(v), (p), sizeof(v8f))
#define ESSAIM_STORE8(p, v) __builtin_memcpy((p), &(v), sizeof(v8f))
inline float reduce8(const float lane[8]) {
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

// softplus as llama.cpp's ggml_softplus: the identity above 20, ln(1 + e^x) below (docs/reference.md 4.3).
inline float softplus(float x) { return x > 20.0f ? x : std::log(1.0f + std::exp(x)); }

// One token's update of kCols adjacent state columns (column r at s + r·n, n = Dk), docs/reference.md 5.6:
//   s ← decay·s;  δ = (v_r − s·k)·β;  s ← s + k·δ;  out[r] = (s·q)·scale.
// Both dot products follow dot_f32's order (lane l sums indices ≡ l mod 8 in index order, then the fixed
// pairwise fold), each product and sum rounded separately. Every column's operations are the same
// whatever kCols is; several columns share the k and q loads and interleave their chains of dependent
// adds (one column's chain bounded the speed).
template <int kTag, int kCols>
__attribute__((always_inline)) inline void delta_rule_columns(float* s, const float* k, const float* q, float decay,
                                                              const float* v, float beta, float scale, int64_t n,
                                                              float* out) {
  const int64_t n8 = n - n % 8;
  v8f acc[kCols];
#pragma GCC unroll 8
  for (int r = 0; r < kCols; ++r) acc[r] = v8f{0, 0, 0, 0, 0, 0, 0, 0};
  const v8f vd = {decay, decay, decay, decay, decay, decay, decay, decay};
  for (int64_t i = 0; i < n8; i += 8) {
    v8f kv;
    ESSAIM_LOAD8(kv, k + i);
#pragma GCC unroll 8
    for (int r = 0; r < kCols; ++r) {
      v8f sv;
      ESSAIM_LOAD8(sv, s + r * n + i);
      sv = sv * vd;
      ESSAIM_STORE8(s + r * n + i, sv);
      acc[r] = acc[r] + sv * kv;
    }
  }
  float delta[kCols];
#pragma GCC unroll 8
  for (int r = 0; r < kCols; ++r) {
    float lane[8];
    __builtin_memcpy(lane, &acc[r], sizeof(lane));
    float* sr = s + r * n;
    for (int64_t i = n8, l = 0; i < n; ++i, ++l) {
      sr[i] = sr[i] * decay;
      lane[l] = lane[l] + sr[i] * k[i];
    }
    delta[r] = (v[r] - reduce8(lane)) * beta;
    acc[r] = v8f{0, 0, 0, 0, 0, 0, 0, 0};
  }
  for (int64_t i = 0; i < n8; i += 8) {
    v8f kv, qv;
    ESSAIM_LOAD8(kv, k + i);
    ESSAIM_LOAD8(qv, q + i);
#pragma GCC unroll 8
    for (int r = 0; r < kCols; ++r) {
      const v8f vdelta = {delta[r], delta[r], delta[r], delta[r], delta[r], delta[r], delta[r], delta[r]};
      v8f sv;
      ESSAIM_LOAD8(sv, s + r * n + i);
      sv = sv + kv * vdelta;
      ESSAIM_STORE8(s + r * n + i, sv);
      acc[r] = acc[r] + sv * qv;
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < kCols; ++r) {
    float lane[8];
    __builtin_memcpy(lane, &acc[r], sizeof(lane));
    float* sr = s + r * n;
    for (int64_t i = n8, l = 0; i < n; ++i, ++l) {
      sr[i] = sr[i] + k[i] * delta[r];
      lane[l] = lane[l] + sr[i] * q[i];
    }
    out[r] = reduce8(lane) * scale;
  }
}

// L2norm(x) = x · 1/max(sqrtf(f32(Σ x²)), eps): squares in f32, summed in f64 (llama.cpp's ggml_l2_norm).
void l2_normalize(float* x, int64_t n, float eps) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += double(x[i] * x[i]);
  const float scale = 1.0f / std::max(std::sqrt(float(sum)), eps);
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] * scale;
}

// Row r of a sequence's conv window [conv_in rows 0..Kc-2 | its mix rows 0..T-1], oldest first.
// mix: [N][C] raw projections of the batch.
inline const float* window_row(const GdnSequence& q, const float* mix, int64_t C, int64_t Kc, int64_t r) {
  return r < Kc - 1 ? q.io.conv_in + r * C : mix + (q.row0 + r - (Kc - 1)) * C;
}

// Causal depthwise conv + SiLU of channels [c0, c1) over sequence q's window [its previous Kc-1 raw rows |
// its rows of this step], into u [N][C]; then the channels' part of the next window into q.io.conv_out.
void conv_silu_channels(const GdnShape& s, const float* conv1d, const float* mix, const GdnSequence& q, int64_t c0,
                        int64_t c1, float* u) {
  const int64_t C = s.conv_channels(), Kc = s.conv_kernel;
  for (int64_t local = 0; local < q.n_rows; ++local) {  // the token's index within its sequence's rows
    float* ut = u + (q.row0 + local) * C;
    for (int64_t c = c0; c < c1; ++c) {
      const float* taps = conv1d + c * Kc;
      float sum = 0.0f;
      for (int64_t j = 0; j < Kc; ++j) sum = sum + taps[j] * window_row(q, mix, C, Kc, local + j)[c];  // tap 0 = oldest
      ut[c] = silu(sum);
    }
  }
  if (q.io.conv_rows)  // the window after each row: window rows local+1 .. local+Kc-1
    for (int64_t local = 0; local < q.n_rows; ++local)
      for (int64_t r = 0; r < Kc - 1; ++r)
        std::memcpy(q.io.conv_rows + (local * (Kc - 1) + r) * C + c0, window_row(q, mix, C, Kc, local + 1 + r) + c0,
                    size_t(c1 - c0) * sizeof(float));
  // The newest Kc-1 raw rows become the next window. Row r comes from window row T + r > r, so ascending
  // order never overwrites a row still to be read when conv_out is conv_in; other items touch other channels.
  for (int64_t r = 0; r < Kc - 1; ++r)
    std::memmove(q.io.conv_out + r * C + c0, window_row(q, mix, C, Kc, q.n_rows + r) + c0,
                 size_t(c1 - c0) * sizeof(float));
}

// One run of the gated delta rule (u [N][C] normalised q, k and v; decay / beta [N][Hv]; o [N][Hv][Dv]):
// the rows [t0, t1) of one sequence over a block of state columns [c0, c1) of head h, each column through
// the sequence's tokens in order. The model library is compiled for baseline x86-64, where each v8f operation is two SSE
// instructions; the AVX2 clone does it in one. Both perform the same IEEE operations on the same lanes in
// the same order (-ffp-contract=off holds for every clone; "avx2" alone enables no FMA), so they give the
// same bits.
struct DeltaRuleRun {
  const float *u, *decay, *beta;
  int64_t t0, t1, C, KD, Dk, Dv, Hv, h, j, c0, c1;
  float scale;
  float* st;
  float* o;
  float* rows;        // the block's place in the state after row t0 (stride row_stride), or nullptr
  int64_t row_stride;
};

template <int kTag>
__attribute__((always_inline)) inline void delta_rule_run(const DeltaRuleRun& r) {
  for (int64_t t = r.t0; t < r.t1; ++t) {
    const float* q = r.u + t * r.C + r.j * r.Dk;
    const float* k = r.u + t * r.C + r.KD + r.j * r.Dk;
    const float* v = r.u + t * r.C + 2 * r.KD + r.h * r.Dv;
    const float dec = r.decay[t * r.Hv + r.h], bt = r.beta[t * r.Hv + r.h];
    float* ot = r.o + (t * r.Hv + r.h) * r.Dv;
    int64_t c = r.c0;
    for (; c + 8 <= r.c1; c += 8)
      delta_rule_columns<kTag, 8>(r.st + (c - r.c0) * r.Dk, k, q, dec, v + c, bt, r.scale, r.Dk, ot + c);
    for (; c < r.c1; ++c)
      delta_rule_columns<kTag, 1>(r.st + (c - r.c0) * r.Dk, k, q, dec, v + c, bt, r.scale, r.Dk, ot + c);
    if (r.rows) std::memcpy(r.rows + (t - r.t0) * r.row_stride, r.st, size_t((r.c1 - r.c0) * r.Dk) * sizeof(float));
  }
}

void delta_rule_run_baseline(const DeltaRuleRun& r) { delta_rule_run<0>(r); }
#if defined(__x86_64__)
__attribute__((target("avx2"))) void delta_rule_run_avx2(const DeltaRuleRun& r) { delta_rule_run<1>(r); }
#else
void delta_rule_run_avx2(const DeltaRuleRun& r) { delta_rule_run<0>(r); }
#endif

// The delta rule's form for the kernels' ISA (kernels_isa(): ESSAIM_ISA or the best the CPU has): the AVX2
// clone from AVX2 on, else the baseline; both give the same bits (GatedDeltaNet.EveryIsaGivesTheSameBits).
// (An AVX-512 form with two state columns per zmm gave the same bits and no measurable speed: the step is
// not bound by its vector arithmetic; docs/engine.md, "Recurrent states advanced in place".)
using DeltaRuleRunFn = void (*)(const DeltaRuleRun&);
DeltaRuleRunFn delta_rule_for_isa() {
  const Isa isa = kernels_isa();
  return isa == Isa::AVX2 || isa == Isa::AVX512 ? delta_rule_run_avx2 : delta_rule_run_baseline;
}

// Everything after the input projections, for each sequence and each key head j as one work item: the conv,
// SiLU and L2 norms of the channels head j's work reads (q_j, k_j, and v of the value heads h ≡ j mod Hk,
// docs/reference.md 10.15's tiled mapping), the delta rule of those value heads over the sequence's rows
// (block of kColumnBlock state columns after block), and their gated RMSNorm: RMSNorm(o_h, ssm_norm) ⊙
// silu(z_h). One task set per layer, no step of it serial; each element is computed by the same operations
// in the same order whatever thread runs its item.
void recurrent_heads(const GdnShape& s, const GdnWeights& w, const float* mix, const float* z, const float* decay,
                     const float* beta, std::span<const GdnSequence> seqs, float* u, float* o, ThreadPool* pool) {
  const int64_t C = s.conv_channels(), KD = s.key_dim(), Dk = s.head_dim, Dv = s.head_dim;
  const int64_t Hv = s.n_v_heads, Hk = s.n_k_heads;
  const float scale = 1.0f / std::sqrt(float(Dv));
  const DeltaRuleRunFn delta_rule = delta_rule_for_isa();
  parallel_for(pool, seqs.size() * size_t(Hk), [&](size_t b, size_t e) {
    for (size_t item = b; item < e; ++item) {
      const GdnSequence& sq = seqs[item / size_t(Hk)];
      const int64_t j = int64_t(item % size_t(Hk));
      conv_silu_channels(s, w.conv1d, mix, sq, j * Dk, (j + 1) * Dk, u);            // q_j
      conv_silu_channels(s, w.conv1d, mix, sq, KD + j * Dk, KD + (j + 1) * Dk, u);  // k_j
      for (int64_t t = sq.row0; t < sq.row0 + sq.n_rows; ++t) {
        l2_normalize(u + t * C + j * Dk, Dk, s.eps);
        l2_normalize(u + t * C + KD + j * Dk, Dk, s.eps);
      }
      for (int64_t h = j; h < Hv; h += Hk) {
        conv_silu_channels(s, w.conv1d, mix, sq, 2 * KD + h * Dv, 2 * KD + (h + 1) * Dv, u);  // v_h
        for (int64_t c0 = 0; c0 < Dv; c0 += kColumnBlock) {
          const int64_t c1 = std::min(c0 + kColumnBlock, Dv);
          const size_t first = size_t((h * Dv + c0) * Dk), n = size_t((c1 - c0) * Dk);
          // The block of state columns ([columns][Dk], contiguous) is advanced in place in state_out: one
          // copy per step instead of a copy into scratch and one back (a decode step otherwise moves each
          // layer's state three times; the same operations run on the same values), and none when state_out
          // is state_in (the caller keeps no old state: each block is read once and written back once).
          float* st = sq.io.state_out + first;
          if (st != sq.io.state_in + first) std::memmove(st, sq.io.state_in + first, n * sizeof(float));
          float* rows = sq.io.state_rows ? sq.io.state_rows + first : nullptr;
          const DeltaRuleRun run{u,     decay, beta, sq.row0, sq.row0 + sq.n_rows, C,    KD,
                                 Dk,    Dv,    Hv,   h,       j,                   c0,   c1,
                                 scale, st,    o,    rows,    int64_t(s.recurrent_state_size())};
          delta_rule(run);
        }
        for (int64_t t = sq.row0; t < sq.row0 + sq.n_rows; ++t) {
          float* oh = o + (t * Hv + h) * Dv;
          const float* zh = z + (t * Hv + h) * Dv;
          rms_norm(oh, w.norm, Dv, s.eps, oh);
          for (int64_t c = 0; c < Dv; ++c) oh[c] = oh[c] * silu(zh[c]);
        }
      }
    }
  });
}

void check_step(const GdnShape& s, int64_t N, std::span<const GdnSequence> seqs) {
  ESSAIM_CHECK(N >= 1 && s.conv_kernel >= 1 && s.head_dim >= 1 && s.n_k_heads >= 1 &&
               s.n_v_heads % s.n_k_heads == 0);
  for (const GdnSequence& q : seqs) ESSAIM_CHECK(q.n_rows >= 1 && q.row0 >= 0 && q.row0 + q.n_rows <= N);
}

// gated_deltanet_recurrence after check_step.
void recurrence(const GdnShape& s, const GdnWeights& w, int64_t N, std::span<const GdnSequence> seqs,
                const float* mix, const float* z, float* beta, float* decay, float* o, ThreadPool* pool) {
  const int64_t Hv = s.n_v_heads;
  for (int64_t t = 0; t < N; ++t)
    for (int64_t h = 0; h < Hv; ++h) {
      float& b = beta[size_t(t * Hv + h)];
      b = sigmoid(b);
      float& d = decay[size_t(t * Hv + h)];
      const float g = softplus(d + w.dt_bias[h]) * w.a[h];  // log of the decay, ≤ 0
      d = std::exp(g);
    }
  std::vector<float> u(size_t(N * s.conv_channels()));  // [N][C] after conv, SiLU and the q/k L2 norms
  recurrent_heads(s, w, mix, z, decay, beta, seqs, u.data(), o, pool);
}

}  // namespace

void gated_deltanet_forward(const GdnShape& s, const GdnWeights& w, const float* a, int64_t T,
                            const GdnStateIo& io, float* y, ThreadPool* pool) {
  const GdnSequence one{.row0 = 0, .n_rows = T, .io = io};
  gated_deltanet_forward_batch(s, w, a, T, std::span(&one, 1), y, pool);
}

void gated_deltanet_recurrence(const GdnShape& s, const GdnWeights& w, int64_t N, std::span<const GdnSequence> seqs,
                               const float* mix, const float* z, float* beta, float* decay, float* o,
                               ThreadPool* pool) {
  check_step(s, N, seqs);
  recurrence(s, w, N, seqs, mix, z, beta, decay, o, pool);
}

void gated_deltanet_forward_batch(const GdnShape& s, const GdnWeights& w, const float* a, int64_t N,
                                  std::span<const GdnSequence> seqs, float* y, ThreadPool* pool) {
  check_step(s, N, seqs);
  const int64_t C = s.conv_channels(), VD = s.value_dim(), Hv = s.n_v_heads;

  // Input projections, batched over all rows of all sequences.
  std::vector<float> mix(size_t(N * C));     // [N][C]  q | k | v before the conv
  std::vector<float> z(size_t(N * VD));      // [N][Hv][Dv]
  std::vector<float> beta(size_t(N * Hv));   // [N][Hv]
  std::vector<float> decay(size_t(N * Hv));  // [N][Hv]
  const MatmulOut in_outs[] = {{&w.qkv, mix.data()}, {&w.gate, z.data()}, {&w.beta, beta.data()},
                                {&w.alpha, decay.data()}};
  matmul_set(in_outs, a, N, pool);  // one task set for the four projections of a
  std::vector<float> o(size_t(N * VD));  // [N][Hv][Dv] delta-rule read-out, then gated-normed
  recurrence(s, w, N, seqs, mix.data(), z.data(), beta.data(), decay.data(), o.data(), pool);
  matmul(w.out, o.data(), N, y, pool);  // [N][E]
}

}  // namespace essaim
