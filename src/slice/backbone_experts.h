// What a backbone file (format 2) records about the routed experts it does not hold: per MoE layer the ggml
// type of each expert tensor, the shapes every layer shares, and every expert's content digest
// (docs/slicing.md, "Backbone file"). With these a backbone can load the dense path from the backbone file
// alone, with its experts bound to the swarm: it knows the experts' activation format (the vec_dot type of
// the gate/up weights) and widths without their bytes, and checks a worker's holdings against the digests.
//
//   // the slicer
//   for (GgufKv& kv : backbone_expert_kvs(moe, BackboneDigests::COMPUTE)) out.kvs.push_back(std::move(kv));
//   // the loader (the file is untrusted: every key is validated)
//   ESSAIM_ASSIGN_OR_RETURN(BackboneExperts bx, read_backbone_experts(file));
//   ESSAIM_RETURN_IF_ERROR(file.add_shape_only_tensors(bx.shape_tensors()));   // no bytes, shapes only
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "core/ggml_type.h"
#include "core/status.h"
#include "gguf/gguf_file.h"
#include "slice/gguf_slice.h"
#include "slice/model_identity.h"

namespace essaim {

// The MoE layer records of a backbone file, validated.
struct BackboneExperts {
  ModelIdentity source_model{};
  uint32_t block_count = 0;   // <arch>.block_count of the file
  uint32_t expert_count = 0;  // X
  uint32_t n_embd = 0;        // E
  uint32_t n_ff = 0;          // F
  bool gate_up_fused = false;
  struct Layer {
    uint32_t layer = 0;
    // Indexed by ExpertTensorKind; present exactly for the kinds the layer has (GATE, UP, DOWN or GATE_UP, DOWN).
    std::array<std::optional<GgmlType>, kExpertTensorKindCount> types{};
  };
  std::vector<Layer> layers;                        // ascending
  std::vector<std::vector<Sha256Digest>> digests;   // [layers index][expert]

  const Layer* find_layer(uint32_t layer) const;
  // [layers index] of a layer, or -1.
  int64_t layer_index(uint32_t layer) const;
  // The routed-expert tensors these records describe, as GgufTensors without bytes (data == nullptr): names,
  // types, ne = [in, out, X], nbytes. What the model binder needs to build a shape-only expert store.
  std::vector<GgufTensor> shape_tensors() const;
};

// The essaim.backbone.* keys describing the experts (without version and source_model).
std::vector<GgufKv> backbone_expert_kvs(const MoeLayout& moe, BackboneDigests digests);

// True when the file says it is an essaim backbone file (any version).
bool is_backbone_file(const GgufFile& f);

// Validates every key of a backbone file (an untrusted file): the version (1: "cut it again"), every key
// present with its exact type, the layers ascending inside block_count, the types computable and dividing
// the widths, the digest count, no routed-expert tensor left in the file. Errors are values naming the key.
Result<BackboneExperts> read_backbone_experts(const GgufFile& f);

}  // namespace essaim
