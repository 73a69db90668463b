// The small helpers every architecture file shares (tensor names come from gguf/tensor_names.h).
#include "synth/synth_arch.h"

#include <cstdio>
#include <iterator>

#include "core/status.h"

namespace essaim {
namespace {

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
