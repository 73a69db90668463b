// Expert executors: the one interface through which the backbone gets routed-expert outputs, whoever
// computes them. The model calls an executor for every MoE layer and never calls expert kernels itself.
//
//   ExpertStore store;                                     // views of the experts this process holds
//   ESSAIM_RETURN_IF_ERROR(store.add(layer_index, expert_layer));
//   LocalExpertExecutor local(store, &pool);
//   ExpertBatch batch{.layer = il, .n_rows = n, .k = k, .act_type = t, .act = fq, .ids = ids};
//   ESSAIM_RETURN_IF_ERROR(local.compute(batch, out));    // out: [n][k][n_embd], unweighted
//
// Contract for every executor (local now; remote, with deadline and local fallback, next):
// - out[r][s] is the unweighted output of expert ids[r][s] on activation row r, bit-identical to what
//   expert_ffn computes from the same bytes; slots whose id is -1 are left untouched.
// - The weighted combine Σ_k w_k·y_k (slot order) is the caller's, never the executor's.
// - The activation rows are already in the layer's activation format (act_type), quantised once per row.
// A remote executor splits a batch by owner (ids of other owners masked to -1), sends one request per
// owner, and every answer fills its own slots of the same `out`.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/expert_output.h"
#include "core/ggml_type.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "moe/expert_ffn.h"

namespace essaim {

struct ExpertBatch {
  int32_t layer = 0;
  int64_t n_rows = 0;
  int32_t k = 0;
  GgmlType act_type = GgmlType::F32;  // format of the activation rows (vec_dot type of the gate/up weights)
  std::span<const uint8_t> act;       // [n_rows][activation_row_bytes]
  std::span<const int32_t> ids;       // [n_rows][k] global expert ids, -1 = not requested
};

class ExpertExecutor {
 public:
  virtual ~ExpertExecutor() = default;
  // out.size() must be n_rows * k * n_embd.
  virtual Status compute(const ExpertBatch& batch, std::span<float> out) = 0;
  // Whether compute may fail on a batch the model sends (a worker lost with no replica left, a device
  // error). A model keeps what a failed step must not change — recurrent states — aside while such an
  // executor runs, and advances them in place (a third less memory traffic) when it cannot fail.
  virtual bool may_fail() const { return true; }
};

// The experts a process holds: per layer, one or more disjoint expert ranges (the backbone holds every
// expert of every MoE layer as one range; a worker holds the ranges of its slices).
class ExpertStore {
 public:
  // Validates the layer (untrusted when it comes from a slice) and refuses a range overlapping one held.
  Status add(int32_t layer, const ExpertLayer& experts);

  int32_t n_layers() const { return int32_t(layers_.size()); }  // one past the highest layer index added
  std::span<const ExpertLayer> ranges(int32_t layer) const;      // empty when none held
  const ExpertLayer* find(int32_t layer, int32_t expert) const;  // the range holding it, or nullptr
  // Every range of a layer must agree on these; nullptr when the layer holds nothing.
  const ExpertLayer* any(int32_t layer) const;
  // True when the store holds experts and none of them has bytes (a backbone loaded from a backbone file):
  // whoever dispatches from it has no replica of last resort.
  bool shape_only() const;

 private:
  std::vector<std::vector<ExpertLayer>> layers_;
};

// Computes every requested expert from a store, in this process. Under ExpertOutput::BF16 every slot it
// writes is rounded to bf16 (core/expert_output.h) before it returns, so the combine sees what a worker in
// that mode would have sent; F32 (the default) leaves expert_ffn's bits as they are.
class LocalExpertExecutor final : public ExpertExecutor {
 public:
  LocalExpertExecutor(const ExpertStore& store, ThreadPool* pool, ExpertOutput output = ExpertOutput::F32)
      : store_(store), pool_(pool), output_(output) {}
  // Checks the batch against the store (layer held, act_type and sizes match, every id held) first.
  Status compute(const ExpertBatch& batch, std::span<float> out) override;
  // compute() without the checks, for a caller that has made them against this same store (the remote
  // executor's share and fallbacks: it validates each batch once, before anything is sent).
  Status compute_checked(const ExpertBatch& batch, std::span<float> out);
  // Its only errors are batches that do not match its store, which a model loaded with that store never
  // sends (a model that does anyway resets the sequences it could not roll back).
  bool may_fail() const override { return false; }
  ExpertOutput output() const { return output_; }

 private:
  Status compute_f32(const ExpertBatch& batch, std::span<float> out);
  Status compute_f32_checked(const ExpertBatch& batch, std::span<float> out);
  const ExpertStore& store_;
  ThreadPool* pool_;
  ExpertOutput output_;
};

// Rounds the slots of `out` a batch asked for (id != -1) to the mode's precision; untouched slots stay as
// they are (another owner may have written them). Every executor that honours a mode calls this.
void round_requested_outputs(ExpertOutput mode, const ExpertBatch& batch, int32_t n_embd, std::span<float> out);

// Checks the parts of a batch that do not depend on who computes it: counts, sizes consistent with
// `layer`, activation format. Which ids are held is the executor's check. Shared with the worker.
Status validate_expert_batch(const ExpertBatch& batch, const ExpertLayer& layer, size_t out_size);

}  // namespace essaim
