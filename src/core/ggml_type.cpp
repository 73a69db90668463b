#include "core/ggml_type.h"

#include <array>
#include <cctype>
#include <string>

namespace essaim {
namespace {


// One row per id (docs/reference.md 2.1). computable marks the types essaim has kernels for.
constexpr std::array<TypeTraits, size_t(GgmlType::COUNT)> make_table() {
  std::array<TypeTraits, size_t(GgmlType::COUNT)> t{};
  auto set = [&](GgmlType g, std::string_view name, uint32_t bs, uint32_t ts, bool comp = false,
                 GgmlType vdt = GgmlType::F32) {
    t[size_t(g)] = TypeTraits{name, bs, ts, comp, vdt};
  };
  set(GgmlType::F32, "F32", 1, 4, true, GgmlType::F32);
  set(GgmlType::F16, "F16", 1, 2, true, GgmlType::F16);
  set(GgmlType::Q4_0, "Q4_0", 32, 18, false, GgmlType::Q8_0);
  set(GgmlType::Q4_1, "Q4_1", 32, 20, false, GgmlType::Q8_1);
  set(GgmlType::Q5_0, "Q5_0", 32, 22, false, GgmlType::Q8_0);
  set(GgmlType::Q5_1, "Q5_1", 32, 24, false, GgmlType::Q8_1);
  set(GgmlType::Q8_0, "Q8_0", 32, 34, true, GgmlType::Q8_0);
  set(GgmlType::Q8_1, "Q8_1", 32, 36, false, GgmlType::Q8_1);
  set(GgmlType::Q2_K, "Q2_K", 256, 84, false, GgmlType::Q8_K);
  set(GgmlType::Q3_K, "Q3_K", 256, 110, false, GgmlType::Q8_K);
  set(GgmlType::Q4_K, "Q4_K", 256, 144, true, GgmlType::Q8_K);
  set(GgmlType::Q5_K, "Q5_K", 256, 176, true, GgmlType::Q8_K);
  set(GgmlType::Q6_K, "Q6_K", 256, 210, true, GgmlType::Q8_K);
  set(GgmlType::Q8_K, "Q8_K", 256, 292, false, GgmlType::Q8_K);
  set(GgmlType::IQ2_XXS, "IQ2_XXS", 256, 66);
  set(GgmlType::IQ2_XS, "IQ2_XS", 256, 74);
  set(GgmlType::IQ3_XXS, "IQ3_XXS", 256, 98);
  set(GgmlType::IQ1_S, "IQ1_S", 256, 50);
  set(GgmlType::IQ4_NL, "IQ4_NL", 32, 18);
  set(GgmlType::IQ3_S, "IQ3_S", 256, 110);
  set(GgmlType::IQ2_S, "IQ2_S", 256, 82);
  set(GgmlType::IQ4_XS, "IQ4_XS", 256, 136);
  set(GgmlType::I8, "I8", 1, 1);
  set(GgmlType::I16, "I16", 1, 2);
  set(GgmlType::I32, "I32", 1, 4);
  set(GgmlType::I64, "I64", 1, 8);
  set(GgmlType::F64, "F64", 1, 8);
  set(GgmlType::IQ1_M, "IQ1_M", 256, 56);
  set(GgmlType::BF16, "BF16", 1, 2, true, GgmlType::BF16);
  set(GgmlType::TQ1_0, "TQ1_0", 256, 54);
  set(GgmlType::TQ2_0, "TQ2_0", 256, 66);
  set(GgmlType::MXFP4, "MXFP4", 32, 17);
  set(GgmlType::NVFP4, "NVFP4", 64, 36);
  set(GgmlType::Q1_0, "Q1_0", 128, 18);
  set(GgmlType::Q2_0, "Q2_0", 64, 18);
  return t;
}

constexpr auto kTable = make_table();
static_assert(kTable[size_t(GgmlType::Q4_K)].type_size == 144);
static_assert(kTable[size_t(GgmlType::Q6_K)].type_size == 210);
static_assert(kTable[size_t(GgmlType::Q8_K)].type_size == 292);
static_assert(kTable[4].block_size == 0 && kTable[31].block_size == 0);  // removed ids

}  // namespace

std::optional<GgmlType> ggml_type_from_id(int64_t id) {
  if (id < 0 || id >= int64_t(GgmlType::COUNT)) return std::nullopt;
  return GgmlType(id);
}

const TypeTraits& type_traits(GgmlType type) { return kTable[size_t(type)]; }

std::optional<GgmlType> ggml_type_from_name(std::string_view name) {
  std::string upper(name);
  for (char& c : upper) c = char(std::toupper(static_cast<unsigned char>(c)));
  for (size_t i = 0; i < kTable.size(); ++i)
    if (!kTable[i].name.empty() && kTable[i].name == upper) return GgmlType(i);
  return std::nullopt;
}

}  // namespace essaim
