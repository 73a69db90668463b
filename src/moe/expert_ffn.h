// The routed expert FFN as a pure function — the cut point of the whole system (docs/invariants.md "Two roles").
//
//   ExpertLayer layer = ExpertLayer::separate({...gate view...}, {...up view...}, {...down view...});
//   std::vector<uint8_t> fq(n * layer.activation_row_bytes());
//   quantize_activations(layer.gate.type, f, n, layer.n_embd, fq.data());       // once per row
//   ESSAIM_RETURN_IF_ERROR(expert_ffn(layer, fq.data(), n, k, ids, out, &pool));  // out: [n][k][n_embd]
//
// For every row r and slot s with e = ids[r][s]:
//     out[r][s] = W_down[e] · q(silu(W_gate[e] · f_r) ⊙ (W_up[e] · f_r))            -- unweighted y_k
// where f_r arrives already converted to the gate/up weights' vec_dot format (Q8_K for K-quants; docs/reference.md
// 2.5/2.6) and q(·) converts each intermediate row to the down weights' vec_dot format on its own. Because the
// function consumes the quantised bytes, a worker given the same bytes computes bit-identical rows to the
// backbone's own (docs/invariants.md invariant 1). The routing weights are not applied here: the weighted combine in
// slot order stays on the backbone.
//
// Work is grouped by expert: all (row, slot) pairs that selected expert e go through e's matrices together,
// so each active expert's bytes are streamed once per call. The matmul kernels are batch-invariant, so the
// grouping does not change any result.
//
// An id of -1 means "slot not requested": its output row is left untouched. This lets a dispatcher split
// one batch by owner and have every owner write its own slots of one shared output buffer.
#pragma once

#include <cstdint>

#include "core/ggml_type.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "kernels/matmul.h"

namespace essaim {

// One projection of a range of experts, as a view of the bytes: expert j (0-based within the view) is the
// [rows][cols] matrix whose row o starts at data + j * expert_stride + o * row_stride.
struct ExpertMatrices {
  GgmlType type = GgmlType::F32;
  int64_t cols = 0;            // input width
  int64_t rows = 0;            // output width
  const uint8_t* data = nullptr;
  uint64_t row_stride = 0;     // = type_traits(type).row_bytes(cols)
  uint64_t expert_stride = 0;  // ≥ rows * row_stride (larger for one half of a fused gate_up tensor)

  WeightMatrix expert(int32_t j) const {
    return WeightMatrix{.type = type, .cols = cols, .rows = rows, .data = data + uint64_t(j) * expert_stride,
                        .row_stride = row_stride};
  }
};

// The routed experts of one MoE layer, or a contiguous range of them (an expert slice holds
// [expert_begin, expert_begin + n_experts) of the model's experts). Ids passed to expert_ffn are global.
struct ExpertLayer {
  int32_t n_embd = 0;
  int32_t n_ff = 0;
  int32_t expert_begin = 0;
  int32_t n_experts = 0;
  ExpertMatrices gate;  // [n_embd -> n_ff]
  ExpertMatrices up;    // [n_embd -> n_ff]
  ExpertMatrices down;  // [n_ff -> n_embd]

  struct Tensor3d {            // a *_exps tensor as stored: ne = [cols, rows, n_experts]
    GgmlType type;
    int64_t cols, rows, n_experts;
    const uint8_t* data;
  };
  // Separate ffn_{gate,up,down}_exps tensors.
  static ExpertLayer separate(const Tensor3d& gate, const Tensor3d& up, const Tensor3d& down,
                              int32_t expert_begin = 0);
  // A fused ffn_gate_up_exps tensor [n_embd, 2*n_ff, X]: per expert, rows 0..F-1 gate, F..2F-1 up.
  static ExpertLayer fused(const Tensor3d& gate_up, const Tensor3d& down, int32_t expert_begin = 0);

  // The format activations arrive in (the gate/up weights' vec_dot type) and one row's size in it.
  GgmlType activation_type() const { return type_traits(gate.type).vec_dot_type; }
  uint64_t activation_row_bytes() const { return essaim::activation_row_bytes(gate.type, n_embd); }
  bool holds(int32_t expert) const { return expert >= expert_begin && expert - expert_begin < n_experts; }
  // Shapes and types without bytes (a backbone loaded from a backbone file, docs/dispatch.md): enough to
  // quantise activations and size answers; expert_ffn refuses to compute it.
  bool shape_only() const { return gate.data == nullptr && up.data == nullptr && down.data == nullptr; }

  // Shapes agree, types are computable, gate and up share one activation format, strides cover the rows,
  // and either every view has bytes or none has (shape_only).
  // Errors are values: a slice read from disk is untrusted.
  Status validate() const;
};

// out: [n_rows][k][n_embd] floats. ids: [n_rows][k], each a held expert id or -1. act: [n_rows] rows of
// layer.activation_row_bytes() bytes. An id outside the layer's range is an error (nothing is computed).
Status expert_ffn(const ExpertLayer& layer, const uint8_t* act, int64_t n_rows, int32_t k, const int32_t* ids,
                  float* out, ThreadPool* pool);

}  // namespace essaim
