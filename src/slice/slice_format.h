// The names that make up essaim's slice and backbone files (docs/slicing.md): metadata keys, the routed-expert
// tensor kinds, the expert activation, and the file names `essaim slice --plan` gives its output.
//
//   std::string n = expert_tensor_name(7, ExpertTensorKind::GATE);   // "blk.7.ffn_gate_exps.weight"
//   w.set_u32(std::string(kSliceKeyExpertFirst), 32);
//
// The writer (gguf_slice.cpp) and the reader (expert_slice.cpp) both take their names from here, so the two
// cannot drift apart. Bump kSliceFormatVersion when the meaning of a key changes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/status.h"

namespace essaim {

class GgufFile;

// A slice must not pass for a loadable model: llama.cpp refuses an unknown architecture up front.
inline constexpr std::string_view kSliceArchitecture = "essaim-expert-slice";
// v2 adds essaim.slice.expert_sha256 (per-expert content digests, slice/expert_digest.h).
inline constexpr uint32_t kSliceFormatVersion = 2;
// The most blocks a model to slice or a backbone may declare (the coordinator's layers are 0..4095).
inline constexpr uint32_t kMaxSliceableBlocks = 4096;
// `<arch>.block_count` of a model to slice or a backbone file: a UINT32 in 1..kMaxSliceableBlocks.
Result<uint32_t> sliceable_block_count(const GgufFile& f, const std::string& arch);

inline constexpr std::string_view kSliceKeyVersion = "essaim.slice.version";                          // u32
inline constexpr std::string_view kSliceKeySourceModel = "essaim.slice.source_model";                 // hex
inline constexpr std::string_view kSliceKeySourceArchitecture = "essaim.slice.source_architecture";   // str
inline constexpr std::string_view kSliceKeySourceBlockCount = "essaim.slice.source_block_count";      // u32
inline constexpr std::string_view kSliceKeySourceExpertCount = "essaim.slice.source_expert_count";    // u32
inline constexpr std::string_view kSliceKeyExpertUsedCount = "essaim.slice.expert_used_count";        // u32
inline constexpr std::string_view kSliceKeyLayerFirst = "essaim.slice.layer_first";                   // u32
inline constexpr std::string_view kSliceKeyLayerCount = "essaim.slice.layer_count";                   // u32
inline constexpr std::string_view kSliceKeyExpertFirst = "essaim.slice.expert_first";                 // u32
inline constexpr std::string_view kSliceKeyExpertCount = "essaim.slice.expert_count";                 // u32
inline constexpr std::string_view kSliceKeyEmbeddingLength = "essaim.slice.embedding_length";         // u32
inline constexpr std::string_view kSliceKeyExpertFfLength = "essaim.slice.expert_feed_forward_length"; // u32
inline constexpr std::string_view kSliceKeyActivation = "essaim.slice.activation";                    // str
inline constexpr std::string_view kSliceKeyGateUpFused = "essaim.slice.gate_up_fused";                // bool
// [layer_count × expert_count] 64-hex strings, layer-major: expert_digest() of each held expert.
inline constexpr std::string_view kSliceKeyExpertSha256 = "essaim.slice.expert_sha256";              // [str]

inline constexpr std::string_view kBackboneKeyVersion = "essaim.backbone.version";                    // u32
inline constexpr std::string_view kBackboneKeySourceModel = "essaim.backbone.source_model";           // hex
// v2 records what the routed experts are without their bytes (slice/backbone_experts.h), so a backbone can
// load from this file alone and bind its experts to the swarm. v1 files carry only the two keys above.
inline constexpr uint32_t kBackboneFormatVersion = 2;
inline constexpr std::string_view kBackboneKeyExpertCount = "essaim.backbone.expert_count";                // u32
inline constexpr std::string_view kBackboneKeyEmbeddingLength = "essaim.backbone.embedding_length";        // u32
inline constexpr std::string_view kBackboneKeyExpertFfLength = "essaim.backbone.expert_feed_forward_length"; // u32
inline constexpr std::string_view kBackboneKeyGateUpFused = "essaim.backbone.gate_up_fused";              // bool
inline constexpr std::string_view kBackboneKeyActivation = "essaim.backbone.activation";                  // str
// The MoE layers, ascending.
inline constexpr std::string_view kBackboneKeyExpertLayers = "essaim.backbone.expert_layers";             // [u32]
// Per MoE layer the ggml type ids of its expert tensors: gate, up, down (or gate_up, down when fused).
inline constexpr std::string_view kBackboneKeyExpertTypes = "essaim.backbone.expert_types";               // [u32]
// [MoE layers × expert_count] 64-hex expert digests, layer-major (as essaim.slice.expert_sha256).
inline constexpr std::string_view kBackboneKeyExpertSha256 = "essaim.backbone.expert_sha256";             // [str]

// The routed-expert tensors of one layer: ne = [in, out, n_expert], expert e is the byte range
// [e·nb2, (e+1)·nb2). A layer has GATE+UP+DOWN, or GATE_UP (gate rows then up rows, ne[1] = 2F) + DOWN.
enum class ExpertTensorKind : uint8_t { GATE, UP, DOWN, GATE_UP, COUNT };
inline constexpr size_t kExpertTensorKindCount = size_t(ExpertTensorKind::COUNT);

std::string_view expert_tensor_stem(ExpertTensorKind kind);         // "ffn_gate_exps"
std::string expert_tensor_name(uint32_t layer, ExpertTensorKind kind);  // "blk.<layer>.<stem>.weight"
// True for any tensor name carrying a routed-expert stem ("_exps."), known kind or not: the slicer refuses
// expert tensors it cannot place rather than silently dropping them from both slice and backbone.
bool is_routed_expert_tensor_name(std::string_view name);

// What joins gate and up inside an expert. SWIGLU: silu(gate·x) ⊙ (up·x), then down (docs/reference.md 4.3).
enum class ExpertActivation : uint8_t { SWIGLU, COUNT };
std::string_view expert_activation_name(ExpertActivation a);  // "swiglu"
std::optional<ExpertActivation> expert_activation_from_name(std::string_view name);
// The expert activation of a source architecture essaim knows; nullopt for any other.
std::optional<ExpertActivation> expert_activation_of_architecture(std::string_view arch);

// File name of one slice in a plan: "<stem>.L<layers>.E<experts>.gguf" with zero-padded indices so that a
// directory listing sorts by layer, then expert ("qwen3moe.L07.E032-063.gguf").
std::string slice_file_name(std::string_view stem, uint32_t layer_first, uint32_t layer_count,
                            uint32_t expert_first, uint32_t expert_count, uint32_t source_block_count,
                            uint32_t source_expert_count);

}  // namespace essaim
