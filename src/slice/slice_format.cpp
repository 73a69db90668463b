#include "slice/slice_format.h"

#include <array>

#include "gguf/gguf_file.h"
#include "gguf/tensor_names.h"

namespace essaim {
namespace {

// The routed-expert tensors by kind, named by the one tensor-name table.
constexpr std::array<TensorName, kExpertTensorKindCount> kTensors = {
    TensorName::FFN_GATE_EXPS, TensorName::FFN_UP_EXPS, TensorName::FFN_DOWN_EXPS, TensorName::FFN_GATE_UP_EXPS};

// Architectures whose routed experts are SwiGLU FFNs (llama.cpp builds them with LLM_FFN_SILU + PAR).
// Mixtral-style files carry architecture "llama".
constexpr std::array<std::string_view, 6> kSwigluArchitectures = {
    "qwen3moe", "qwen35moe", "qwen2moe", "qwen3next", "olmoe", "llama"};

// Digits needed to print every index below n (at least 1).
int digits_below(uint32_t n) {
  int d = 1;
  for (uint32_t v = n > 0 ? n - 1 : 0; v >= 10; v /= 10) ++d;
  return d;
}

std::string padded(uint32_t v, int width) {
  std::string s = std::to_string(v);
  if (int(s.size()) < width) s.insert(0, size_t(width) - s.size(), '0');
  return s;
}

std::string range_text(uint32_t first, uint32_t count, int width) {
  std::string s = padded(first, width);
  if (count > 1) s += "-" + padded(first + count - 1, width);
  return s;
}

}  // namespace

// "ffn_gate_exps" from the table's "blk.%d.ffn_gate_exps.weight".
std::string_view expert_tensor_stem(ExpertTensorKind kind) {
  constexpr std::string_view kPrefix = "blk.%d.", kSuffix = ".weight";
  std::string_view f = tensor_name_format(kTensors[size_t(kind)]);
  f.remove_prefix(kPrefix.size());
  f.remove_suffix(kSuffix.size());
  return f;
}

Result<uint32_t> sliceable_block_count(const GgufFile& f, const std::string& arch) {
  const std::string key = gguf_quote_string(arch + ".block_count");
  const std::optional<uint32_t> n = f.get_u32(arch + ".block_count");
  if (!n) return Status::error("no " + key + " (UINT32)");
  if (*n == 0 || *n > kMaxSliceableBlocks)
    return Status::error(key + " is " + std::to_string(*n) + ", expected 1.." + std::to_string(kMaxSliceableBlocks));
  return *n;
}

// Any u32 layer a file may claim names a tensor (one the file then lacks), never a failed check.
std::string expert_tensor_name(uint32_t layer, ExpertTensorKind kind) {
  return "blk." + std::to_string(layer) + "." + std::string(expert_tensor_stem(kind)) + ".weight";
}

bool is_routed_expert_tensor_name(std::string_view name) {
  return name.find("_exps.") != std::string_view::npos;
}

std::string_view expert_activation_name(ExpertActivation a) {
  switch (a) {
    case ExpertActivation::SWIGLU: return "swiglu";
    case ExpertActivation::COUNT: break;
  }
  return "invalid";
}

std::optional<ExpertActivation> expert_activation_from_name(std::string_view name) {
  if (name == "swiglu") return ExpertActivation::SWIGLU;
  return std::nullopt;
}

std::optional<ExpertActivation> expert_activation_of_architecture(std::string_view arch) {
  for (std::string_view a : kSwigluArchitectures)
    if (a == arch) return ExpertActivation::SWIGLU;
  return std::nullopt;
}

std::string slice_file_name(std::string_view stem, uint32_t layer_first, uint32_t layer_count,
                            uint32_t expert_first, uint32_t expert_count, uint32_t source_block_count,
                            uint32_t source_expert_count) {
  return std::string(stem) + ".L" + range_text(layer_first, layer_count, digits_below(source_block_count)) +
         ".E" + range_text(expert_first, expert_count, digits_below(source_expert_count)) + ".gguf";
}

}  // namespace essaim
