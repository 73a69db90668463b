// Architecture `qwen35moe` (Qwen3.5 / Qwen3.6 MoE, e.g. Qwen3.5-122B-A10B) exactly as docs/reference.md section 5
// describes llama.cpp running it: hparams (5.1, 5.2: qwen35moe_hparams.h), tensors (5.3), forward (5.4).
//
//   h = embed(tokens)                                           -- [T][E]
//   for each executed layer i:
//     a  = RMSNorm(h, attn_norm)
//     t  = recurrent(i) ? GatedDeltaNet(a)  : GatedAttention(a)   -- gated_deltanet.h / gated_attention.h
//     h1 = h + t
//     f  = RMSNorm(h1, post_attention_norm)                     -- the pre-FFN norm, despite its name
//     h  = h1 + (moe(f) + γ·shared(f))                          -- routed experts via the ExpertExecutor,
//                                                                  the shared expert on the backbone
//   logits = W_out · RMSNorm(h, output_norm)                    -- W_out tied to token_embd when absent
//
// MTP (nextn) blocks after the main stack are bound and shape-checked; the first one runs as the draft head
// (forward_nextn_batch, docs/speculative.md), as the shipped model was trained (models/train/model.py):
//   x      = W_eh · [RMSNorm(embed(token i+1), enorm) | RMSNorm(hidden_i, hnorm)]   -- hidden_i: the main
//                                                     stack's final state of position i after output_norm
//   x      = the block's gated attention (its own KV cache, position i) + MoE, as a main attention layer
//   logits = W_head · RMSNorm(x, shared_head_norm)    -- W_head: shared_head_head, else the LM head Norm weights are used as stored: the converter already wrote
// Qwen3.5's 1 + w (5.9). Recurrent layers keep their conv window and delta-rule state in the sequence's
// cache. When the expert executor may fail, a forward pass writes the advanced states aside and swaps them
// in only when every layer succeeded; when it cannot (experts held here, whether or not workers also serve
// them), the states advance in place, which reads and writes each 4 MiB state once per step instead of
// reading it, filling a second buffer and writing that back (the recurrent step 400-440 -> 290-340 us per
// 122B-shaped layer on two threads, bench/recurrent_bench).
#include <cstring>
#include <optional>
#include <vector>

#include "kernels/quantize.h"
#include "model/architectures.h"
#include "model/gated_attention.h"
#include "model/gated_deltanet.h"
#include "model/moe_block.h"
#include "model/ops.h"
#include "model/qwen35moe_hparams.h"
#include "model/shared_expert.h"
#include "model/tensor_binder.h"

namespace essaim {
namespace {

using TN = TensorName;

struct Layer {
  bool recurrent = false;
  const float* attn_norm = nullptr;       // [E]
  const float* post_attn_norm = nullptr;  // [E], the FFN input norm
  GdnWeights gdn;                         // recurrent layers
  GatedAttentionWeights attn;             // attention layers
  MoeBlock moe;
  SharedExpert shared;
};

// The MTP block that runs: layer index n_layer, an attention layer with the block's own input and head.
struct NextnBlock {
  Layer layer;
  WeightMatrix eh_proj;             // [2E -> E] over [enorm(embedding) | hnorm(hidden)]
  const float* enorm = nullptr;     // [E]
  const float* hnorm = nullptr;     // [E]
  WeightMatrix embed;               // nextn.embed_tokens, else token_embd
  const float* head_norm = nullptr; // shared_head_norm, else output_norm
  WeightMatrix head;                // shared_head_head, else the LM head
};

class Qwen35Moe final : public Model {
 public:
  explicit Qwen35Moe(std::unique_ptr<GgufFile> file) : Model(std::move(file)) {}
  Status bind(const Qwen35Hparams& hp);
  SequenceCache new_cache(const CacheOptions& options) const override;
  Status forward(const ForwardArgs& args) const override { return forward_as_batch(args); }
  Status forward_batch(const BatchForwardArgs& args) const override;
  bool has_nextn() const override { return nextn_.has_value(); }
  SequenceCache new_nextn_cache(const CacheOptions& options) const override;
  Status forward_nextn_batch(const NextnBatchArgs& args) const override;

 private:
  // attn_norm and post_attention_norm, which every block has.
  Status bind_norms(TensorBinder& b, int32_t il, Layer* l);
  // The norms and the gated attention's tensors of an attention block.
  Status bind_attention(TensorBinder& b, int32_t il, Layer* l);
  // FFN half of a layer over N rows: f = RMSNorm(x, post_attention_norm); x += moe(f) + γ·shared(f).
  Status ffn_step(const Layer& l, float* x, int64_t N, ExpertExecutor& experts, ThreadPool* pool) const;
  // The MTP block's input x [N][E] = W_eh · [enorm(embedding of tokens) | hnorm(hidden)].
  void nextn_input(std::span<const NextnItem> items, int64_t N, float* x, ThreadPool* pool) const;
  void nextn_head(std::span<const NextnItem> items, const BatchRows& rows, const float* x, ThreadPool* pool) const;
  // Binds the MoE part every block has (router, routed experts separate or fused, shared expert); returns
  // the routed experts' bytes and, through `active`, the bytes of K experts.
  Result<uint64_t> bind_ffn(TensorBinder& b, int32_t il, TensorKind kind, Layer* l, uint64_t* active);
  // Binds an MTP block's tensors (shape checks only); returns their bytes.
  Result<uint64_t> bind_nextn_block(TensorBinder& b, int32_t il);

  Qwen35Hparams hp_;
  GdnShape gdn_shape_;
  GatedAttentionShape attn_shape_;
  std::vector<Layer> layers_;           // [n_layer]
  std::optional<NextnBlock> nextn_;     // the first MTP block, when the file has one
};

Result<uint64_t> Qwen35Moe::bind_ffn(TensorBinder& b, int32_t il, TensorKind kind, Layer* l, uint64_t* active) {
  const int64_t E = hp_.n_embd, X = hp_.n_expert, F = hp_.n_ff_exp, Fs = hp_.n_ff_shexp;
  const GgufTensor *router, *gate = nullptr, *up = nullptr, *gate_up = nullptr, *down;
  ESSAIM_ASSIGN_OR_RETURN(router, b.require(TN::FFN_GATE_INP, il, {E, X}, kind));
  if (b.has(TN::FFN_GATE_UP_EXPS, il)) {
    ESSAIM_ASSIGN_OR_RETURN(gate_up, b.require(TN::FFN_GATE_UP_EXPS, il, {E, 2 * F, X}, kind));
  } else {
    ESSAIM_ASSIGN_OR_RETURN(gate, b.require(TN::FFN_GATE_EXPS, il, {E, F, X}, kind));
    ESSAIM_ASSIGN_OR_RETURN(up, b.require(TN::FFN_UP_EXPS, il, {E, F, X}, kind));
  }
  ESSAIM_ASSIGN_OR_RETURN(down, b.require(TN::FFN_DOWN_EXPS, il, {F, E, X}, kind));
  const GgufTensor* shexp[4];
  ESSAIM_ASSIGN_OR_RETURN(shexp[0], b.require(TN::FFN_GATE_INP_SHEXP, il, {E},
                                              kind == TensorKind::ANY ? kind : TensorKind::F32));
  ESSAIM_ASSIGN_OR_RETURN(shexp[1], b.require(TN::FFN_GATE_SHEXP, il, {E, Fs}, kind));
  ESSAIM_ASSIGN_OR_RETURN(shexp[2], b.require(TN::FFN_UP_SHEXP, il, {E, Fs}, kind));
  ESSAIM_ASSIGN_OR_RETURN(shexp[3], b.require(TN::FFN_DOWN_SHEXP, il, {Fs, E}, kind));

  const uint64_t bytes = (gate_up ? gate_up->nbytes : gate->nbytes + up->nbytes) + down->nbytes;
  if (active)
    *active = uint64_t(hp_.n_expert_used) *
              ((gate_up ? gate_up->expert_slab_bytes() : gate->expert_slab_bytes() + up->expert_slab_bytes()) +
               down->expert_slab_bytes());
  if (!l) return bytes;  // an MTP block after the first: validated, never run

  const ExpertLayer experts =
      gate_up ? ExpertLayer::fused(expert_tensor(*gate_up), expert_tensor(*down))
              : ExpertLayer::separate(expert_tensor(*gate), expert_tensor(*up), expert_tensor(*down));
  ESSAIM_RETURN_IF_ERROR(experts_.add(il, experts).with_context("layer " + std::to_string(il) + " experts"));
  l->moe = MoeBlock{.layer = il, .router = weight_matrix(*router), .n_expert_used = hp_.n_expert_used,
                    .expert_weight_type = (gate_up ? gate_up : gate)->type, .n_embd = hp_.n_embd};
  l->shared = SharedExpert{.gate_inp = f32_data(*shexp[0]), .gate = weight_matrix(*shexp[1]),
                           .up = weight_matrix(*shexp[2]), .down = weight_matrix(*shexp[3])};
  if (type_traits(shexp[1]->type).vec_dot_type != type_traits(shexp[2]->type).vec_dot_type)
    return Status::error("tensors '" + tensor_name(TN::FFN_GATE_SHEXP, il) + "' (" +
                         std::string(type_name(shexp[1]->type)) + ") and '" + tensor_name(TN::FFN_UP_SHEXP, il) +
                         "' (" + std::string(type_name(shexp[2]->type)) + ") need different activation formats");
  return bytes;
}

Status Qwen35Moe::bind_norms(TensorBinder& b, int32_t il, Layer* l) {
  const int64_t E = hp_.n_embd;
  const GgufTensor* t;
  ESSAIM_ASSIGN_OR_RETURN(t, b.require(TN::ATTN_NORM, il, {E}, TensorKind::F32));
  l->attn_norm = f32_data(*t);
  ESSAIM_ASSIGN_OR_RETURN(t, b.require(TN::POST_ATTN_NORM, il, {E}, TensorKind::F32));
  l->post_attn_norm = f32_data(*t);
  return Status::ok();
}

Status Qwen35Moe::bind_attention(TensorBinder& b, int32_t il, Layer* l) {
  const int64_t E = hp_.n_embd, D = hp_.head_dim, HD = int64_t(hp_.n_head) * D, KD = int64_t(hp_.n_head_kv) * D;
  constexpr TensorKind kF32 = TensorKind::F32;
  ESSAIM_RETURN_IF_ERROR(bind_norms(b, il, l));
  const GgufTensor* t;
  GatedAttentionWeights& a = l->attn;
  ESSAIM_ASSIGN_OR_RETURN(t, b.require(TN::ATTN_Q, il, {E, 2 * HD}));
  a.q = weight_matrix(*t);
  ESSAIM_ASSIGN_OR_RETURN(t, b.require(TN::ATTN_K, il, {E, KD}));
  a.k = weight_matrix(*t);
  ESSAIM_ASSIGN_OR_RETURN(t, b.require(TN::ATTN_V, il, {E, KD}));
  a.v = weight_matrix(*t);
  ESSAIM_ASSIGN_OR_RETURN(t, b.require(TN::ATTN_Q_NORM, il, {D}, kF32));
  a.q_norm = f32_data(*t);
  ESSAIM_ASSIGN_OR_RETURN(t, b.require(TN::ATTN_K_NORM, il, {D}, kF32));
  a.k_norm = f32_data(*t);
  ESSAIM_ASSIGN_OR_RETURN(t, b.require(TN::ATTN_OUTPUT, il, {HD, E}));
  a.out = weight_matrix(*t);
  return Status::ok();
}

// The first MTP block is bound to run (its experts join the store at its layer index); later ones, which
// nothing runs, are shape-checked only. Returns the block's bytes.
Result<uint64_t> Qwen35Moe::bind_nextn_block(TensorBinder& b, int32_t il) {
  const int64_t E = hp_.n_embd, V = hp_.n_vocab;
  constexpr TensorKind kF32 = TensorKind::F32;
  const bool runs = il == hp_.n_layer;
  NextnBlock n;
  ESSAIM_RETURN_IF_ERROR(bind_attention(b, il, &n.layer));
  const GgufTensor* t;
  ESSAIM_ASSIGN_OR_RETURN(t, b.require(TN::NEXTN_EH_PROJ, il, {2 * E, E}));
  n.eh_proj = weight_matrix(*t);
  ESSAIM_ASSIGN_OR_RETURN(t, b.require(TN::NEXTN_ENORM, il, {E}, kF32));
  n.enorm = f32_data(*t);
  ESSAIM_ASSIGN_OR_RETURN(t, b.require(TN::NEXTN_HNORM, il, {E}, kF32));
  n.hnorm = f32_data(*t);
  ESSAIM_ASSIGN_OR_RETURN(t, b.optional(TN::NEXTN_EMBED_TOKENS, il, {E, V}));
  n.embed = t ? weight_matrix(*t) : tok_embd_;
  ESSAIM_ASSIGN_OR_RETURN(t, b.optional(TN::NEXTN_SHARED_HEAD_HEAD, il, {E, V}));
  n.head = t ? weight_matrix(*t) : output_;
  ESSAIM_ASSIGN_OR_RETURN(t, b.optional(TN::NEXTN_SHARED_HEAD_NORM, il, {E}, kF32));
  n.head_norm = t ? f32_data(*t) : output_norm_;
  ESSAIM_RETURN_IF_ERROR(bind_ffn(b, il, TensorKind::MATRIX, runs ? &n.layer : nullptr, nullptr).status());
  if (runs) nextn_ = std::move(n);
  uint64_t bytes = 0;  // every tensor of the block, its experts included
  const std::string prefix = "blk." + std::to_string(il) + ".";
  for (const GgufTensor& x : file_->tensors())
    if (x.name.starts_with(prefix)) bytes += x.nbytes;
  return bytes;
}

Status Qwen35Moe::bind(const Qwen35Hparams& hp) {
  hp_ = hp;
  gdn_shape_ = GdnShape{.n_embd = hp.n_embd, .conv_kernel = hp.ssm_conv_kernel, .n_k_heads = hp.ssm_n_k_heads,
                        .n_v_heads = hp.ssm_n_v_heads, .head_dim = hp.ssm_head_dim, .eps = hp.eps};
  attn_shape_ = GatedAttentionShape{.n_head = hp.n_head, .n_head_kv = hp.n_head_kv, .head_dim = hp.head_dim,
                                    .n_rot = hp.n_rot, .rope_base = hp.rope_base,
                                    .rope_sections = hp.rope_sections, .eps = hp.eps};
  const int64_t E = hp.n_embd, V = hp.n_vocab, C = gdn_shape_.conv_channels(), VD = gdn_shape_.value_dim(),
                Hv = hp.ssm_n_v_heads, Kc = hp.ssm_conv_kernel, Dv = hp.ssm_head_dim;
  constexpr TensorKind kF32 = TensorKind::F32;
  TensorBinder b(*file_);
  ESSAIM_ASSIGN_OR_RETURN(const HeadTensors head, bind_embedding_and_head(b, E, V));

  uint64_t expert_bytes = 0, active_expert_bytes = 0, nextn_bytes = 0;
  layers_.resize(size_t(hp.n_layer));
  for (int32_t il = 0; il < hp.n_layer; ++il) {
    Layer& l = layers_[size_t(il)];
    l.recurrent = hp.recurrent[size_t(il)];
    if (!l.recurrent) {
      ESSAIM_RETURN_IF_ERROR(bind_attention(b, il, &l));
    } else {
      ESSAIM_RETURN_IF_ERROR(bind_norms(b, il, &l));
      const GgufTensor* t;
      GdnWeights& g = l.gdn;
      ESSAIM_ASSIGN_OR_RETURN(t, b.require(TN::ATTN_QKV, il, {E, C}));
      g.qkv = weight_matrix(*t);
      ESSAIM_ASSIGN_OR_RETURN(t, b.require(TN::ATTN_GATE, il, {E, VD}));
      g.gate = weight_matrix(*t);
      ESSAIM_ASSIGN_OR_RETURN(t, b.require(TN::SSM_BETA, il, {E, Hv}));
      g.beta = weight_matrix(*t);
      ESSAIM_ASSIGN_OR_RETURN(t, b.require(TN::SSM_ALPHA, il, {E, Hv}));
      g.alpha = weight_matrix(*t);
      ESSAIM_ASSIGN_OR_RETURN(t, b.require(TN::SSM_CONV1D, il, {Kc, C}, kF32));
      g.conv1d = f32_data(*t);
      ESSAIM_ASSIGN_OR_RETURN(t, b.require(TN::SSM_DT_BIAS, il, {Hv}, kF32));
      g.dt_bias = f32_data(*t);
      ESSAIM_ASSIGN_OR_RETURN(t, b.require(TN::SSM_A, il, {Hv}, kF32));
      g.a = f32_data(*t);
      ESSAIM_ASSIGN_OR_RETURN(t, b.require(TN::SSM_NORM, il, {Dv}, kF32));
      g.norm = f32_data(*t);
      ESSAIM_ASSIGN_OR_RETURN(t, b.require(TN::SSM_OUT, il, {VD, E}));
      g.out = weight_matrix(*t);
    }
    uint64_t active = 0;
    ESSAIM_ASSIGN_OR_RETURN(uint64_t bytes, bind_ffn(b, il, TensorKind::MATRIX, &l, &active));
    expert_bytes += bytes;
    active_expert_bytes += active;
  }
  for (int32_t il = hp.n_layer; il < hp.n_block; ++il) {
    ESSAIM_ASSIGN_OR_RETURN(uint64_t bytes, bind_nextn_block(b, il));
    nextn_bytes += bytes;
  }
  ESSAIM_RETURN_IF_ERROR(b.finish());

  // expert_bytes: the executed layers' routed experts (MTP blocks' are in nextn_bytes). A decoded token reads
  // the executed layers' dense weights (shared experts included), MTP blocks not at all.
  describe("qwen35moe", hp, head,
           {.experts = expert_bytes, .active_experts = active_expert_bytes, .unread = nextn_bytes});
  for (const Layer& l : layers_)
    if (l.recurrent)
      info_.recurrent_state_bytes +=
          (gdn_shape_.conv_state_size() + gdn_shape_.recurrent_state_size()) * sizeof(float);
  return Status::ok();
}

SequenceCache Qwen35Moe::new_cache(const CacheOptions& options) const {
  std::vector<LayerCache> layers;
  for (int32_t il = 0; il < hp_.n_layer; ++il) {
    if (layers_[size_t(il)].recurrent) {
      RecurrentState r;
      r.conv.assign(gdn_shape_.conv_state_size(), 0.0f);
      r.state.assign(gdn_shape_.recurrent_state_size(), 0.0f);
      layers.emplace_back(std::move(r));
    } else {
      layers.emplace_back(KvCache(options.kv_type, hp_.n_head_kv, hp_.head_dim));
    }
  }
  return SequenceCache(std::move(layers), resolve_n_ctx(options));
}

// All rows of all items through each layer together (rows = the items' tokens concatenated, N of them):
// norms, projections, the router, the expert call, the shared expert and the combine see [N] rows; the
// Gated DeltaNet recurrence and attention run per sequence on its own rows, state and cache.
Status Qwen35Moe::forward_batch(const BatchForwardArgs& args) const {
  ESSAIM_ASSIGN_OR_RETURN(const BatchRows rows, prepare_batch(args));
  for (const BatchItem& item : args.items) ESSAIM_CHECK(item.cache->n_layers() == hp_.n_layer);
  ThreadPool* pool = args.pool;
  const int64_t N = rows.n_rows;
  const size_t n_seq = args.items.size();
  const int32_t E = hp_.n_embd;

  std::vector<float> x(size_t(N) * E);  // [N][E] residual stream h
  embed_rows(tok_embd_, rows.tokens, E, x.data());

  std::vector<float> cur(size_t(N) * E);  // [N][E] a = RMSNorm(h), then f = RMSNorm(h1)
  std::vector<float> mix(size_t(N) * E);  // [N][E] mixer output t
  std::vector<GdnSequence> gdn(n_seq);                // [n_seq] recurrent layers: rows and state of each
  std::vector<GatedAttentionSequence> attn(n_seq);    // [n_seq] attention layers: rows and cache of each
  const bool in_place = !args.experts->may_fail();    // recurrent states advance in place, or aside
  for (int32_t il = 0; il < hp_.n_layer; ++il) {
    const Layer& l = layers_[size_t(il)];
    rms_norm_rows(x.data(), l.attn_norm, N, E, hp_.eps, cur.data(), pool);  // a = RMSNorm(h)
    for (size_t i = 0; i < n_seq; ++i) {
      const int64_t r0 = rows.row0[i], n = rows.row0[i + 1] - r0;
      SequenceCache& cache = *args.items[i].cache;
      if (l.recurrent) {
        RecurrentState& r = cache.recurrent(il);
        if (in_place) {
          r.conv_next = {};  // a previous forward's aside buffers are not needed any more
          r.state_next = {};
        } else {
          r.conv_next.resize(r.conv.size());
          r.state_next.resize(r.state.size());
        }
        float* conv_out = in_place ? r.conv.data() : r.conv_next.data();
        float* state_out = in_place ? r.state.data() : r.state_next.data();
        gdn[i] = {.row0 = r0, .n_rows = n,
                  .io = {.conv_in = r.conv.data(), .state_in = r.state.data(), .conv_out = conv_out,
                         .state_out = state_out}};
        if (args.items[i].keep_row_states) {  // [n] states to cut back to (SequenceCache::cut_back)
          r.conv_rows.resize(size_t(n) * r.conv.size());
          r.state_rows.resize(size_t(n) * r.state.size());
          gdn[i].io.conv_rows = r.conv_rows.data();
          gdn[i].io.state_rows = r.state_rows.data();
        }
      } else {
        attn[i] = {.row0 = r0, .n_rows = n, .kv = &cache.kv(il)};
      }
    }
    if (l.recurrent)
      gated_deltanet_forward_batch(gdn_shape_, l.gdn, cur.data(), N, gdn, mix.data(), pool);
    else
      gated_attention_forward_batch(attn_shape_, l.attn, cur.data(), N, rows.pos.data(), attn, mix.data(), pool);
    add_f32(x.data(), mix.data(), N * E);  // h1 = h + t

    Status s = ffn_step(l, x.data(), N, *args.experts, pool);
    if (!s) {
      if (in_place) {  // an executor that said it cannot fail did: the advanced states cannot be rolled back
        for (size_t i = 0; i < n_seq; ++i) args.items[i].cache->reset();
        return Status::error(s.message() + " (the expert executor was not expected to fail; its sequences' "
                             "recurrent states had advanced in place and were reset)");
      }
      drop_step_kv(args, rows, il);  // every cache as it was: recurrent states were not swapped in
      return s;
    }
  }
  for (const BatchItem& item : args.items)
    for (int32_t il = 0; il < hp_.n_layer && !in_place; ++il) {
      if (!layers_[size_t(il)].recurrent) continue;
      RecurrentState& r = item.cache->recurrent(il);
      r.conv.swap(r.conv_next);
      r.state.swap(r.state_next);
    }

  lm_head_batch(args, rows, x.data(), E, output_norm_, hp_.eps, output_);  // each item's [n_out][V]
  for (size_t i = 0; i < n_seq; ++i) {
    const int32_t n = int32_t(rows.row0[i + 1] - rows.row0[i]);
    SequenceCache& cache = *args.items[i].cache;
    cache.set_kept_rows(cache.n_past(), args.items[i].keep_row_states ? n : 0);
    cache.advance(n);
  }
  return Status::ok();
}

Status Qwen35Moe::ffn_step(const Layer& l, float* x, int64_t N, ExpertExecutor& experts, ThreadPool* pool) const {
  const int32_t E = hp_.n_embd;
  std::vector<float> f(size_t(N) * E);    // [N][E] f = RMSNorm(h1)
  std::vector<float> ffn(size_t(N) * E);  // [N][E] routed sum, then + γ·shared
  SharedExpertRows shared_rows;           // the shared expert's gate and up outputs
  rms_norm_rows(x, l.post_attn_norm, N, E, hp_.eps, f.data(), pool);
  // The shared expert's gate and up run in the router's task set; its down and γ after the routed sum.
  const std::array<MatmulOut, 2> shared_gu = shared_expert_gate_up(l.shared, N, shared_rows);
  ESSAIM_RETURN_IF_ERROR(moe_block_forward(l.moe, f.data(), N, experts, pool, ffn.data(), nullptr, shared_gu));
  shared_expert_finish(l.shared, f.data(), N, shared_rows, ffn.data(), pool);  // r + γ·sh, after the routed sum
  add_f32(x, ffn.data(), N * E);                                             // h = h1 + FFN(f)
  return Status::ok();
}

SequenceCache Qwen35Moe::new_nextn_cache(const CacheOptions& options) const {
  if (!nextn_) return Model::new_nextn_cache(options);
  std::vector<LayerCache> layers;
  layers.emplace_back(KvCache(options.kv_type, hp_.n_head_kv, hp_.head_dim));
  return SequenceCache(std::move(layers), resolve_n_ctx(options));
}

void Qwen35Moe::nextn_input(std::span<const NextnItem> items, int64_t N, float* x, ThreadPool* pool) const {
  const NextnBlock& nb = *nextn_;
  const int64_t E = hp_.n_embd;
  std::vector<float> e(size_t(N) * E), g(size_t(N) * E);  // [N][E] embeddings and hidden states, then normed
  int64_t r = 0;
  for (const NextnItem& item : items) {
    embed_rows(nb.embed, item.tokens, E, e.data() + r * E);
    std::memcpy(g.data() + r * E, item.hidden.data(), item.hidden.size() * sizeof(float));
    r += int64_t(item.tokens.size());
  }
  rms_norm_rows(e.data(), nb.enorm, N, E, hp_.eps, e.data(), pool);
  rms_norm_rows(g.data(), nb.hnorm, N, E, hp_.eps, g.data(), pool);
  std::vector<float> cat(size_t(N) * 2 * E);  // [N][2E] = [enorm(e) | hnorm(g)], the order model.py trains
  for (int64_t i = 0; i < N; ++i) {
    std::memcpy(cat.data() + i * 2 * E, e.data() + i * E, size_t(E) * sizeof(float));
    std::memcpy(cat.data() + i * 2 * E + E, g.data() + i * E, size_t(E) * sizeof(float));
  }
  matmul(nb.eh_proj, cat.data(), N, x, pool);  // [N][E]
}

// The MTP block over all rows of all items: its input, then exactly a main attention layer (gated attention
// on the block's own KV cache, the routed experts through the executor at layer n_layer, the shared expert),
// then each item's last row through shared_head_norm and the head.
Status Qwen35Moe::forward_nextn_batch(const NextnBatchArgs& args) const {
  if (!nextn_) return Model::forward_nextn_batch(args);
  std::vector<BatchItem> as_rows;  // the same checks as a main step: tokens in range, room, distinct caches
  for (const NextnItem& item : args.items) {
    ESSAIM_CHECK(item.cache != nullptr && item.cache->n_layers() == 1);
    ESSAIM_CHECK(item.hidden.size() == item.tokens.size() * size_t(hp_.n_embd));
    ESSAIM_CHECK(item.logits.size() == size_t(hp_.n_vocab) || item.logits.size() == item.tokens.size() * size_t(hp_.n_vocab));
    ESSAIM_CHECK(item.hidden_out.empty() || item.hidden_out.size() == size_t(hp_.n_embd));
    as_rows.push_back({.tokens = item.tokens, .cache = item.cache, .logits_mode = LogitsMode::NONE, .logits = {},
                       .hidden = {}, .keep_row_states = false});
  }
  ESSAIM_ASSIGN_OR_RETURN(const BatchRows rows,
                          prepare_batch({.items = as_rows, .experts = args.experts, .pool = args.pool}));
  const NextnBlock& nb = *nextn_;
  const Layer& l = nb.layer;
  const int64_t N = rows.n_rows, E = hp_.n_embd;
  const size_t n_seq = args.items.size();
  std::vector<float> x(size_t(N) * E);  // [N][E] the block's residual stream
  nextn_input(args.items, N, x.data(), args.pool);

  std::vector<float> cur(size_t(N) * E), mix(size_t(N) * E);  // [N][E] a = RMSNorm(x), attention output
  std::vector<GatedAttentionSequence> attn(n_seq);
  for (size_t i = 0; i < n_seq; ++i)
    attn[i] = {.row0 = rows.row0[i], .n_rows = rows.row0[i + 1] - rows.row0[i], .kv = &args.items[i].cache->kv(0)};
  rms_norm_rows(x.data(), l.attn_norm, N, E, hp_.eps, cur.data(), args.pool);
  gated_attention_forward_batch(attn_shape_, l.attn, cur.data(), N, rows.pos.data(), attn, mix.data(), args.pool);
  add_f32(x.data(), mix.data(), N * E);
  if (Status s = ffn_step(l, x.data(), N, *args.experts, args.pool); !s) {
    for (size_t i = 0; i < n_seq; ++i) args.items[i].cache->kv(0).truncate(args.items[i].cache->n_past());
    return s.with_context("MTP block");
  }

  nextn_head(args.items, rows, x.data(), args.pool);
  for (size_t i = 0; i < n_seq; ++i) args.items[i].cache->advance(int32_t(rows.row0[i + 1] - rows.row0[i]));
  return Status::ok();
}

// Each item's rows through shared_head_norm and the head, one matmul for the batch: its last row, or every
// row when its logits hold one per token (teacher-forced evaluation of the draft head).
void Qwen35Moe::nextn_head(std::span<const NextnItem> items, const BatchRows& rows, const float* x,
                           ThreadPool* pool) const {
  const NextnBlock& nb = *nextn_;
  const int64_t E = hp_.n_embd, V = hp_.n_vocab;
  std::vector<int64_t> wanted;  // batch rows whose logits are asked for, in item order
  for (size_t i = 0; i < items.size(); ++i) {
    const bool all = items[i].logits.size() == items[i].tokens.size() * size_t(V);
    for (int64_t r = all ? rows.row0[i] : rows.row0[i + 1] - 1; r < rows.row0[i + 1]; ++r) wanted.push_back(r);
  }
  const int64_t n_out = int64_t(wanted.size());
  std::vector<float> normed(size_t(n_out * E));  // [n_out][E] head-normed
  for (int64_t o = 0; o < n_out; ++o)
    std::memcpy(normed.data() + o * E, x + wanted[size_t(o)] * E, size_t(E) * sizeof(float));
  rms_norm_rows(normed.data(), nb.head_norm, n_out, E, hp_.eps, normed.data(), pool);
  std::vector<float> logits(size_t(n_out * V));  // [n_out][V]
  matmul(nb.head, normed.data(), n_out, logits.data(), pool);
  size_t o = 0;
  for (const NextnItem& item : items) {
    std::memcpy(item.logits.data(), logits.data() + o * size_t(V), item.logits.size() * sizeof(float));
    o += item.logits.size() / size_t(V);
    if (!item.hidden_out.empty())  // the last row's
      std::memcpy(item.hidden_out.data(), normed.data() + (o - 1) * size_t(E), size_t(E) * sizeof(float));
  }
}

}  // namespace

Result<std::unique_ptr<Model>> load_qwen35moe(std::unique_ptr<GgufFile> file) {
  ESSAIM_ASSIGN_OR_RETURN(Qwen35Hparams hp, qwen35moe_read_hparams(*file));
  auto m = std::make_unique<Qwen35Moe>(std::move(file));
  ESSAIM_RETURN_IF_ERROR(m->bind(hp));
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace essaim
