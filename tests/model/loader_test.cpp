// Loading refuses a GGUF that lacks a required key or tensor, has a key of the wrong type, a tensor of the
// wrong shape or type, an extra tensor, or an unsupported architecture — each with a message naming it.
// The files are the F32 llama.cpp fixture rewritten through GgufWriter with one change each.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <map>
#include <optional>

#include "gguf/gguf_writer.h"
#include "model_test_util.h"

namespace essaim {
namespace {

struct Edit {
  std::vector<std::string> drop_keys{};
  std::map<std::string, GgufValue> set_keys{};          // replaces or adds
  std::vector<std::string> drop_tensors{};
  std::map<std::string, std::vector<int64_t>> reshape{};  // new extents, zero-filled data
  std::map<std::string, GgmlType> retype{};               // new type, zero-filled data
  std::vector<std::string> add_tensors{};                 // extra F32 [4] tensors
  std::map<std::string, std::string> copy_data{};         // tensor -> tensor whose bytes it takes (same size)
  bool fuse_qkv = false;  // attn_q/k/v -> one attn_qkv [E, H·D + 2·Hkv·D] (rows q, then k, then v)
};

GgufValue u32_value(uint32_t v) {
  GgufValue x;
  x.type = GgufValueType::UINT32;
  x.u = v;
  return x;
}
GgufValue i32_value(int32_t v) {
  GgufValue x;
  x.type = GgufValueType::INT32;
  x.i = v;
  return x;
}
GgufValue string_value(const std::string& s) {
  GgufValue x;
  x.type = GgufValueType::STRING;
  x.str = s;
  return x;
}

// Writes the fixture with the edit applied and returns the path.
std::string rewrite(const std::string& name, const Edit& e) {
  Result<GgufFile> src = GgufFile::open(test::fixture("qwen3moe-small-f32.gguf"));
  EXPECT_TRUE(src.is_ok());
  GgufWriter w;
  for (const GgufKv& kv : src->kvs()) {
    if (kv.key == "general.alignment") continue;  // the writer sets it
    if (std::find(e.drop_keys.begin(), e.drop_keys.end(), kv.key) != e.drop_keys.end()) continue;
    auto it = e.set_keys.find(kv.key);
    w.set_value(kv.key, it != e.set_keys.end() ? it->second : kv.value);
  }
  for (const auto& [key, value] : e.set_keys)
    if (!src->find_kv(key)) w.set_value(key, value);

  struct Out {
    std::vector<std::span<const uint8_t>> bytes;  // written one after the other
    uint64_t zeros = 0;
  };
  std::vector<Out> data;
  auto ends_with = [](const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  for (const GgufTensor& t : src->tensors()) {
    if (std::find(e.drop_tensors.begin(), e.drop_tensors.end(), t.name) != e.drop_tensors.end()) continue;
    if (e.fuse_qkv && (ends_with(t.name, ".attn_k.weight") || ends_with(t.name, ".attn_v.weight"))) continue;
    if (e.fuse_qkv && ends_with(t.name, ".attn_q.weight")) {
      const std::string blk = t.name.substr(0, t.name.size() - std::string("attn_q.weight").size());
      const GgufTensor* k = src->find_tensor(blk + "attn_k.weight");
      const GgufTensor* v = src->find_tensor(blk + "attn_v.weight");
      w.add_tensor(blk + "attn_qkv.weight", t.type, {t.ne[0], t.ne[1] + k->ne[1] + v->ne[1]});
      data.push_back(Out{{t.bytes(), k->bytes(), v->bytes()}});
      continue;
    }
    std::vector<int64_t> ne(t.ne.begin(), t.ne.begin() + t.n_dims);
    GgmlType type = t.type;
    bool changed = false;
    if (auto it = e.reshape.find(t.name); it != e.reshape.end()) ne = it->second, changed = true;
    if (auto it = e.retype.find(t.name); it != e.retype.end()) type = it->second, changed = true;
    w.add_tensor(t.name, type, ne);
    uint64_t n = 1;
    for (int64_t d : ne) n *= uint64_t(d);
    std::span<const uint8_t> bytes = t.bytes();
    if (auto it = e.copy_data.find(t.name); it != e.copy_data.end()) bytes = src->find_tensor(it->second)->bytes();
    data.push_back(changed ? Out{{}, n / type_traits(type).block_size * type_traits(type).type_size} : Out{{bytes}});
  }
  for (const std::string& extra : e.add_tensors) {
    w.add_tensor(extra, GgmlType::F32, {4});
    data.push_back(Out{{}, 16});
  }
  const std::string path = std::string(ESSAIM_BINARY_DIR) + "/loader_test_" + name + ".gguf";
  EXPECT_TRUE(w.begin(path).is_ok());
  for (const Out& o : data) {
    if (o.zeros) {
      std::vector<uint8_t> z(o.zeros, 0);
      EXPECT_TRUE(w.write_tensor_data(z).is_ok());
    } else {
      for (std::span<const uint8_t> b : o.bytes) EXPECT_TRUE(w.write_tensor_data(b).is_ok());
    }
  }
  EXPECT_TRUE(w.finish().is_ok());
  return path;
}

std::string load_error(const std::string& name, const Edit& e) {
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
  const std::string msg = load_error("wrong_type", {.set_keys = {{"qwen3moe.block_count", i32_value(2)}}});
  EXPECT_NE(msg.find("metadata key 'qwen3moe.block_count' has type INT32, expected UINT32"), std::string::npos) << msg;
}

TEST(Loader, OutOfRangeValuesAreRefused) {
  std::string msg = load_error("used_gt_count", {.set_keys = {{"qwen3moe.expert_used_count", u32_value(9)}}});
  EXPECT_NE(msg.find("'qwen3moe.expert_used_count' = 9 is outside [1, 8]"), std::string::npos) << msg;
  msg = load_error("rope_dims", {.set_keys = {{"qwen3moe.rope.dimension_count", u32_value(32)}}});
  EXPECT_NE(msg.find("rope.dimension_count (32) must equal the head dimension (64)"), std::string::npos) << msg;
  msg = load_error("yarn", {.set_keys = {{"qwen3moe.rope.scaling.type", string_value("yarn")}}});
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
  const std::string msg = load_error("extra", {.add_tensors = {"blk.0.mystery.weight"}});
  EXPECT_NE(msg.find("unexpected tensor 'blk.0.mystery.weight'"), std::string::npos) << msg;
}

TEST(Loader, UnsupportedArchitectureIsNamed) {
  const std::string msg = load_error("llama", {.set_keys = {{"general.architecture", string_value("llama")}}});
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
