// A loaded model: an architecture (one file each, behind the registry) bound to a memory-mapped GGUF.
//
//   ESSAIM_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, load_model("model.gguf", {.mlock = false}));
//   SequenceCache cache = m->new_cache({});
//   LocalExpertExecutor local(m->expert_store(), &pool);
//   std::vector<float> logits(m->info().n_vocab);
//   ESSAIM_RETURN_IF_ERROR(m->forward({.tokens = ids, .cache = &cache, .experts = &local, .pool = &pool,
//                                      .logits_mode = LogitsMode::LAST, .logits = logits}));
//   // One step of several sequences (continuous batching): each item its own cache, tokens and logits.
//   std::vector<BatchItem> items = {{.tokens = decode_row, .cache = &a, .logits = la},
//                                   {.tokens = prompt_chunk, .cache = &b, .logits_mode = LogitsMode::NONE}};
//   ESSAIM_RETURN_IF_ERROR(m->forward_batch({.items = items, .experts = &local, .pool = &pool}));
//
// forward() appends the tokens at positions cache.n_past() onward and is const: all per-sequence state is
// in the cache, so one model serves many sequences. Results are bit-identical whatever the chunking of a
// prompt into forward() calls and whatever the thread count (docs/invariants.md invariant 2).
// Every routed expert is computed through the ExpertExecutor passed in; the model never calls expert
// kernels itself. expert_store() exposes views of all routed experts of the file (the local replica).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "gguf/gguf_file.h"
#include "kernels/matmul.h"
#include "model/cache.h"
#include "moe/executor.h"

namespace essaim {

class TensorBinder;

struct ModelInfo {
  std::string arch;
  std::string name;             // general.name, may be empty
  int32_t n_vocab = 0;
  int32_t n_embd = 0;
  int32_t n_layer = 0;          // executed layers
  int32_t n_ctx_train = 0;
  int32_t n_expert = 0;
  int32_t n_expert_used = 0;
  uint64_t weight_bytes = 0;    // tensor data bytes in the file
  uint64_t expert_bytes = 0;    // of which routed experts
  uint64_t active_bytes_per_token = 0;  // weights one decoded token reads: dense + k experts per MoE layer
  // Per sequence, the recurrent layers' conv windows and delta-rule states (0 without recurrent layers): a
  // decoded token reads each once and writes it back, memory traffic beside the weights it streams.
  uint64_t recurrent_state_bytes = 0;
};

struct LoadOptions {
  bool mlock = false;  // pin the mapping in RAM (fails without the privilege / ulimit)
  // Read the file into private memory instead of mapping it (llama.cpp's --no-mmap): the file's size in
  // RAM and one read at load; weight streams ran up to 12 % faster on an Intel VM (docs/engine.md).
  bool no_mmap = false;
  // The file is an `essaim slice --backbone` file: the dense path from its bytes, the routed experts from
  // its records only (a shape-only expert store: expert_store().shape_only()), to be served by workers.
  // A backbone file without this flag, or a full model with it, is refused with a message saying which.
  bool backbone_file = false;
};

struct CacheOptions {
  KvType kv_type = KvType::F16;
  int32_t n_ctx = 0;  // 0: the model's training context, capped at kDefaultMaxContext
};
inline constexpr int32_t kDefaultMaxContext = 8192;

enum class LogitsMode : int32_t {
  ALL,   // one row per token (teacher-forced evaluation)
  LAST,  // only the last token's row (generation)
  NONE,  // none (prefill ahead of more tokens)
};

struct ForwardArgs {
  std::span<const int32_t> tokens;
  SequenceCache* cache = nullptr;
  ExpertExecutor* experts = nullptr;
  ThreadPool* pool = nullptr;
  LogitsMode logits_mode = LogitsMode::ALL;
  std::span<float> logits;  // [n_out][n_vocab]: n_out = tokens.size(), 1 or 0 by mode
};

// One sequence's share of a batched step: its new tokens (decode: one; prefill: a chunk), its cache and
// which logits it wants. Every item of a batch has its own cache.
struct BatchItem {
  std::span<const int32_t> tokens;
  SequenceCache* cache = nullptr;
  LogitsMode logits_mode = LogitsMode::LAST;
  std::span<float> logits;  // as ForwardArgs::logits
  // Optional: the final normed state (the LM head's input), what an MTP (nextn) block drafts from; of the
  // rows whose logits are output ([n_out][n_embd]) or of every row ([tokens.size()][n_embd]), by its size.
  std::span<float> hidden;
  // Keep the recurrent states after each row, so SequenceCache::cut_back can return to any prefix of these
  // tokens (speculative verification). Costs one state copy per row and recurrent layer.
  bool keep_row_states = false;
};

// One sequence's share of an MTP (nextn) block's step: the block at positions p..p+T-1 of its own cache
// (p = cache->n_past()), fed for position i the main stack's final normed state of position i and the token
// of position i + 1. It predicts the token of position i + 2.
struct NextnItem {
  std::span<const float> hidden;    // [T][n_embd] main stack's final normed states (BatchItem::hidden)
  std::span<const int32_t> tokens;  // [T] the tokens one position later
  SequenceCache* cache = nullptr;   // from new_nextn_cache
  std::span<float> logits;          // [n_vocab]: the last row's; or [T][n_vocab]: every row's
  std::span<float> hidden_out;      // optional [n_embd]: the last row's normed output (the head's input)
};

struct NextnBatchArgs {
  std::span<const NextnItem> items;
  ExpertExecutor* experts = nullptr;
  ThreadPool* pool = nullptr;
};

struct BatchForwardArgs {
  std::span<const BatchItem> items;
  ExpertExecutor* experts = nullptr;
  ThreadPool* pool = nullptr;
};

class Model {
 public:
  virtual ~Model() = default;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelInfo& info() const { return info_; }
  const GgufFile& file() const { return *file_; }
  const ExpertStore& expert_store() const { return experts_; }

  virtual SequenceCache new_cache(const CacheOptions& options) const = 0;
  // Untrusted-input errors (token id out of range, context full, executor failure) are values; the cache
  // is left unchanged on error.
  virtual Status forward(const ForwardArgs& args) const = 0;
  // Several sequences in one step (continuous batching). Results are bit-identical to calling forward() on
  // each item in turn (docs/invariants.md invariant 2). An architecture that overrides it runs all rows of all
  // items through each layer together, so each MoE layer makes one ExpertExecutor call for the whole
  // batch (both architectures here do; their forward() is a one-item batch). This default runs the items
  // one after another: correct, but one executor call per item.
  // Arguments of every item are checked before any runs (tokens in range, room in its cache, a cache no
  // other item uses). The overrides are all-or-nothing: on any error no cache changes. The default may
  // leave items before a failing one advanced (the caller fails the whole step).
  virtual Status forward_batch(const BatchForwardArgs& args) const;

  // The MTP (nextn) draft block, where the architecture and the file have one (docs/speculative.md): its
  // layer index is info().n_layer (its experts are routed through the executor like any layer's). All rows
  // of all items go through it together (one executor call); all-or-nothing as forward_batch.
  virtual bool has_nextn() const { return false; }
  virtual SequenceCache new_nextn_cache(const CacheOptions& options) const;
  virtual Status forward_nextn_batch(const NextnBatchArgs& args) const;

 protected:
  explicit Model(std::unique_ptr<GgufFile> file) : file_(std::move(file)) {}

  // The rows of a batched step: the items' tokens concatenated in item order.
  struct BatchRows {
    int64_t n_rows = 0;           // N = Σ T_i
    std::vector<int64_t> row0;    // [n_items + 1]: first row of each item; row0[n_items] = N
    std::vector<int32_t> pos;     // [N] each row's absolute position in its own sequence
    std::vector<int32_t> tokens;  // [N]
  };
  // Checks every item before anything runs — tokens in range, room in its cache, no cache shared by two
  // items — and lays out the rows. Errors name the item.
  Result<BatchRows> prepare_batch(const BatchForwardArgs& args) const;
  // forward() as a one-item forward_batch(): one code path for both.
  Status forward_as_batch(const ForwardArgs& args) const;
  // Embedding rows: x [N][E] from tok_embd's rows of the tokens.
  static void embed_rows(const WeightMatrix& tok_embd, std::span<const int32_t> tokens, int64_t E, float* x);
  // Final RMSNorm and LM head over the rows each item's logits_mode asks for, one matmul for the whole
  // batch: x [N][E] → every item's logits [n_out_i][V].
  // Also copies each item's normed rows into its `hidden` when given.
  static void lm_head_batch(const BatchForwardArgs& args, const BatchRows& rows, const float* x, int64_t E,
                            const float* output_norm, float eps, const WeightMatrix& output);
  int32_t resolve_n_ctx(const CacheOptions& options) const;
  static void copy_hidden(const BatchItem& item, const BatchRows& rows, size_t i, const float* x, int64_t E,
                          const float* output_norm, float eps, std::span<const float> normed, size_t first,
                          ThreadPool* pool);

  // After a failed step: every item's K/V written by this step in layers 0..il dropped (recurrent layers'
  // states were written aside and are left alone), so every cache is as it was.
  static void drop_step_kv(const BatchForwardArgs& args, const BatchRows& rows, int32_t il);

  // token_embd, output_norm and output (token_embd when the file has none: tied) bound into tok_embd_,
  // output_norm_ and output_. Returns token_embd's tensor and output's (null when tied) for describe().
  struct HeadTensors {
    const GgufTensor* embd = nullptr;
    const GgufTensor* out = nullptr;
  };
  Result<HeadTensors> bind_embedding_and_head(TensorBinder& b, int64_t n_embd, int64_t n_vocab);
  // What bind() counted: the executed layers' routed experts, K of them per layer, and bytes no decoded
  // token reads (MTP blocks).
  struct WeightBytes {
    uint64_t experts = 0;
    uint64_t active_experts = 0;
    uint64_t unread = 0;
  };
  // info_: the shape fields of hp (every architecture's hyperparameters name them alike), general.name and
  // the byte counts.
  template <typename Hparams>
  void describe(std::string arch, const Hparams& hp, HeadTensors head, WeightBytes bytes) {
    describe(ModelInfo{.arch = std::move(arch), .name = {}, .n_vocab = hp.n_vocab, .n_embd = hp.n_embd,
                       .n_layer = hp.n_layer, .n_ctx_train = hp.n_ctx_train, .n_expert = hp.n_expert,
                       .n_expert_used = hp.n_expert_used},
             head, bytes);
  }
  void describe(ModelInfo shape, HeadTensors head, WeightBytes bytes);

  std::unique_ptr<GgufFile> file_;
  ModelInfo info_;
  ExpertStore experts_;
  WeightMatrix tok_embd_;               // [E -> V] rows = tokens
  const float* output_norm_ = nullptr;  // [E]
  WeightMatrix output_;                 // [E -> V], token_embd when tied
};

// Opens the GGUF file (mmap, no copy), picks the architecture from general.architecture and binds it.
Result<std::unique_ptr<Model>> load_model(const std::string& path, const LoadOptions& options = {});
// Same from an already opened file (tests build files in memory).
Result<std::unique_ptr<Model>> load_model(std::unique_ptr<GgufFile> file, const LoadOptions& options = {});
std::vector<std::string_view> supported_architectures();

}  // namespace essaim
