// Renders an opened GGUF file for people (text) and for programs (JSON): header, metadata, tensors, and for
// MoE files the byte slab of every expert of every `*_exps` tensor (what a worker downloads for one expert).
//
//   ESSAIM_ASSIGN_OR_RETURN(GgufFile f, GgufFile::open("model.gguf"));
//   std::fputs(gguf_inspect_text(f, {}).c_str(), stdout);
//   nlohmann::json j = gguf_inspect_json(f, {.full_arrays = true});
//   j["metadata"]["qwen3moe.block_count"]["value"];          // 2
//   j["tensors"][7]["expert_slabs"][3]["file_offset"];        // absolute byte offset of expert 3
//
// JSON layout (stable; other tools read it):
//   {path, version, alignment, data_start, file_size, kv_count, tensor_count,
//    metadata: {KEY: {type, value} | {type: "ARRAY", elem_type, count, values, truncated}},
//    tensors: [{name, type, n_dims, ne, offset, file_offset, bytes,
//               expert_slabs?: [{expert, file_offset, bytes}]}]}
// Strings are made valid UTF-8 (invalid bytes become U+FFFD) so the JSON always serialises.
#pragma once

#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

#include "gguf/gguf_file.h"

namespace essaim {

struct GgufInspectOptions {
  // JSON: every element of every array (default: the first json_array_limit, with "truncated": true).
  // Text: every array element and every expert slab instead of a preview.
  bool full_arrays = false;
  size_t json_array_limit = 16;
  size_t text_array_preview = 6;
  size_t text_expert_preview = 4;  // slabs shown at each end of a long expert list
};

// A routed-expert tensor: 3-D with "_exps" in its name (ne = [in, out, n_expert], docs/reference.md 1.6).
bool gguf_is_expert_tensor(const GgufTensor& t);

std::string gguf_inspect_text(const GgufFile& file, const GgufInspectOptions& options);
nlohmann::json gguf_inspect_json(const GgufFile& file, const GgufInspectOptions& options);

}  // namespace essaim
