#include "model/gated_attention.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "core/status.h"
#include "model/attention.h"
#include "model/ops.h"
#include "moe/numerics.h"

namespace essaim {

void imrope_cos_sin(const std::array<int32_t, 4>& pos, int32_t n_rot, float base,
                    const std::array<int32_t, 4>& sections, float* cs) {
  const int32_t half = n_rot / 2;
  const int32_t S = sections[0] + sections[1] + sections[2] + sections[3];
  ESSAIM_CHECK(S > 0);
  const float theta_scale = std::pow(base, -2.0f / float(n_rot));
  float theta[4] = {float(pos[0]), float(pos[1]), float(pos[2]), float(pos[3])};  // t, h, w, e
  for (int32_t i = 0; i < half; ++i) {
    const int32_t sigma = i % S;
    int c = 3;  // p_e
    if (sigma % 3 == 1 && sigma < 3 * sections[1]) c = 1;
    else if (sigma % 3 == 2 && sigma < 3 * sections[2]) c = 2;
    else if (sigma % 3 == 0 && sigma < 3 * sections[0]) c = 0;
    cs[i] = std::cos(theta[c]);
    cs[half + i] = std::sin(theta[c]);
    for (float& th : theta) th = th * theta_scale;
  }
}

void gated_attention_forward(const GatedAttentionShape& s, const GatedAttentionWeights& w, const float* a,
                             int64_t T, const int32_t* pos, KvCache& kv, float* y, ThreadPool* pool) {
  const GatedAttentionSequence one{.row0 = 0, .n_rows = T, .kv = &kv};
  gated_attention_forward_batch(s, w, a, T, pos, std::span(&one, 1), y, pool);
}

void gated_attention_forward_batch(const GatedAttentionShape& s, const GatedAttentionWeights& w, const float* a,
                                   int64_t N, const int32_t* pos, std::span<const GatedAttentionSequence> seqs,
                                   float* y, ThreadPool* pool) {
  const int64_t H = s.n_head, Hkv = s.n_head_kv, D = s.head_dim, HD = H * D, KD = Hkv * D;
  ESSAIM_CHECK(s.n_rot <= s.head_dim);
  for (const GatedAttentionSequence& q : seqs)
    ESSAIM_CHECK(q.kv->n_kv_heads() == s.n_head_kv && q.kv->head_dim() == s.head_dim && q.row0 + q.n_rows <= N);

  std::vector<float> qg(size_t(N * 2 * HD));  // [N][H][q D | gate D]
  std::vector<float> k(size_t(N * KD));       // [N][Hkv][D]
  std::vector<float> v(size_t(N * KD));       // [N][Hkv][D]
  const MatmulOut qkv_outs[] = {{&w.q, qg.data()}, {&w.k, k.data()}, {&w.v, v.data()}};
  matmul_set(qkv_outs, a, N, pool);  // one task set for the three projections of a

  std::vector<float> q(size_t(N * HD));     // [N][H][D]
  std::vector<float> gate(size_t(N * HD));  // [N][H][D]
  for (int64_t r = 0; r < N * H; ++r) {
    std::memcpy(q.data() + r * D, qg.data() + r * 2 * D, size_t(D) * sizeof(float));
    std::memcpy(gate.data() + r * D, qg.data() + r * 2 * D + D, size_t(D) * sizeof(float));
  }
  rms_norm_rows(q.data(), w.q_norm, N * H, D, s.eps, q.data(), pool);    // per-head q norm
  rms_norm_rows(k.data(), w.k_norm, N * Hkv, D, s.eps, k.data(), pool);  // per-head k norm

  std::vector<float> cs(size_t(s.n_rot));  // [n_rot/2 cos | n_rot/2 sin]
  std::vector<AttentionArgs> per_seq;      // [n_seq]
  std::vector<float> o(size_t(N * HD));    // [N][H][D]
  for (const GatedAttentionSequence& sq : seqs) {
    for (int64_t t = sq.row0; t < sq.row0 + sq.n_rows; ++t) {
      imrope_cos_sin(imrope_text_position(pos[t]), s.n_rot, s.rope_base, s.rope_sections, cs.data());
      for (int64_t h = 0; h < H; ++h) rope_neox(q.data() + t * HD + h * D, s.n_rot, cs.data());
      for (int64_t g = 0; g < Hkv; ++g) rope_neox(k.data() + t * KD + g * D, s.n_rot, cs.data());
      sq.kv->store(pos[t], k.data() + t * KD, v.data() + t * KD);  // rounded to the cache type
    }
    per_seq.push_back({.q = q.data() + sq.row0 * HD, .pos = pos + sq.row0, .n_q = sq.n_rows, .n_head = s.n_head,
                       .scale = 1.0f / std::sqrt(float(D)), .kv = sq.kv, .out = o.data() + sq.row0 * HD});
  }
  attention_batch(per_seq, pool);
  for (size_t i = 0; i < o.size(); ++i) o[i] = o[i] * sigmoid(gate[i]);  // output gate, before W_o
  matmul(w.out, o.data(), N, y, pool);
}

}  // namespace essaim
