#include "moe/executor.h"

#include <string>

namespace essaim {

Status ExpertStore::add(int32_t layer, const ExpertLayer& experts) {
  if (layer < 0) return Status::error("expert store: negative layer index");
  ESSAIM_RETURN_IF_ERROR(experts.validate().with_context("layer " + std::to_string(layer)));
  if (size_t(layer) >= layers_.size()) layers_.resize(size_t(layer) + 1);
  for (const ExpertLayer& held : layers_[size_t(layer)]) {
    const bool overlap = experts.expert_begin < held.expert_begin + held.n_experts &&
                         held.expert_begin < experts.expert_begin + experts.n_experts;
    if (overlap) return Status::error("layer " + std::to_string(layer) + ": expert range overlaps one already held");
    if (held.n_embd != experts.n_embd || held.n_ff != experts.n_ff || held.gate.type != experts.gate.type)
      return Status::error("layer " + std::to_string(layer) + ": expert ranges disagree on shapes or types");
  }
  layers_[size_t(layer)].push_back(experts);
  return Status::ok();
}

std::span<const ExpertLayer> ExpertStore::ranges(int32_t layer) const {
  if (layer < 0 || size_t(layer) >= layers_.size()) return {};
  return layers_[size_t(layer)];
}

const ExpertLayer* ExpertStore::find(int32_t layer, int32_t expert) const {
  for (const ExpertLayer& l : ranges(layer))
    if (l.holds(expert)) return &l;
  return nullptr;
}

const ExpertLayer* ExpertStore::any(int32_t layer) const {
  std::span<const ExpertLayer> r = ranges(layer);
  return r.empty() ? nullptr : &r.front();
}

bool ExpertStore::shape_only() const {
  bool any_range = false;
  for (const std::vector<ExpertLayer>& layer : layers_)
    for (const ExpertLayer& range : layer) {
      if (!range.shape_only()) return false;
      any_range = true;
    }
  return any_range;
}

Status validate_expert_batch(const ExpertBatch& batch, const ExpertLayer& layer, size_t out_size) {
  if (batch.n_rows < 0 || batch.k <= 0) return Status::error("expert batch: bad row or slot count");
  if (batch.act_type != layer.activation_type())
    return Status::error("expert batch: activations are " + std::string(type_name(batch.act_type)) +
                         ", layer " + std::to_string(batch.layer) + " needs " +
                         std::string(type_name(layer.activation_type())));
  const uint64_t n_pairs = uint64_t(batch.n_rows) * uint64_t(batch.k);
  if (batch.ids.size() != n_pairs) return Status::error("expert batch: ids size does not match rows × k");
  if (batch.act.size() != uint64_t(batch.n_rows) * layer.activation_row_bytes())
    return Status::error("expert batch: activation bytes do not match rows × row size");
  if (out_size != n_pairs * uint64_t(layer.n_embd))
    return Status::error("expert batch: output size does not match rows × k × n_embd");
  return Status::ok();
}

void round_requested_outputs(ExpertOutput mode, const ExpertBatch& batch, int32_t n_embd, std::span<float> out) {
  if (mode == ExpertOutput::F32) return;
  const size_t E = size_t(n_embd);
  for (size_t p = 0; p < batch.ids.size(); ++p)
    if (batch.ids[p] != -1 && (p + 1) * E <= out.size()) round_expert_outputs(mode, out.subspan(p * E, E));
}

Status LocalExpertExecutor::compute(const ExpertBatch& batch, std::span<float> out) {
  ESSAIM_RETURN_IF_ERROR(compute_f32(batch, out));
  if (output_ != ExpertOutput::F32) round_requested_outputs(output_, batch, store_.any(batch.layer)->n_embd, out);
  return Status::ok();
}

Status LocalExpertExecutor::compute_checked(const ExpertBatch& batch, std::span<float> out) {
  ESSAIM_RETURN_IF_ERROR(compute_f32_checked(batch, out));
  if (output_ != ExpertOutput::F32) round_requested_outputs(output_, batch, store_.any(batch.layer)->n_embd, out);
  return Status::ok();
}

Status LocalExpertExecutor::compute_f32(const ExpertBatch& batch, std::span<float> out) {
  std::span<const ExpertLayer> ranges = store_.ranges(batch.layer);
  if (ranges.empty()) return Status::error("no experts held for layer " + std::to_string(batch.layer));
  ESSAIM_RETURN_IF_ERROR(validate_expert_batch(batch, ranges.front(), out.size()));
  for (int32_t id : batch.ids)
    if (id != -1 && store_.find(batch.layer, id) == nullptr)
      return Status::error("layer " + std::to_string(batch.layer) + ": expert " + std::to_string(id) +
                           " is not held");
  return compute_f32_checked(batch, out);
}

Status LocalExpertExecutor::compute_f32_checked(const ExpertBatch& batch, std::span<float> out) {
  std::span<const ExpertLayer> ranges = store_.ranges(batch.layer);
  if (ranges.size() == 1)
    return expert_ffn(ranges.front(), batch.act.data(), batch.n_rows, batch.k, batch.ids.data(), out.data(), pool_);
  // Several ranges: each computes its own slots of the shared output (others masked to -1).
  std::vector<int32_t> masked(batch.ids.size());
  for (const ExpertLayer& range : ranges) {
    bool any = false;
    for (size_t i = 0; i < masked.size(); ++i) {
      masked[i] = range.holds(batch.ids[i]) ? batch.ids[i] : -1;
      any = any || masked[i] != -1;
    }
    if (any)
      ESSAIM_RETURN_IF_ERROR(
          expert_ffn(range, batch.act.data(), batch.n_rows, batch.k, masked.data(), out.data(), pool_));
  }
  return Status::ok();
}

}  // namespace essaim
