// The tensor-name table (llama.cpp's LLM_TENSOR_NAMES for the tensors these architectures use) and the
// small helpers every architecture file shares.
#include "synth/synth_arch.h"

#include <cstdio>
#include <iterator>

#include "core/status.h"

namespace essaim {
namespace {

struct NameEntry {
  SynthTensorKind kind;
  const char* format;  // "%u" = block index
};

// One row per kind, in enum order (checked below), so a lookup is an index.
constexpr NameEntry kNames[] = {
    {SynthTensorKind::TOKEN_EMBD, "token_embd.weight"},
    {SynthTensorKind::OUTPUT_NORM, "output_norm.weight"},
    {SynthTensorKind::OUTPUT, "output.weight"},
    {SynthTensorKind::ATTN_NORM, "blk.%u.attn_norm.weight"},
    {SynthTensorKind::ATTN_Q, "blk.%u.attn_q.weight"},
    {SynthTensorKind::ATTN_K, "blk.%u.attn_k.weight"},
    {SynthTensorKind::ATTN_V, "blk.%u.attn_v.weight"},
    {SynthTensorKind::ATTN_Q_NORM, "blk.%u.attn_q_norm.weight"},
    {SynthTensorKind::ATTN_K_NORM, "blk.%u.attn_k_norm.weight"},
    {SynthTensorKind::ATTN_OUTPUT, "blk.%u.attn_output.weight"},
    {SynthTensorKind::POST_ATTN_NORM, "blk.%u.post_attention_norm.weight"},
    {SynthTensorKind::FFN_NORM, "blk.%u.ffn_norm.weight"},
    {SynthTensorKind::ATTN_QKV, "blk.%u.attn_qkv.weight"},
    {SynthTensorKind::ATTN_GATE, "blk.%u.attn_gate.weight"},
    {SynthTensorKind::SSM_CONV1D, "blk.%u.ssm_conv1d.weight"},
    {SynthTensorKind::SSM_DT_BIAS, "blk.%u.ssm_dt.bias"},
    {SynthTensorKind::SSM_A, "blk.%u.ssm_a"},
    {SynthTensorKind::SSM_BETA, "blk.%u.ssm_beta.weight"},
    {SynthTensorKind::SSM_ALPHA, "blk.%u.ssm_alpha.weight"},
    {SynthTensorKind::SSM_NORM, "blk.%u.ssm_norm.weight"},
    {SynthTensorKind::SSM_OUT, "blk.%u.ssm_out.weight"},
    {SynthTensorKind::FFN_GATE_INP, "blk.%u.ffn_gate_inp.weight"},
    {SynthTensorKind::FFN_GATE_EXPS, "blk.%u.ffn_gate_exps.weight"},
    {SynthTensorKind::FFN_UP_EXPS, "blk.%u.ffn_up_exps.weight"},
    {SynthTensorKind::FFN_GATE_UP_EXPS, "blk.%u.ffn_gate_up_exps.weight"},
    {SynthTensorKind::FFN_DOWN_EXPS, "blk.%u.ffn_down_exps.weight"},
    {SynthTensorKind::FFN_GATE_INP_SHEXP, "blk.%u.ffn_gate_inp_shexp.weight"},
    {SynthTensorKind::FFN_GATE_SHEXP, "blk.%u.ffn_gate_shexp.weight"},
    {SynthTensorKind::FFN_UP_SHEXP, "blk.%u.ffn_up_shexp.weight"},
    {SynthTensorKind::FFN_DOWN_SHEXP, "blk.%u.ffn_down_shexp.weight"},
    {SynthTensorKind::NEXTN_EH_PROJ, "blk.%u.nextn.eh_proj.weight"},
    {SynthTensorKind::NEXTN_ENORM, "blk.%u.nextn.enorm.weight"},
    {SynthTensorKind::NEXTN_HNORM, "blk.%u.nextn.hnorm.weight"},
    {SynthTensorKind::NEXTN_SHARED_HEAD_NORM, "blk.%u.nextn.shared_head_norm.weight"},
};
static_assert(std::size(kNames) == size_t(SynthTensorKind::COUNT), "one name per tensor kind");

constexpr bool names_in_enum_order() {
  for (size_t i = 0; i < std::size(kNames); ++i)
    if (size_t(kNames[i].kind) != i) return false;
  return true;
}
static_assert(names_in_enum_order(), "kNames rows must follow the enum order");

GgufValue scalar(GgufValueType t) {
  GgufValue v;
  v.type = t;
  return v;
}

GgufValue array_of(GgufValueType elem) {
  GgufValue v;
  v.type = GgufValueType::ARRAY;
  v.elem_type = elem;
  return v;
}

}  // namespace

std::string_view synth_arch_name(SynthArch a) {
  switch (a) {
    case SynthArch::QWEN3MOE: return "qwen3moe";
    case SynthArch::QWEN35MOE: return "qwen35moe";
    case SynthArch::COUNT: break;
  }
  return "";
}

std::string_view synth_preset_name(SynthPreset p) {
  switch (p) {
    case SynthPreset::TINY: return "tiny";
    case SynthPreset::SMALL: return "small";
    case SynthPreset::Q35_122B: return "q35-122b";
    case SynthPreset::COUNT: break;
  }
  return "";
}

std::string_view synth_type_mix_name(SynthTypeMix t) {
  switch (t) {
    case SynthTypeMix::F32: return "f32";
    case SynthTypeMix::BF16: return "bf16";
    case SynthTypeMix::Q8_0: return "q8_0";
    case SynthTypeMix::Q4_K_M: return "q4_k_m";
    case SynthTypeMix::COUNT: break;
  }
  return "";
}

std::string synth_tensor_name(SynthTensorKind kind, uint32_t layer) {
  ESSAIM_CHECK(kind < SynthTensorKind::COUNT);
  char buf[96];
  std::snprintf(buf, sizeof(buf), kNames[size_t(kind)].format, layer);
  return buf;
}

bool synth_tensor_is_global(SynthTensorKind kind) {
  return kind == SynthTensorKind::TOKEN_EMBD || kind == SynthTensorKind::OUTPUT_NORM ||
         kind == SynthTensorKind::OUTPUT;
}

void SynthMetadata::set_u32(const std::string& key, uint32_t v) {
  GgufValue x = scalar(GgufValueType::UINT32);
  x.u = v;
  kvs.push_back({key, std::move(x)});
}

void SynthMetadata::set_f32(const std::string& key, float v) {
  GgufValue x = scalar(GgufValueType::FLOAT32);
  x.f = v;
  kvs.push_back({key, std::move(x)});
}

void SynthMetadata::set_bool(const std::string& key, bool v) {
  GgufValue x = scalar(GgufValueType::BOOL);
  x.u = v ? 1 : 0;
  kvs.push_back({key, std::move(x)});
}

void SynthMetadata::set_string(const std::string& key, const std::string& v) {
  GgufValue x = scalar(GgufValueType::STRING);
  x.str = v;
  kvs.push_back({key, std::move(x)});
}

void SynthMetadata::set_array_i32(const std::string& key, const std::vector<int32_t>& v) {
  GgufValue x = array_of(GgufValueType::INT32);
  x.ints.assign(v.begin(), v.end());
  kvs.push_back({key, std::move(x)});
}

void SynthMetadata::set_array_bool(const std::string& key, const std::vector<bool>& v) {
  GgufValue x = array_of(GgufValueType::BOOL);
  x.uints.assign(v.begin(), v.end());
  kvs.push_back({key, std::move(x)});
}

void SynthMetadata::set_array_string(const std::string& key, const std::vector<std::string>& v) {
  GgufValue x = array_of(GgufValueType::STRING);
  x.strs = v;
  kvs.push_back({key, std::move(x)});
}

const GgufValue* SynthMetadata::find(std::string_view key) const {
  for (const GgufKv& kv : kvs)
    if (kv.key == key) return &kv.value;
  return nullptr;
}

const SynthArchDesc& synth_arch(SynthArch a) {
  switch (a) {
    case SynthArch::QWEN3MOE: return synth_arch_qwen3moe();
    case SynthArch::QWEN35MOE: return synth_arch_qwen35moe();
    case SynthArch::COUNT: break;
  }
  ESSAIM_CHECK(false && "unknown synth architecture");
  return synth_arch_qwen3moe();
}

}  // namespace essaim
