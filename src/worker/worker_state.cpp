#include "worker/worker_state.h"

#include <algorithm>
#include <utility>

#include "slice/expert_digest.h"
#include "kernels/kernel_traits.h"

namespace essaim::worker {

namespace {

ExpertLayer::Tensor3d view(const GgufTensor& t) {
  return ExpertLayer::Tensor3d{.type = t.type, .cols = t.ne[0], .rows = t.ne[1], .n_experts = t.ne[2],
                               .data = t.data};
}

// The moe view of one layer of a slice. ExpertSlice has already checked that the layer holds exactly the
// tensors its fused flag calls for, with the shapes its metadata names.
Result<ExpertLayer> expert_layer_of(const ExpertSlice& s, const MoeLayer& l) {
  const GgufTensor* down = l.tensor(ExpertTensorKind::DOWN);
  if (down == nullptr) return Status::error("layer " + std::to_string(l.layer) + " has no ffn_down_exps");
  const auto first = int32_t(s.expert_first());
  if (s.gate_up_fused()) {
    const GgufTensor* gate_up = l.tensor(ExpertTensorKind::GATE_UP);
    if (gate_up == nullptr) return Status::error("layer " + std::to_string(l.layer) + " has no ffn_gate_up_exps");
    return ExpertLayer::fused(view(*gate_up), view(*down), first);
  }
  const GgufTensor* gate = l.tensor(ExpertTensorKind::GATE);
  const GgufTensor* up = l.tensor(ExpertTensorKind::UP);
  if (gate == nullptr || up == nullptr)
    return Status::error("layer " + std::to_string(l.layer) + " lacks ffn_gate_exps or ffn_up_exps");
  return ExpertLayer::separate(view(*gate), view(*up), view(*down), first);
}

}  // namespace

proto::BuildFingerprint build_fingerprint() {
  return proto::BuildFingerprint{.kernel_abi = kKernelAbiVersion, .isa_class = std::string(isa_name(kernels_isa()))};
}

Result<WorkerState> WorkerState::open(const std::vector<std::string>& slice_paths) {
  std::vector<ExpertSlice> slices;
  slices.reserve(slice_paths.size());
  for (const std::string& path : slice_paths) {
    Result<ExpertSlice> s = ExpertSlice::open(path);
    if (!s) return s.status().with_context(path);
    slices.push_back(std::move(*s));
  }
  return from_slices(std::move(slices));
}

Result<WorkerState> WorkerState::from_slices(std::vector<ExpertSlice> slices) {
  if (slices.empty()) return Status::error("a worker needs at least one expert slice");
  WorkerState w;
  w.model_ = slices.front().source_model();
  w.source_architecture_ = slices.front().source_architecture();
  for (const ExpertSlice& s : slices) {
    const std::string& name = s.gguf().path();
    if (s.source_model() != w.model_)
      return Status::error(name + ": cut from model " + digest_hex(s.source_model()) + ", but " +
                           slices.front().gguf().path() + " from model " + digest_hex(w.model_) +
                           "; one worker serves one model");
    // The bytes must be the ones the slice was cut with: the digests go into the HELLO, and a backbone
    // refuses holdings whose digests are not those of its own bytes (docs/protocol.md, WEIGHTS).
    ESSAIM_RETURN_IF_ERROR(s.verify_digests());
    for (const MoeLayer& l : s.layers()) {
      Result<ExpertLayer> el = expert_layer_of(s, l);
      if (!el) return el.status().with_context(name);
      // ExpertStore::add validates the views and refuses ranges that overlap one already held.
      ESSAIM_RETURN_IF_ERROR(w.store_.add(int32_t(l.layer), *el).with_context(name));
      const Sha256Digest digest = holding_digest(s.recorded_digests(l.layer));
      w.holdings_.push_back({.layer = l.layer, .first_expert = s.expert_first(), .expert_count = s.expert_count(),
                             .sha256 = digest});
    }
  }
  // A HELLO must fit the peers' pre-handshake limit; say so now rather than fail every handshake.
  if (proto::message_payload_bytes(w.hello(std::string(proto::kMaxLabelBytes, 'x'))) > proto::kMaxHelloPayloadBytes)
    return Status::error(std::to_string(w.holdings_.size()) + " holdings (one per slice and layer) do not fit a " +
                         std::to_string(proto::kMaxHelloPayloadBytes) +
                         "-byte HELLO; serve fewer slices per worker, or slices of more experts");
  w.slices_ = std::move(slices);
  return w;
}

uint64_t WorkerState::slice_bytes() const {
  uint64_t n = 0;
  for (const ExpertSlice& s : slices_) n += s.file_bytes();
  return n;
}

proto::Hello WorkerState::hello(std::string label) const {
  proto::Hello h;
  h.role = proto::Role::WORKER;
  h.fingerprint = build_fingerprint();
  h.model = model_;
  h.label = std::move(label);
  h.holdings = holdings_;
  return h;
}

}  // namespace essaim::worker
