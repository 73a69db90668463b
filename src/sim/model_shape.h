// The model essaim-sim serves: Qwen3.5-122B-A10B's MoE shape (48 layers x 256 experts, top-8, 3072 wide,
// expert FFN 1024), its Q4_K_M expert bytes per layer (llama-quantize's rule as essaim synth applies it:
// gate/up Q4_K, down Q4_K or Q6_K by layer), the coordinator's catalogue of `essaim slice --plan N` slices,
// and the bytes an expert call puts on the wire (the protocol's own encoder, memoised by shape).
//
//   ModelShape m = qwen35_122b();
//   coord::Catalogue cat = slice_catalogue(m, 32);         // 48 x 8 slices of ~170 MB
//   uint64_t up = m.request_bytes(rows, pairs);             // one EXPERT_REQUEST frame
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "coord/placement.h"
#include "core/ggml_type.h"
#include "core/status.h"

namespace essaim::sim {

struct ModelShape {
  int32_t n_layers = 0, n_experts = 0, k = 0;
  int64_t n_embd = 0, n_ff = 0;
  GgmlType act_type = GgmlType::Q8_K;        // activations as the backbone sends them
  std::vector<GgmlType> down_type;           // [n_layers] the expert down projection's type
  std::vector<int64_t> expert_bytes;         // [n_layers] one expert's gate + up + down bytes

  // One EXPERT_REQUEST / EXPERT_RESPONSE frame, header included.
  uint64_t request_bytes(uint64_t rows, uint64_t pairs) const;
  uint64_t response_bytes(uint64_t pairs, bool bf16) const;

 private:
  mutable std::map<std::pair<uint64_t, uint64_t>, uint64_t> request_memo_;
  mutable std::map<std::pair<uint64_t, bool>, uint64_t> response_memo_;
};

ModelShape qwen35_122b();
// The routed experts of a GGUF model (the file a real run serves): its MoE layers in order (layer l of the
// shape is the l-th layer with experts), experts, top-k, widths, each layer's expert bytes and down type,
// and the activation format its gate weights take. Errors name what the file lacks.
Result<ModelShape> model_shape_from_gguf(const std::string& path);
// `experts_per_slice` experts per one-layer slice (the last one of a layer shorter when it does not divide);
// digests are stand-ins (the bytes are not made), sizes are the expert bytes (the slice file's GGUF header,
// a few KB, is left out).
coord::Catalogue slice_catalogue(const ModelShape& m, int64_t experts_per_slice);
// The bench harness's placement (bench/support/worker_processes.h ensure_slices): part p of `parts` holds
// experts [p·X/parts, (p+1)·X/parts) of every layer, one slice per (layer, part) (none for an empty range);
// held_by_part[p] lists part p's catalogue slices.
coord::Catalogue range_catalogue(const ModelShape& m, int64_t parts, std::vector<std::vector<size_t>>& held_by_part);

}  // namespace essaim::sim
