// ggml tensor types as GGUF stores them (docs/reference.md 2.1) and the traits every layer above needs.
//
//   const TypeTraits& t = type_traits(GgmlType::Q4_K);   // t.block_size == 256, t.type_size == 144
//   uint64_t bytes = t.row_bytes(3072);                   // 12 blocks * 144
//
// Wire values are pinned: they are GGUF's type ids.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace essaim {

enum class GgmlType : int32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22, IQ4_XS = 23,
  I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39, NVFP4 = 40, Q1_0 = 41, Q2_0 = 42,
  COUNT = 43,
};
static_assert(int(GgmlType::Q4_K) == 12 && int(GgmlType::BF16) == 30 && int(GgmlType::COUNT) == 43);

struct TypeTraits {
  std::string_view name;    // "Q4_K"; empty for removed ids
  uint32_t block_size = 0;  // elements per block; 0 = removed id (reject)
  uint32_t type_size = 0;   // bytes per block
  bool computable = false;  // essaim has kernels for it (F32 F16 BF16 Q8_0 Q4_K Q5_K Q6_K; Q8_K as activation)
  GgmlType vec_dot_type = GgmlType::F32;  // activation format it multiplies with (docs/reference.md 2.5)

  // Bytes of one row of n elements; n must be a multiple of block_size (callers validate first).
  uint64_t row_bytes(uint64_t n) const { return n / block_size * type_size; }
};

// Traits of any id in [0, COUNT); removed ids have block_size 0. Out-of-range ids return nullopt.
std::optional<GgmlType> ggml_type_from_id(int64_t id);
const TypeTraits& type_traits(GgmlType type);
inline std::string_view type_name(GgmlType type) { return type_traits(type).name; }
std::optional<GgmlType> ggml_type_from_name(std::string_view name);  // "q4_k" / "Q4_K"

}  // namespace essaim
