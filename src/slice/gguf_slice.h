// Cutting a full MoE GGUF at the grain of one expert (docs/invariants.md "Why experts", invariant 3): expert slices
// (mini-GGUFs holding a contiguous expert range of some layers), the backbone file (everything else), and a
// whole-model plan with its manifest. Pure byte-range copies from the source mapping, no dequantisation.
//
//   ESSAIM_ASSIGN_OR_RETURN(GgufFile src, GgufFile::open("model.gguf"));
//   ESSAIM_ASSIGN_OR_RETURN(MoeLayout moe, moe_layout(src));
//   ESSAIM_ASSIGN_OR_RETURN(OutFile s, expert_slice_file(src, moe, {.layer_first = 3, .expert_first = 32,
//                                                                   .expert_count = 32}));
//   ESSAIM_ASSIGN_OR_RETURN(WrittenFile w, write_out_file(s, "l3-e32.gguf"));    // w.bytes, w.sha256
//
//   ESSAIM_ASSIGN_OR_RETURN(SliceManifest plan, plan_manifest(src, moe, {.experts_per_slice = 32}));
//   ESSAIM_ASSIGN_OR_RETURN(SliceManifest done, write_plan(src, moe, plan, "out/"));  // + out/manifest.json
//
// File formats and keys: docs/slicing.md, names in slice/slice_format.h.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "gguf/gguf_file.h"
#include "slice/model_identity.h"
#include "slice/out_file.h"
#include "slice/slice_format.h"
#include "slice/slice_manifest.h"

namespace essaim {

// The routed-expert tensors of one MoE layer in the source (views into its mapping).
struct MoeLayer {
  uint32_t layer = 0;
  std::array<const GgufTensor*, kExpertTensorKindCount> tensors{};  // null for a kind the layer lacks
  const GgufTensor* tensor(ExpertTensorKind k) const { return tensors[size_t(k)]; }
};

// What a full model's routed experts look like, validated: every expert tensor is [in, out, expert_count]
// with in/out matching n_embd and n_ff, every layer has the same kinds (fused or not).
struct MoeLayout {
  ModelIdentity source_model{};   // model_identity(src), computed once
  std::string architecture;       // general.architecture of the source
  uint32_t block_count = 0;       // <arch>.block_count
  uint32_t expert_count = 0;      // X
  uint32_t expert_used_count = 0; // K; 0 when the file does not say
  uint32_t n_embd = 0;            // E
  uint32_t n_ff = 0;              // F, width of one expert (gate_up has 2F rows)
  bool gate_up_fused = false;
  ExpertActivation activation = ExpertActivation::SWIGLU;
  std::vector<MoeLayer> layers;   // the layers that have routed experts, ascending

  const MoeLayer* find_layer(uint32_t layer) const;
  // Bytes of one expert across all its tensors in one layer (gate + up + down).
  uint64_t expert_bytes(const MoeLayer& l) const;
};

// A layer holds exactly the kinds `fused` calls for, each [in, out, n_experts] with in/out from n_embd, n_ff
// (gate/up [E, F], gate_up [E, 2F], down [F, E]). Shared by the slicer and the slice reader.
Status check_expert_layer(const MoeLayer& l, uint32_t n_embd, uint32_t n_ff, uint32_t n_experts, bool fused);

// Errors (as values) for a file that is not a full MoE model essaim can cut: no experts, an expert slice or
// backbone file, an unknown expert tensor, inconsistent shapes, an architecture whose activation is unknown.
Result<MoeLayout> moe_layout(const GgufFile& src);

struct SliceRange {
  uint32_t layer_first = 0;
  uint32_t layer_count = 1;
  uint32_t expert_first = 0;
  uint32_t expert_count = 1;
};

// The range names existing MoE layers and experts of the model; the message says what the model has.
Status check_slice_range(const MoeLayout& moe, const SliceRange& r);

// An expert slice of src (keys in docs/slicing.md); tensors keep their names, ne[2] = r.expert_count.
Result<OutFile> expert_slice_file(const GgufFile& src, const MoeLayout& moe, const SliceRange& r);
// Expert digests in a backbone file's header: COMPUTE hashes every expert (what is written); PLACEHOLDER
// writes zero digests of the same length (a plan only needs the file's size).
enum class BackboneDigests : uint8_t { COMPUTE, PLACEHOLDER };
// Every tensor but the routed experts, every KV, plus essaim.backbone.{version,source_model} and the
// experts' description without their bytes (slice/backbone_experts.h).
OutFile backbone_file(const GgufFile& src, const MoeLayout& moe, BackboneDigests digests = BackboneDigests::COMPUTE);

struct SlicePlanOptions {
  uint32_t experts_per_slice = 32;  // N; the last slice of a layer is shorter when N does not divide X
  bool with_backbone = false;       // also cut the backbone file
  std::string stem = {};            // file name prefix; empty = the source's architecture
};

// The plan for cutting the whole model into one-layer, N-expert slices: names, ranges and exact byte sizes,
// hashes still zero. Nothing is written.
Result<SliceManifest> plan_manifest(const GgufFile& src, const MoeLayout& moe, const SlicePlanOptions& opt);
// Writes every file of the plan into dir (created if missing) and dir/manifest.json; returns the manifest
// with every file's SHA-256.
Result<SliceManifest> write_plan(const GgufFile& src, const MoeLayout& moe, const SliceManifest& plan,
                                 const std::string& dir, Progress* progress = nullptr);

}  // namespace essaim
