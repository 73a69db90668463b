// Helpers of the slicing tests: small MoE GGUF files, and the two checks every test runs — a slice's slabs
// equal the source's, a backbone keeps every other tensor and key unchanged.
//
// Small MoE GGUF files for the slicing tests, written with GgufWriter: shapes and names follow llama.cpp's
// qwen3moe layout, weights are seeded random bytes (slicing never looks at values, only at byte ranges).
// Unlike `essaim synth`, these also cover what synth does not write: dense layers before the MoE layers,
// fused gate_up, a non-default alignment, and files that are not MoE models at all.
//
//   TestMoeSpec spec{.expert_type = GgmlType::Q4_K, .fused_gate_up = true};
//   ASSERT_TRUE(write_test_moe(dir + "/m.gguf", spec).is_ok());
#pragma once

#include <cstdint>
#include <string>

#include "core/ggml_type.h"
#include "core/status.h"
#include "slice/expert_slice.h"
#include "gguf/gguf_file.h"
#include "slice/gguf_slice.h"

namespace essaim::testing {

struct TestMoeSpec {
  std::string arch = "qwen3moe";
  uint32_t n_layer = 3;
  uint32_t n_dense_layers = 0;  // the first layers get a dense FFN instead of routed experts
  uint32_t n_expert = 8;
  uint32_t n_embd = 256;
  uint32_t n_ff = 256;
  GgmlType expert_type = GgmlType::F32;
  GgmlType down_type = GgmlType::COUNT;  // COUNT = same as expert_type (Q4_K_M files use Q6_K on some)
  bool fused_gate_up = false;
  bool with_experts = true;  // false: a dense model (no *_exps tensors, no expert_count)
  uint32_t alignment = 32;
  uint64_t seed = 1;
};

Status write_test_moe(const std::string& path, const TestMoeSpec& spec);

// Every expert slab of every tensor the slice holds equals the source's slab of the same global expert
// (gtest expectations).
void expect_slice_matches_source(const GgufFile& src, const ExpertSlice& s);
// Every non-expert tensor byte-identical, no routed-expert tensor, every source KV present and equal.
void expect_backbone_matches_source(const GgufFile& src, const MoeLayout& moe, const GgufFile& bb);

// A fresh empty directory under the system temp dir, unique per test.
std::string make_test_dir(const std::string& name);

}  // namespace essaim::testing
