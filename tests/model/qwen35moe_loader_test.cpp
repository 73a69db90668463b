// Loading qwen35moe refuses a file with a missing or mistyped key, inconsistent Gated DeltaNet / rope
// hyperparameters, a missing tensor, a tensor of the wrong shape or type, or a tensor the layer kind does not
// have — each with a message naming it. Accepted spellings of the same thing (UINT32 vs INT32 section arrays,
// a broadcast scalar, INT32 recurrent flags) load and give the same logits. The files are llama.cpp's F32
// fixture rewritten with one change each.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

#include "gguf_edit.h"
#include "model_test_util.h"

namespace essaim {
namespace {

using test::gguf_array;
using test::gguf_i32;
using test::gguf_u32;

const std::string kSource = test::fixture("qwen35moe-small-f32.gguf");

std::string load_error(const std::string& name, const test::GgufEdit& e) {
  const std::string path = test::gguf_rewrite(kSource, "q35_loader_" + name, e);
  Result<std::unique_ptr<Model>> m = load_model(path);
  std::remove(path.c_str());
  return m.is_ok() ? std::string("(loaded)") : m.status().message();
}

void expect_error(const std::string& name, const test::GgufEdit& e, const std::string& want) {
  const std::string msg = load_error(name, e);
  EXPECT_NE(msg.find(want), std::string::npos) << name << ": got \"" << msg << "\", want \"" << want << "\"";
}

// Logits of a few tokens of the rewritten file, or empty when it does not load.
std::vector<float> logits_of(const std::string& name, const test::GgufEdit& e) {
  const std::string path = test::gguf_rewrite(kSource, "q35_loader_" + name, e);
  std::unique_ptr<Model> m = test::load_or_die(path);
  std::remove(path.c_str());
  return m ? test::eval_logits(*m, {3, 141, 59, 26, 5}) : std::vector<float>{};
}

TEST(Qwen35Loader, MissingRequiredKeysAreNamed) {
  for (const char* key : {"qwen35moe.ssm.conv_kernel", "qwen35moe.ssm.inner_size", "qwen35moe.ssm.state_size",
                          "qwen35moe.ssm.time_step_rank", "qwen35moe.ssm.group_count",
                          "qwen35moe.rope.dimension_sections", "qwen35moe.attention.layer_norm_rms_epsilon",
                          "qwen35moe.block_count", "qwen35moe.expert_count", "qwen35moe.embedding_length"})
    expect_error("missing_key", {.drop_keys = {key}}, "'" + std::string(key) + "' is missing");
}

TEST(Qwen35Loader, KeysOfTheWrongTypeAreNamed) {
  expect_error("conv_i32", {.set_keys = {{"qwen35moe.ssm.conv_kernel", gguf_i32(4)}}},
               "metadata key 'qwen35moe.ssm.conv_kernel' has type INT32, expected UINT32");
  expect_error("flags_str", {.set_keys = {{"qwen35moe.attention.recurrent_layers", gguf_string("1,0")}}},
               "metadata key 'qwen35moe.attention.recurrent_layers' has type STRING");
  GgufValue sections_f32;
  sections_f32.type = GgufValueType::ARRAY;
  sections_f32.elem_type = GgufValueType::FLOAT32;
  sections_f32.floats = {3, 3, 2, 0};
  expect_error("sections_f32", {.set_keys = {{"qwen35moe.rope.dimension_sections", sections_f32}}},
               "metadata key 'qwen35moe.rope.dimension_sections' has type ARRAY");
}

TEST(Qwen35Loader, InconsistentHyperparametersAreRefused) {
  expect_error("inner", {.set_keys = {{"qwen35moe.ssm.inner_size", gguf_u32(96)}}},
               "ssm.inner_size (96) must equal ssm.time_step_rank (4) x ssm.state_size (32)");
  expect_error("groups", {.set_keys = {{"qwen35moe.ssm.group_count", gguf_u32(3)}}},
               "ssm.time_step_rank (4) is not a multiple of ssm.group_count (3)");
  expect_error("rot_odd", {.set_keys = {{"qwen35moe.rope.dimension_count", gguf_u32(15)}}},
               "'qwen35moe.rope.dimension_count' = 15 must be even and at most the head dimension (64)");
  expect_error("sections_3", {.set_keys = {{"qwen35moe.rope.dimension_sections",
                                            gguf_array(GgufValueType::INT32, {3, 3, 2})}}},
               "'qwen35moe.rope.dimension_sections' has 3 entries, expected 4");
  expect_error("sections_0", {.set_keys = {{"qwen35moe.rope.dimension_sections",
                                            gguf_array(GgufValueType::INT32, {0, 0, 0, 0})}}},
               "'qwen35moe.rope.dimension_sections' has all sections 0");
  expect_error("interval_0", {.set_keys = {{"qwen35moe.full_attention_interval", gguf_u32(0)}}},
               "'qwen35moe.full_attention_interval' = 0 is outside");
  expect_error("nextn", {.set_keys = {{"qwen35moe.nextn_predict_layers", gguf_u32(2)}}},
               "'qwen35moe.nextn_predict_layers' = 2 leaves no executed layer (block_count 2)");
  expect_error("flags_len", {.set_keys = {{"qwen35moe.attention.recurrent_layers",
                                           gguf_array(GgufValueType::BOOL, {1, 0, 0})}}},
               "'qwen35moe.attention.recurrent_layers' has 3 entries, expected one per block (2)");
  expect_error("huge_state", {.set_keys = {{"qwen35moe.ssm.time_step_rank", gguf_u32(4096)},
                                            {"qwen35moe.ssm.state_size", gguf_u32(4096)},
                                            {"qwen35moe.ssm.inner_size", gguf_u32(4096 * 4096)}}},
               "recurrent state of ssm.inner_size x ssm.state_size = 68719476736 floats per layer exceeds");
  expect_error("yarn", {.set_keys = {{"qwen35moe.rope.scaling.type", gguf_string("yarn")}}},
               "rope scaling 'yarn' is not supported");
}

TEST(Qwen35Loader, EquivalentSpellingsLoadAndAgree) {
  const std::vector<float> base = logits_of("same", {});
  ASSERT_FALSE(base.empty());
  // Sections as UINT32; as one INT32 broadcast to all four (3,3,3,3 also sends all 8 pairs to t/h/w).
  EXPECT_EQ(logits_of("sections_u32", {.set_keys = {{"qwen35moe.rope.dimension_sections",
                                                     gguf_array(GgufValueType::UINT32, {3, 3, 2, 0})}}}),
            base);
  EXPECT_EQ(logits_of("sections_scalar", {.set_keys = {{"qwen35moe.rope.dimension_sections", gguf_i32(3)}}}), base);
  // The interval (2 in this file) replaced by INT32 flags saying the same.
  EXPECT_EQ(logits_of("flags_i32", {.drop_keys = {"qwen35moe.full_attention_interval"},
                                    .set_keys = {{"qwen35moe.attention.recurrent_layers",
                                                  gguf_array(GgufValueType::INT32, {1, 0})}}}),
            base);
  // Sections that send pairs to p_e leave them unrotated: the logits change (the key is really read).
  EXPECT_NE(logits_of("sections_e", {.set_keys = {{"qwen35moe.rope.dimension_sections",
                                                   gguf_array(GgufValueType::INT32, {1, 1, 0, 6})}}}),
            base);
}

TEST(Qwen35Loader, MissingTensorsAreNamed) {
  for (const char* t : {"blk.0.ssm_conv1d.weight", "blk.0.ssm_a", "blk.0.ssm_dt.bias", "blk.0.attn_qkv.weight",
                        "blk.1.attn_q.weight", "blk.1.attn_k_norm.weight", "blk.0.ffn_gate_inp_shexp.weight",
                        "blk.1.ffn_down_shexp.weight", "blk.1.post_attention_norm.weight"})
    expect_error("missing_tensor", {.drop_tensors = {t}}, "required tensor '" + std::string(t) + "' is missing");
}

TEST(Qwen35Loader, WrongShapesAndTypesAreNamed) {
  expect_error("conv_shape", {.reshape = {{"blk.0.ssm_conv1d.weight", {3, 256}}}},
               "tensor 'blk.0.ssm_conv1d.weight' has shape [3, 256], expected [4, 256]");
  expect_error("q_shape", {.reshape = {{"blk.1.attn_q.weight", {256, 256}}}},
               "tensor 'blk.1.attn_q.weight' has shape [256, 256], expected [256, 512]");
  expect_error("shexp_shape", {.reshape = {{"blk.0.ffn_up_shexp.weight", {256, 128}}}},
               "tensor 'blk.0.ffn_up_shexp.weight' has shape [256, 128], expected [256, 256]");
  expect_error("ssm_a_type", {.retype = {{"blk.0.ssm_a", GgmlType::F16}}},
               "tensor 'blk.0.ssm_a' has type F16, expected F32");
  expect_error("conv_type", {.retype = {{"blk.0.ssm_conv1d.weight", GgmlType::F16}}},
               "tensor 'blk.0.ssm_conv1d.weight' has type F16, expected F32");
}

TEST(Qwen35Loader, TensorOfTheOtherLayerKindIsRefused) {
  // An attention projection on a Gated DeltaNet layer is not part of this architecture's layer: refused.
  test::NewTensor q{"blk.0.attn_k.weight", GgmlType::F32, {256, 128}, std::vector<uint8_t>(256 * 128 * 4, 0)};
  expect_error("stray", {.add_tensors = {q}}, "unexpected tensor 'blk.0.attn_k.weight'");
}

}  // namespace
}  // namespace essaim
