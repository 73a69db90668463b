// Binding a GGUF file's tensors to an architecture's weights: names come from the TensorName table, shapes
// and types are checked, and at the end every tensor of the file must have been claimed (llama.cpp refuses
// extra tensors too — docs/reference.md 9). Errors name the tensor.
//
//   TensorBinder b(file);
//   ESSAIM_ASSIGN_OR_RETURN(const GgufTensor* q, b.require(TensorName::ATTN_Q, il, {E, H * D}));
//   ESSAIM_ASSIGN_OR_RETURN(const GgufTensor* out, b.optional(TensorName::OUTPUT, -1, {E, V}));  // may be null
//   ESSAIM_RETURN_IF_ERROR(b.finish());                       // "unexpected tensor 'blk.0.foo.weight'"
//
//   WeightMatrix wq = weight_matrix(*q);   // a 2-D view for matmul
//   const float* norm = f32_data(*n);      // a 1-D F32 vector
#pragma once

#include <cstdint>
#include <initializer_list>
#include <set>
#include <string>
#include <vector>

#include "core/status.h"
#include "gguf/gguf_file.h"
#include "kernels/matmul.h"
#include "gguf/tensor_names.h"
#include "moe/expert_ffn.h"

namespace essaim {

// What a tensor's element type may be.
enum class TensorKind : int32_t {
  MATRIX,  // any type essaim has kernels for (multiplied through matmul)
  F32,     // exactly F32 (norm weights, biases, 1-D parameters: docs/reference.md 10.26)
  ANY,     // not used in computation by this engine (e.g. MTP blocks): only the shape is checked
};

class TensorBinder {
 public:
  explicit TensorBinder(const GgufFile& file) : file_(file) {}

  // The tensor named t (of layer il), which must exist with extents `ne` (ggml order; omitted trailing
  // extents are 1). Alternatives: a tensor may match any of several shapes.
  Result<const GgufTensor*> require(TensorName t, int32_t il, std::initializer_list<int64_t> ne,
                                    TensorKind kind = TensorKind::MATRIX);
  Result<const GgufTensor*> require_one_of(TensorName t, int32_t il,
                                           const std::vector<std::vector<int64_t>>& shapes,
                                           TensorKind kind = TensorKind::MATRIX);
  // Like require, but absence yields nullptr (a present tensor is still checked).
  Result<const GgufTensor*> optional(TensorName t, int32_t il, std::initializer_list<int64_t> ne,
                                     TensorKind kind = TensorKind::MATRIX);
  bool has(TensorName t, int32_t il = -1) const;

  // Error naming the first tensors of the file nobody claimed.
  Status finish() const;

 private:
  Result<const GgufTensor*> bind(TensorName t, int32_t il, const std::vector<std::vector<int64_t>>& shapes,
                                 TensorKind kind, bool required);

  const GgufFile& file_;
  std::set<std::string, std::less<>> claimed_;
};

// Views of bound tensors. Callers have checked the kind through the binder.
WeightMatrix weight_matrix(const GgufTensor& t);           // 2-D [cols, rows]
const float* f32_data(const GgufTensor& t);                // F32 tensor
ExpertLayer::Tensor3d expert_tensor(const GgufTensor& t);  // 3-D [cols, rows, n_experts]

}  // namespace essaim
