// Architecture `qwen3moe` (Qwen3-MoE: Qwen3-30B-A3B, Qwen3-235B-A22B) exactly as docs/reference.md section 4
// describes llama.cpp running it: hparams (4.1), tensors (4.2), forward pass (4.4).
//
//   h = embed(tokens)                                        -- [T][E]
//   for each layer:
//     a = RMSNorm(h); q, k, v = W_q·a, W_k·a, W_v·a; per-head RMSNorm of q and k; NEOX RoPE
//     store k, v in the KV cache; o = causal GQA attention; h1 = h + W_o·o
//     f = RMSNorm(h1); h = h1 + moe(f)                        -- routed experts via the ExpertExecutor
//   logits = W_out · RMSNorm(h)                              -- W_out tied to token_embd when absent
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/quantize.h"
#include "model/architectures.h"
#include "model/attention.h"
#include "model/hparams_reader.h"
#include "model/moe_block.h"
#include "model/ops.h"
#include "model/tensor_binder.h"

namespace essaim {
namespace {

struct Hparams {
  int32_t n_layer = 0;    // L
  int32_t n_ctx_train = 0;
  int32_t n_embd = 0;     // E
  int32_t n_head = 0;     // H
  int32_t n_head_kv = 0;  // Hkv
  int32_t head_dim = 0;   // D
  int32_t n_rot = 0;
  float rope_base = 10000.0f;
  float eps = 0.0f;
  int32_t n_expert = 0;   // X
  int32_t n_expert_used = 0;  // K
  int32_t n_ff_exp = 0;   // F
  int32_t n_vocab = 0;    // V
};

struct Layer {
  const float* attn_norm = nullptr;  // [E]
  WeightMatrix wq, wk, wv;           // [E -> H·D], [E -> Hkv·D], [E -> Hkv·D]
  WeightMatrix wqkv;                 // fused alternative [E -> H·D + 2·Hkv·D] (wqkv.data null when absent)
  const float* bq = nullptr;         // optional biases [H·D], [Hkv·D], [Hkv·D]
  const float* bk = nullptr;
  const float* bv = nullptr;
  const float* q_norm = nullptr;     // [D]
  const float* k_norm = nullptr;     // [D]
  WeightMatrix wo;                   // [H·D -> E]
  const float* ffn_norm = nullptr;   // [E]
  MoeBlock moe;
};

Result<Hparams> load_hparams(const GgufFile& f) {
  HparamReader keys(f, "qwen3moe");
  Hparams hp;
  ESSAIM_ASSIGN_OR_RETURN(uint32_t n_layer, keys.u32("block_count"));
  ESSAIM_RETURN_IF_ERROR(keys.check_range("block_count", n_layer, 1, 512));
  hp.n_layer = int32_t(n_layer);
  ESSAIM_ASSIGN_OR_RETURN(uint32_t ctx, keys.u32("context_length"));
  hp.n_ctx_train = int32_t(std::min<uint32_t>(ctx, INT32_MAX));
  ESSAIM_ASSIGN_OR_RETURN(uint32_t n_embd, keys.u32("embedding_length"));
  ESSAIM_RETURN_IF_ERROR(keys.check_range("embedding_length", n_embd, 1, 1 << 20));
  hp.n_embd = int32_t(n_embd);

  ESSAIM_ASSIGN_OR_RETURN(std::vector<uint32_t> heads, keys.u32_per_layer("attention.head_count", n_layer, {}));
  ESSAIM_ASSIGN_OR_RETURN(std::vector<uint32_t> heads_kv,
                          keys.u32_per_layer("attention.head_count_kv", n_layer, heads[0]));
  for (uint32_t i = 1; i < n_layer; ++i)
    if (heads[i] != heads[0] || heads_kv[i] != heads_kv[0])
      return Status::error("qwen3moe: per-layer head counts that vary between layers are not supported");
  ESSAIM_ASSIGN_OR_RETURN(const HparamReader::AttentionHeads ah, keys.attention_heads(heads[0], heads_kv[0], n_embd));
  hp.n_head = ah.n_head;
  hp.n_head_kv = ah.n_head_kv;
  hp.head_dim = ah.head_dim;
  const uint32_t key_len = uint32_t(ah.head_dim);
  ESSAIM_ASSIGN_OR_RETURN(uint32_t n_rot, keys.u32_or("rope.dimension_count", key_len));
  if (n_rot != key_len)
    return Status::error("qwen3moe: rope.dimension_count (" + std::to_string(n_rot) +
                         ") must equal the head dimension (" + std::to_string(key_len) + ")");
  if (key_len % 2 != 0) return Status::error("qwen3moe: the head dimension must be even for RoPE");
  hp.n_rot = int32_t(n_rot);
  ESSAIM_ASSIGN_OR_RETURN(hp.rope_base, keys.f32_or("rope.freq_base", 10000.0f));
  if (!(hp.rope_base > 0.0f)) return Status::error("metadata key 'qwen3moe.rope.freq_base' must be positive");
  ESSAIM_RETURN_IF_ERROR(keys.refuse_rope_scaling());
  ESSAIM_ASSIGN_OR_RETURN(hp.eps, keys.rms_epsilon("attention.layer_norm_rms_epsilon"));

  ESSAIM_ASSIGN_OR_RETURN(const HparamReader::ExpertCounts experts, keys.expert_counts());
  hp.n_expert = experts.n_expert;
  hp.n_expert_used = experts.n_expert_used;
  const uint32_t n_used = uint32_t(experts.n_expert_used);
  ESSAIM_ASSIGN_OR_RETURN(std::optional<uint32_t> n_ff_exp, keys.u32_opt("expert_feed_forward_length"));
  if (!n_ff_exp) {
    ESSAIM_ASSIGN_OR_RETURN(std::vector<uint32_t> ff, keys.u32_per_layer("feed_forward_length", n_layer, 0u));
    n_ff_exp = ff[0] / n_used;
  }
  if (*n_ff_exp == 0)
    return Status::error("qwen3moe: expert width unknown: 'qwen3moe.expert_feed_forward_length' is missing and "
                         "'qwen3moe.feed_forward_length' gives 0");
  hp.n_ff_exp = int32_t(*n_ff_exp);

  ESSAIM_ASSIGN_OR_RETURN(hp.n_vocab, keys.vocab_size());
  return hp;
}

class Qwen3Moe final : public Model {
 public:
  explicit Qwen3Moe(std::unique_ptr<GgufFile> file) : Model(std::move(file)) {}
  Status bind(const Hparams& hp);
  SequenceCache new_cache(const CacheOptions& options) const override;
  Status forward(const ForwardArgs& args) const override { return forward_as_batch(args); }
  Status forward_batch(const BatchForwardArgs& args) const override;

 private:
  Hparams hp_;
  std::vector<Layer> layers_;
};

Status Qwen3Moe::bind(const Hparams& hp) {
  hp_ = hp;
  const int64_t E = hp.n_embd, V = hp.n_vocab, D = hp.head_dim, HD = int64_t(hp.n_head) * D,
                KD = int64_t(hp.n_head_kv) * D, X = hp.n_expert, F = hp.n_ff_exp;
  TensorBinder b(*file_);
  ESSAIM_ASSIGN_OR_RETURN(const HeadTensors head, bind_embedding_and_head(b, E, V));

  uint64_t expert_bytes = 0, active_expert_bytes = 0;
  layers_.resize(size_t(hp.n_layer));
  for (int32_t il = 0; il < hp.n_layer; ++il) {
    Layer& l = layers_[size_t(il)];
    const GgufTensor* t;
    ESSAIM_ASSIGN_OR_RETURN(t, b.require(TensorName::ATTN_NORM, il, {E}, TensorKind::F32));
    l.attn_norm = f32_data(*t);
    if (b.has(TensorName::ATTN_QKV, il)) {
      ESSAIM_ASSIGN_OR_RETURN(t, b.require(TensorName::ATTN_QKV, il, {E, HD + 2 * KD}));
      l.wqkv = weight_matrix(*t);
    } else {
      ESSAIM_ASSIGN_OR_RETURN(t, b.require(TensorName::ATTN_Q, il, {E, HD}));
      l.wq = weight_matrix(*t);
      ESSAIM_ASSIGN_OR_RETURN(t, b.require(TensorName::ATTN_K, il, {E, KD}));
      l.wk = weight_matrix(*t);
      ESSAIM_ASSIGN_OR_RETURN(t, b.require(TensorName::ATTN_V, il, {E, KD}));
      l.wv = weight_matrix(*t);
    }
    ESSAIM_ASSIGN_OR_RETURN(t, b.optional(TensorName::ATTN_Q_BIAS, il, {HD}, TensorKind::F32));
    l.bq = t ? f32_data(*t) : nullptr;
    ESSAIM_ASSIGN_OR_RETURN(t, b.optional(TensorName::ATTN_K_BIAS, il, {KD}, TensorKind::F32));
    l.bk = t ? f32_data(*t) : nullptr;
    ESSAIM_ASSIGN_OR_RETURN(t, b.optional(TensorName::ATTN_V_BIAS, il, {KD}, TensorKind::F32));
    l.bv = t ? f32_data(*t) : nullptr;
    ESSAIM_ASSIGN_OR_RETURN(t, b.require(TensorName::ATTN_Q_NORM, il, {D}, TensorKind::F32));
    l.q_norm = f32_data(*t);
    ESSAIM_ASSIGN_OR_RETURN(t, b.require(TensorName::ATTN_K_NORM, il, {D}, TensorKind::F32));
    l.k_norm = f32_data(*t);
    ESSAIM_ASSIGN_OR_RETURN(t, b.require(TensorName::ATTN_OUTPUT, il, {HD, E}));
    l.wo = weight_matrix(*t);
    ESSAIM_ASSIGN_OR_RETURN(t, b.require(TensorName::FFN_NORM, il, {E}, TensorKind::F32));
    l.ffn_norm = f32_data(*t);
    ESSAIM_ASSIGN_OR_RETURN(const GgufTensor* router, b.require(TensorName::FFN_GATE_INP, il, {E, X}));
    ESSAIM_ASSIGN_OR_RETURN(const GgufTensor* gate, b.require(TensorName::FFN_GATE_EXPS, il, {E, F, X}));
    ESSAIM_ASSIGN_OR_RETURN(const GgufTensor* up, b.require(TensorName::FFN_UP_EXPS, il, {E, F, X}));
    ESSAIM_ASSIGN_OR_RETURN(const GgufTensor* down, b.require(TensorName::FFN_DOWN_EXPS, il, {F, E, X}));
    ESSAIM_RETURN_IF_ERROR(
        experts_.add(il, ExpertLayer::separate(expert_tensor(*gate), expert_tensor(*up), expert_tensor(*down))));
    l.moe = MoeBlock{.layer = il, .router = weight_matrix(*router), .n_expert_used = hp.n_expert_used,
                     .expert_weight_type = gate->type, .n_embd = hp.n_embd};
    expert_bytes += gate->nbytes + up->nbytes + down->nbytes;
    active_expert_bytes += uint64_t(hp.n_expert_used) *
                           (gate->expert_slab_bytes() + up->expert_slab_bytes() + down->expert_slab_bytes());
  }
  ESSAIM_RETURN_IF_ERROR(b.finish());

  describe("qwen3moe", hp, head, {.experts = expert_bytes, .active_experts = active_expert_bytes});
  return Status::ok();
}

SequenceCache Qwen3Moe::new_cache(const CacheOptions& options) const {
  std::vector<LayerCache> layers;
  for (int32_t il = 0; il < hp_.n_layer; ++il) layers.emplace_back(KvCache(options.kv_type, hp_.n_head_kv, hp_.head_dim));
  return SequenceCache(std::move(layers), resolve_n_ctx(options));
}

// y[T][n] += bias, when there is one.
void add_bias(const float* bias, int64_t T, int64_t n, float* y) {
  if (bias)
    for (int64_t t = 0; t < T; ++t) add_f32(y + t * n, bias, n);
}

// All rows of all items through each layer together (rows = the items' tokens concatenated, N of them):
// norms, projections, the router, the expert call and the combine see [N] rows; RoPE, the KV writes and
// attention are per sequence, each row at its own position over its own cache.
Status Qwen3Moe::forward_batch(const BatchForwardArgs& args) const {
  ESSAIM_ASSIGN_OR_RETURN(const BatchRows rows, prepare_batch(args));
  ThreadPool* pool = args.pool;
  const int64_t N = rows.n_rows;
  const size_t n_seq = args.items.size();
  const int32_t E = hp_.n_embd, H = hp_.n_head, Hkv = hp_.n_head_kv, D = hp_.head_dim;
  const int64_t HD = int64_t(H) * D, KD = int64_t(Hkv) * D;

  std::vector<float> rope(size_t(N) * size_t(hp_.n_rot));  // [N][n_rot]: cos | sin of each row's angles
  for (int64_t t = 0; t < N; ++t) rope_cos_sin(rows.pos[size_t(t)], hp_.n_rot, hp_.rope_base, rope.data() + t * hp_.n_rot);

  std::vector<float> x(size_t(N) * E);  // [N][E] residual stream h
  embed_rows(tok_embd_, rows.tokens, E, x.data());

  std::vector<float> cur(size_t(N) * E);  // [N][E] normed input / projection output
  std::vector<float> q(size_t(N * HD));   // [N][H][D]
  std::vector<float> k(size_t(N * KD));   // [N][Hkv][D]
  std::vector<float> v(size_t(N * KD));   // [N][Hkv][D]
  std::vector<float> o(size_t(N * HD));   // [N][H][D] attention output
  std::vector<float> qkv;                 // [N][HD + 2·KD] when the projection is fused
  std::vector<float> moe_out(size_t(N) * E);  // [N][E] Σ_k w_k·y_k
  std::vector<AttentionArgs> attn(n_seq);     // [n_seq] each sequence's rows over its own cache
  const float scale = 1.0f / std::sqrt(float(D));

  for (int32_t il = 0; il < hp_.n_layer; ++il) {
    const Layer& l = layers_[size_t(il)];

    rms_norm_rows(x.data(), l.attn_norm, N, E, hp_.eps, cur.data(), pool);  // a = RMSNorm(h)
    if (l.wqkv.data) {
      qkv.resize(size_t(N * (HD + 2 * KD)));
      matmul(l.wqkv, cur.data(), N, qkv.data(), pool);
      for (int64_t t = 0; t < N; ++t) {
        const float* r = qkv.data() + t * (HD + 2 * KD);
        std::memcpy(q.data() + t * HD, r, size_t(HD) * sizeof(float));
        std::memcpy(k.data() + t * KD, r + HD, size_t(KD) * sizeof(float));
        std::memcpy(v.data() + t * KD, r + HD + KD, size_t(KD) * sizeof(float));
      }
    } else {
      // q = W_q·a, k = W_k·a, v = W_v·a as one task set (one barrier), then the biases.
      const MatmulOut qkv_outs[] = {{&l.wq, q.data()}, {&l.wk, k.data()}, {&l.wv, v.data()}};
      matmul_set(qkv_outs, cur.data(), N, pool);
      add_bias(l.bq, N, HD, q.data());
      add_bias(l.bk, N, KD, k.data());
      add_bias(l.bv, N, KD, v.data());
    }
    rms_norm_rows(q.data(), l.q_norm, N * H, D, hp_.eps, q.data(), pool);    // per-head q norm
    rms_norm_rows(k.data(), l.k_norm, N * Hkv, D, hp_.eps, k.data(), pool);  // per-head k norm
    for (size_t i = 0; i < n_seq; ++i) {
      KvCache& kv = args.items[i].cache->kv(il);
      const int64_t r0 = rows.row0[i], r1 = rows.row0[i + 1];
      for (int64_t t = r0; t < r1; ++t) {
        const float* cs = rope.data() + t * hp_.n_rot;
        for (int32_t h = 0; h < H; ++h) rope_neox(q.data() + t * HD + int64_t(h) * D, hp_.n_rot, cs);
        for (int32_t g = 0; g < Hkv; ++g) rope_neox(k.data() + t * KD + int64_t(g) * D, hp_.n_rot, cs);
        kv.store(rows.pos[size_t(t)], k.data() + t * KD, v.data() + t * KD);  // rounded to the cache type
      }
      attn[i] = {.q = q.data() + r0 * HD, .pos = rows.pos.data() + r0, .n_q = r1 - r0, .n_head = H,
                 .scale = scale, .kv = &kv, .out = o.data() + r0 * HD};
    }
    attention_batch(attn, pool);
    matmul(l.wo, o.data(), N, cur.data(), pool);  // W_o·o
    add_f32(x.data(), cur.data(), N * E);          // h1 = h + W_o·o

    rms_norm_rows(x.data(), l.ffn_norm, N, E, hp_.eps, cur.data(), pool);  // f = RMSNorm(h1)
    Status s = moe_block_forward(l.moe, cur.data(), N, *args.experts, pool, moe_out.data());  // one call, N rows
    if (!s) {  // leave every cache as it was
      drop_step_kv(args, rows, il);
      return s;
    }
    add_f32(x.data(), moe_out.data(), N * E);  // h = h1 + moe(f)
  }

  lm_head_batch(args, rows, x.data(), E, output_norm_, hp_.eps, output_);  // each item's [n_out][V]
  for (size_t i = 0; i < n_seq; ++i) args.items[i].cache->advance(int32_t(rows.row0[i + 1] - rows.row0[i]));
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<Model>> load_qwen3moe(std::unique_ptr<GgufFile> file) {
  ESSAIM_ASSIGN_OR_RETURN(Hparams hp, load_hparams(*file));
  auto m = std::make_unique<Qwen3Moe>(std::move(file));
  ESSAIM_RETURN_IF_ERROR(m->bind(hp));
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace essaim
