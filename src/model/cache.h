// Per-sequence state of the backbone: one entry per layer, whose kind follows the layer — a KV cache for
// softmax-attention layers, a recurrent state (conv window + delta-rule state) for linear-attention layers
// (qwen35moe's Gated DeltaNet), nothing for layers without state.
//
//   SequenceCache cache = model.new_cache({.kv_type = KvType::F16, .n_ctx = 4096});
//   model.forward({.tokens = prompt, .cache = &cache, ...});   // appends at positions n_past..
//   cache.reset();                                              // a new sequence
//
// KV entries are stored rounded to the cache type (f16 by default, as llama.cpp does), including the
// current token's own K/V, and read back as f32. Positions are dense: entry j holds position j.
#pragma once

#include <cstdint>
#include <variant>
#include <vector>

#include "core/status.h"

namespace essaim {

enum class KvType : int32_t { F16 = 0, F32 = 1 };

class KvCache {
 public:
  KvCache(KvType type, int32_t n_kv_heads, int32_t head_dim);

  KvType type() const { return type_; }
  int32_t n_kv_heads() const { return n_kv_heads_; }
  int32_t head_dim() const { return head_dim_; }
  int32_t size() const { return size_; }  // positions stored

  // Stores K and V ([n_kv_heads][head_dim] each) of position pos; pos ≤ size() (pos == size() appends).
  void store(int32_t pos, const float* k, const float* v);
  // Reads K (or V) of head g for positions [j0, j1) into dst [j1 - j0][head_dim] as f32.
  void load_k(int32_t g, int32_t j0, int32_t j1, float* dst) const;
  void load_v(int32_t g, int32_t j0, int32_t j1, float* dst) const;

  void truncate(int32_t n);  // forget positions ≥ n
  // Becomes positions [0, n) of `from` (same type and shape, n ≤ from.size()), byte for byte: what storing
  // those positions would have written (a prompt cache restoring a shared prefix).
  void assign_prefix(const KvCache& from, int32_t n);
  uint64_t bytes() const { return uint64_t(k_.size() + v_.size()); }

 private:
  void put(std::vector<uint8_t>& buf, int32_t pos, const float* src);
  void get(const std::vector<uint8_t>& buf, int32_t g, int32_t j0, int32_t j1, float* dst) const;

  KvType type_;
  int32_t n_kv_heads_, head_dim_;
  int32_t size_ = 0;
  std::vector<uint8_t> k_, v_;  // [pos][n_kv_heads][head_dim] of f16 or f32
};

// A linear-attention layer's state (qwen35moe GDN, docs/reference.md 5.6/5.8): the last Kc−1 convolution input
// columns and the per-head delta-rule matrices, both f32 and zero for a new sequence. The architecture that
// owns the layer sizes and interprets them.
struct RecurrentState {
  std::vector<float> conv;   // [(Kc-1)][conv_channels]
  std::vector<float> state;  // [Hv][Dv][Dk] (value-major, as llama.cpp)
  // Where a forward pass writes the advanced conv/state while its expert executor may fail (same sizes,
  // allocated on first use); swapped with conv/state only once the whole forward succeeded, so a failed call
  // leaves the sequence as it was. Costs a second copy of the state per sequence; recurrent state cannot be
  // rolled back otherwise. Empty while the states advance in place (an executor that cannot fail).
  std::vector<float> conv_next;
  std::vector<float> state_next;
  // The conv window and state after each row of the last forward that kept them (BatchItem::keep_row_states),
  // [rows][Kc-1][C] and [rows][Hv][Dv][Dk]: what SequenceCache::cut_back restores. Empty otherwise.
  std::vector<float> conv_rows;
  std::vector<float> state_rows;
  void reset();
};

using LayerCache = std::variant<std::monostate, KvCache, RecurrentState>;

class SequenceCache {
 public:
  SequenceCache() = default;
  SequenceCache(std::vector<LayerCache> layers, int32_t n_ctx) : layers_(std::move(layers)), n_ctx_(n_ctx) {}

  int32_t n_past() const { return n_past_; }  // tokens already processed; the next one gets this position
  int32_t n_ctx() const { return n_ctx_; }    // most positions this sequence may hold
  int32_t n_layers() const { return int32_t(layers_.size()); }
  LayerCache& layer(int32_t il) { return layers_[size_t(il)]; }
  const LayerCache& layer(int32_t il) const { return layers_[size_t(il)]; }
  KvCache& kv(int32_t il) { return std::get<KvCache>(layers_[size_t(il)]); }
  RecurrentState& recurrent(int32_t il) { return std::get<RecurrentState>(layers_[size_t(il)]); }

  // Error when n more tokens do not fit.
  Status check_room(int64_t n) const;
  void advance(int32_t n) { n_past_ += n; }
  // The last forward kept the recurrent states after each of its rows, positions [first, first + n).
  void set_kept_rows(int32_t first, int32_t n) { kept_first_ = first, kept_count_ = n; }
  // Back to n_past = n ≤ n_past(), exactly as if the tokens after n had never been processed (speculative
  // decoding's rejected drafts): KV entries from n on are dropped; recurrent states, which cannot be rolled
  // back, are restored from the rows the last forward kept, so n must end one of them (or equal n_past()).
  // A cache without recurrent layers can be cut back anywhere. Errors leave the cache unchanged.
  Status cut_back(int32_t n);
  // Back to an empty sequence: KV emptied, recurrent states zeroed.
  void reset();
  uint64_t bytes() const;

 private:
  std::vector<LayerCache> layers_;
  int32_t n_ctx_ = 0;
  int32_t n_past_ = 0;
  int32_t kept_first_ = 0, kept_count_ = 0;  // the rows whose recurrent states are kept (set_kept_rows)
};

}  // namespace essaim
