// Loading refuses a GGUF that lacks a required key or tensor, has a key of the wrong type, a tensor of the
// wrong shape or type, an extra tensor, or an unsupported architecture — each with a message naming it.
// The files are the F32 llama.cpp fixture rewritten through GgufWriter with one change each.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <map>
#include <optional>

#include "gguf_edit.h"
#include "model_test_util.h"

namespace essaim {
namespace {

using test::GgufEdit;
using test::gguf_i32;
using test::gguf_u32;

// Writes the fixture with the edit applied and returns the path.
std::string rewrite(const std::string& name, const GgufEdit& e) {
  return test::gguf_rewrite(test::fixture("qwen3moe-small-f32.gguf"), "loader_test_" + name, e);
}

std::string load_error(const std::string& name, const GgufEdit& e) {
  const std::string path = rewrite(name, e);
  Result<std::unique_ptr<Model>> m = load_model(path);
  std::remove(path.c_str());
  return m.is_ok() ? std::string("(loaded)") : m.status().message();
}

TEST(Loader, UnmodifiedRewriteLoadsAndMatchesTheOriginal) {
  const std::string path = rewrite("same", {});
  std::unique_ptr<Model> a = test::load_or_die(path);
  std::unique_ptr<Model> b = test::load_or_die(test::fixture("qwen3moe-small-f32.gguf"));
  ASSERT_TRUE(a && b);
  const std::vector<int32_t> tokens = {1, 2, 3, 250};
  EXPECT_EQ(test::eval_logits(*a, tokens), test::eval_logits(*b, tokens));
  EXPECT_EQ(a->info().n_layer, 2);
  EXPECT_EQ(a->info().n_expert, 8);
  EXPECT_EQ(a->info().n_expert_used, 4);
  EXPECT_EQ(a->expert_store().ranges(1).size(), 1u);
  std::remove(path.c_str());
}

TEST(Loader, MissingRequiredKeyIsNamed) {
  for (const char* key : {"qwen3moe.attention.layer_norm_rms_epsilon", "qwen3moe.block_count",
                          "qwen3moe.expert_count", "qwen3moe.embedding_length", "general.architecture"}) {
    const std::string msg = load_error("missing_key", {.drop_keys = {key}});
    EXPECT_NE(msg.find("'" + std::string(key) + "' is missing"), std::string::npos) << key << ": " << msg;
  }
}

TEST(Loader, KeyOfTheWrongTypeIsNamed) {
  const std::string msg = load_error("wrong_type", {.set_keys = {{"qwen3moe.block_count", gguf_i32(2)}}});
  EXPECT_NE(msg.find("metadata key 'qwen3moe.block_count' has type INT32, expected UINT32"), std::string::npos) << msg;
}

TEST(Loader, OutOfRangeValuesAreRefused) {
  std::string msg = load_error("used_gt_count", {.set_keys = {{"qwen3moe.expert_used_count", gguf_u32(9)}}});
  EXPECT_NE(msg.find("'qwen3moe.expert_used_count' = 9 is outside [1, 8]"), std::string::npos) << msg;
  msg = load_error("rope_dims", {.set_keys = {{"qwen3moe.rope.dimension_count", gguf_u32(32)}}});
  EXPECT_NE(msg.find("rope.dimension_count (32) must equal the head dimension (64)"), std::string::npos) << msg;
  msg = load_error("yarn", {.set_keys = {{"qwen3moe.rope.scaling.type", gguf_string("yarn")}}});
  EXPECT_NE(msg.find("rope scaling 'yarn' is not supported"), std::string::npos) << msg;
}

TEST(Loader, MissingTensorIsNamed) {
  const std::string msg = load_error("missing_tensor", {.drop_tensors = {"blk.1.ffn_down_exps.weight"}});
  EXPECT_NE(msg.find("required tensor 'blk.1.ffn_down_exps.weight' is missing"), std::string::npos) << msg;
}

TEST(Loader, WrongShapeIsNamed) {
  std::string msg = load_error("wrong_shape", {.reshape = {{"blk.0.attn_k_norm.weight", {32}}}});
  EXPECT_NE(msg.find("tensor 'blk.0.attn_k_norm.weight' has shape [32], expected [64]"), std::string::npos) << msg;
  msg = load_error("wrong_exps", {.reshape = {{"blk.1.ffn_gate_exps.weight", {256, 256, 7}}}});
  EXPECT_NE(msg.find("tensor 'blk.1.ffn_gate_exps.weight' has shape [256, 256, 7], expected [256, 256, 8]"),
            std::string::npos) << msg;
}

TEST(Loader, WrongTypeIsNamed) {
  const std::string msg = load_error("norm_f16", {.retype = {{"output_norm.weight", GgmlType::F16}}});
  EXPECT_NE(msg.find("tensor 'output_norm.weight' has type F16, expected F32"), std::string::npos) << msg;
}

TEST(Loader, ExtraTensorIsNamed) {
  const std::string msg = load_error("extra", {.add_tensors = {{.name = "blk.0.mystery.weight", .type = GgmlType::F32, .ne = {4}, .bytes = std::vector<uint8_t>(16, 0)}}});
  EXPECT_NE(msg.find("unexpected tensor 'blk.0.mystery.weight'"), std::string::npos) << msg;
}

TEST(Loader, UnsupportedArchitectureIsNamed) {
  const std::string msg = load_error("llama", {.set_keys = {{"general.architecture", gguf_string("llama")}}});
  EXPECT_NE(msg.find("unsupported architecture 'llama' (supported: qwen3moe"), std::string::npos) << msg;
}

TEST(Loader, AbsentOutputTiesTheLmHeadToTheEmbeddings) {
  // Without output.weight the LM head is token_embd: the same logits, bit for bit, as a file whose
  // output.weight holds a copy of the embedding table — and different from the original head.
  const std::string tied_path = rewrite("tied", {.drop_tensors = {"output.weight"}});
  const std::string copy_path = rewrite("copy", {.copy_data = {{"output.weight", "token_embd.weight"}}});
  std::unique_ptr<Model> tied = test::load_or_die(tied_path);
  std::unique_ptr<Model> copy = test::load_or_die(copy_path);
  std::unique_ptr<Model> original = test::load_or_die(test::fixture("qwen3moe-small-f32.gguf"));
  ASSERT_TRUE(tied && copy && original);
  const std::vector<int32_t> tokens = {5, 77, 200};
  const std::vector<float> a = test::eval_logits(*tied, tokens);
  EXPECT_EQ(a, test::eval_logits(*copy, tokens));
  EXPECT_NE(a, test::eval_logits(*original, tokens));
  std::remove(tied_path.c_str());
  std::remove(copy_path.c_str());
}

TEST(Loader, FusedQkvProjectionGivesTheSameLogits) {
  // docs/reference.md 4.2 accepts blk.i.attn_qkv instead of q/k/v: each output row is the same dot product, so
  // the logits must not change by a bit.
  const std::string path = rewrite("fused_qkv", {.fuse_qkv = true});
  std::unique_ptr<Model> fused = test::load_or_die(path);
  std::unique_ptr<Model> separate = test::load_or_die(test::fixture("qwen3moe-small-f32.gguf"));
  ASSERT_TRUE(fused && separate);
  ASSERT_NE(fused->file().find_tensor("blk.1.attn_qkv.weight"), nullptr);
  const std::vector<int32_t> tokens = {3, 141, 59, 26, 5};
  EXPECT_EQ(test::eval_logits(*fused, tokens, {.batch = 2}), test::eval_logits(*separate, tokens));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace essaim
