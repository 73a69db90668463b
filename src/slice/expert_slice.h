// An expert slice opened for serving: the worker's only view of weights (docs/invariants.md invariant 4). Validates
// the slice's metadata and tensors (untrusted input) and hands out zero-copy views of the local experts.
//
//   ESSAIM_ASSIGN_OR_RETURN(ExpertSlice s, ExpertSlice::open("qwen3moe.L07.E032-063.gguf"));
//   if (s.holds(7, 40)) {
//     const MoeLayer* l = s.layer(7);                        // tensors[kind]: ne = [in, out, expert_count]
//     const GgufTensor* down = l->tensor(ExpertTensorKind::DOWN);
//     std::span<const uint8_t> e40 = down->expert_slab(40 - s.expert_first());   // local index
//   }
//
// To run the experts, build a moe ExpertLayer from the views (gguf does not depend on moe):
//   auto view = [](const GgufTensor* t) { return ExpertLayer::Tensor3d{t->type, t->ne[0], t->ne[1], t->ne[2], t->data}; };
//   ExpertLayer el = s.gate_up_fused()
//       ? ExpertLayer::fused(view(l->tensor(ExpertTensorKind::GATE_UP)), view(l->tensor(ExpertTensorKind::DOWN)), first)
//       : ExpertLayer::separate(view(gate), view(up), view(down), first);             // first = s.expert_first()
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "gguf/gguf_file.h"
#include "slice/gguf_slice.h"
#include "slice/model_identity.h"
#include "slice/slice_format.h"

namespace essaim {

class ExpertSlice {
 public:
  static Result<ExpertSlice> open(const std::string& path);
  // Takes an opened (or parsed) GGUF file; errors unless it is a well-formed expert slice.
  static Result<ExpertSlice> from_gguf(GgufFile file);

  ExpertSlice(ExpertSlice&&) noexcept = default;
  ExpertSlice& operator=(ExpertSlice&&) noexcept = default;
  ExpertSlice(const ExpertSlice&) = delete;
  ExpertSlice& operator=(const ExpertSlice&) = delete;

  const ModelIdentity& source_model() const { return source_model_; }
  const std::string& source_architecture() const { return source_architecture_; }
  uint32_t source_block_count() const { return source_block_count_; }
  uint32_t source_expert_count() const { return source_expert_count_; }
  uint32_t expert_used_count() const { return expert_used_count_; }  // K of the source; 0 if unknown

  // Held range: layers [layer_first, layer_first + layer_count), global experts [expert_first, + expert_count).
  uint32_t layer_first() const { return layer_first_; }
  uint32_t layer_count() const { return layer_count_; }
  uint32_t expert_first() const { return expert_first_; }
  uint32_t expert_count() const { return expert_count_; }
  bool holds(uint32_t layer, uint32_t expert) const;

  uint32_t n_embd() const { return n_embd_; }
  uint32_t n_ff() const { return n_ff_; }
  ExpertActivation activation() const { return activation_; }
  bool gate_up_fused() const { return gate_up_fused_; }

  // The expert tensors of one held layer (ne[2] = expert_count, local expert j = global expert_first + j);
  // nullptr for a layer outside the slice.
  const MoeLayer* layer(uint32_t layer) const;
  std::span<const MoeLayer> layers() const { return layers_; }

  // The content digests recorded when the slice was cut (slice/expert_digest.h), expert_count of them for
  // a held layer, in expert order; empty for a layer outside the slice.
  std::span<const Sha256Digest> recorded_digests(uint32_t layer) const;
  // Hashes every held expert's bytes and compares with the recorded digests: an error naming the first
  // expert whose bytes changed since the slice was cut (a damaged or altered file). Reads the whole slice.
  Status verify_digests() const;

  const GgufFile& gguf() const { return file_; }
  uint64_t file_bytes() const { return file_.file_size(); }

 private:
  Status read_digests(const GgufFile& file, const std::string& where);  // from_gguf's last check
  ExpertSlice() = default;

  GgufFile file_;
  ModelIdentity source_model_{};
  std::string source_architecture_;
  uint32_t source_block_count_ = 0;
  uint32_t source_expert_count_ = 0;
  uint32_t expert_used_count_ = 0;
  uint32_t layer_first_ = 0;
  uint32_t layer_count_ = 0;
  uint32_t expert_first_ = 0;
  uint32_t expert_count_ = 0;
  uint32_t n_embd_ = 0;
  uint32_t n_ff_ = 0;
  ExpertActivation activation_ = ExpertActivation::SWIGLU;
  bool gate_up_fused_ = false;
  std::vector<Sha256Digest> digests_;  // [layer_count][expert_count], layer-major
  std::vector<MoeLayer> layers_;  // pointers into file_'s tensor table (stable across moves)
};

}  // namespace essaim
