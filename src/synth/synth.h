// Synthetic GGUF models that follow llama.cpp's conventions exactly (keys and their types, tensor names,
// shapes, order, type mix), with seeded random weights. See docs/synth.md.
//
//   SynthOptions o{.arch = SynthArch::QWEN35MOE, .preset = SynthPreset::TINY, .types = SynthTypeMix::Q4_K_M};
//   ESSAIM_ASSIGN_OR_RETURN(SynthPlan plan, synth_plan(o));      // metadata + tensor table, no data
//   ESSAIM_ASSIGN_OR_RETURN(SynthSummary s, synth_write(plan, "tiny.gguf"));
//
// The same options always give byte-identical files, whatever the thread count.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/ggml_type.h"
#include "core/progress.h"
#include "core/status.h"
#include "synth/synth_arch.h"
#include "text/vocab.h"

namespace essaim {

inline constexpr float kSynthDefaultLogitsScale = 8.0f;

struct SynthOptions {
  SynthArch arch = SynthArch::QWEN3MOE;
  SynthPreset preset = SynthPreset::TINY;
  std::optional<uint32_t> layers = std::nullopt;  // executed layers; default from the preset
  std::optional<uint32_t> experts = std::nullopt;  // routed experts per layer; default from the preset
  SynthTypeMix types = SynthTypeMix::F32;
  uint64_t seed = 1;
  std::string tokenizer_json = {};  // Hugging Face tokenizer.json to import; empty = the synthetic BPE
  float router_skew = 0.0f;        // >= 0; 0 = no preferred experts
  float logits_scale = kSynthDefaultLogitsScale;  // std of the logits for a unit-RMS final hidden state
  // qwen35moe variants:
  bool recurrent_flags = false;    // attention.recurrent_layers array instead of full_attention_interval
  uint32_t nextn = 0;              // MTP blocks appended (block_count includes them)
  bool fused_gate_up = false;      // ffn_gate_up_exps [E, 2F, X]
  size_t threads = 0;              // generation threads; 0 = all cores (never changes the bytes)
  std::string weights_dir = {};    // trained values: DIR/<tensor name>.npy for every tensor (synth_weights.h)
  std::string name = {};           // general.name; empty = "essaim-synth <arch> <preset>"
};

struct SynthTensor {
  std::string name;
  TensorName kind = TensorName::COUNT;
  int32_t layer = -1;              // block index; -1 for token_embd / output_norm / output
  std::vector<int64_t> ne;         // ggml order
  GgmlType type = GgmlType::F32;
  SynthInitSpec init;
  uint64_t nbytes = 0;
  uint64_t rows() const;           // ne[1] * ne[2] * ne[3]: rows of ne[0] elements
};

struct SynthPlan {
  SynthOptions options;
  const SynthArchDesc* arch = nullptr;
  SynthHparams hp;
  Vocab vocab;
  SynthMetadata metadata;            // in file order
  std::vector<SynthTensor> tensors;  // in file order (llama-quantize order)
  uint64_t tensor_bytes() const;     // sum of nbytes, without padding
};

// Validates the options (a message a user can act on when they are wrong) and lays the file out.
Result<SynthPlan> synth_plan(const SynthOptions& options);

struct SynthSummary {
  uint64_t file_bytes = 0;
  size_t n_tensors = 0;
  double seconds = 0;
};

// Writes the planned file, generating blocks in parallel and streaming them through GgufWriter.
// `progress` (may be null) advances by the bytes of tensor data written.
Result<SynthSummary> synth_write(const SynthPlan& plan, const std::string& path, Progress* progress = nullptr);

// llama-quantize's tensor order: tensors without a blk. prefix first, then by block number; within a group
// by name (byte order).
bool synth_tensor_order_less(const std::string& a, const std::string& b);

}  // namespace essaim
