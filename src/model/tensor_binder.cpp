#include "model/tensor_binder.h"

#include <cstring>

#include "kernels/matmul.h"
#include "kernels/quantize.h"

namespace essaim {
namespace {

std::string shape_str(const int64_t* ne, size_t n) {
  std::string s = "[";
  for (size_t i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

bool shape_matches(const GgufTensor& t, const std::vector<int64_t>& want) {
  for (size_t d = 0; d < 4; ++d)
    if (t.ne[d] != (d < want.size() ? want[d] : 1)) return false;
  return true;
}

}  // namespace

Result<const GgufTensor*> TensorBinder::bind(TensorName name, int32_t il,
                                             const std::vector<std::vector<int64_t>>& shapes, TensorKind kind,
                                             bool required) {
  const std::string n = tensor_name(name, il);
  const GgufTensor* t = file_.find_tensor(n);
  if (!t) {
    if (required) return Status::error("required tensor '" + n + "' is missing");
    return static_cast<const GgufTensor*>(nullptr);
  }
  bool ok = false;
  for (const auto& s : shapes) ok = ok || shape_matches(*t, s);
  if (!ok) {
    std::string want;
    for (size_t i = 0; i < shapes.size(); ++i)
      want += (i ? " or " : "") + shape_str(shapes[i].data(), shapes[i].size());
    return Status::error("tensor '" + n + "' has shape " + shape_str(t->ne.data(), t->n_dims ? t->n_dims : 1) +
                         ", expected " + want);
  }
  if (kind == TensorKind::F32 && t->type != GgmlType::F32)
    return Status::error("tensor '" + n + "' has type " + std::string(type_name(t->type)) + ", expected F32");
  if (kind == TensorKind::F32 && reinterpret_cast<uintptr_t>(t->data) % alignof(float) != 0)
    return Status::error("tensor '" + n + "' data is not 4-byte aligned (general.alignment too small)");
  if (kind == TensorKind::MATRIX && !matmul_type_supported(t->type))  // Q8_K is activation-only
    return Status::error("tensor '" + n + "' has type " + std::string(type_name(t->type)) +
                         ", which essaim has no kernels for");
  claimed_.insert(n);
  return t;
}

Result<const GgufTensor*> TensorBinder::require(TensorName t, int32_t il, std::initializer_list<int64_t> ne,
                                                TensorKind kind) {
  return bind(t, il, {std::vector<int64_t>(ne)}, kind, true);
}

Result<const GgufTensor*> TensorBinder::require_one_of(TensorName t, int32_t il,
                                                       const std::vector<std::vector<int64_t>>& shapes,
                                                       TensorKind kind) {
  return bind(t, il, shapes, kind, true);
}

Result<const GgufTensor*> TensorBinder::optional(TensorName t, int32_t il, std::initializer_list<int64_t> ne,
                                                 TensorKind kind) {
  return bind(t, il, {std::vector<int64_t>(ne)}, kind, false);
}

bool TensorBinder::has(TensorName t, int32_t il) const { return file_.find_tensor(tensor_name(t, il)) != nullptr; }

Status TensorBinder::finish() const {
  std::string extra;
  size_t n_extra = 0;
  for (const GgufTensor& t : file_.tensors()) {
    if (claimed_.count(t.name)) continue;
    if (n_extra < 5) extra += (n_extra ? ", '" : "'") + t.name + "'";
    ++n_extra;
  }
  if (n_extra == 0) return Status::ok();
  if (n_extra > 5) extra += " and " + std::to_string(n_extra - 5) + " more";
  return Status::error("unexpected tensor" + std::string(n_extra > 1 ? "s " : " ") + extra +
                       " not used by this architecture");
}

WeightMatrix weight_matrix(const GgufTensor& t) {
  return WeightMatrix{.type = t.type, .cols = t.ne[0], .rows = t.ne[1], .data = t.data,
                      .row_stride = t.row_bytes()};
}

const float* f32_data(const GgufTensor& t) {
  ESSAIM_CHECK(t.type == GgmlType::F32);
  ESSAIM_CHECK(reinterpret_cast<uintptr_t>(t.data) % alignof(float) == 0);
  return reinterpret_cast<const float*>(t.data);
}

ExpertLayer::Tensor3d expert_tensor(const GgufTensor& t) {
  return ExpertLayer::Tensor3d{.type = t.type, .cols = t.ne[0], .rows = t.ne[1], .n_experts = t.ne[2],
                               .data = t.data};
}

}  // namespace essaim
