// The inspect renderer: JSON for programs (array caps, expert slabs), text for people.
#include "gguf/gguf_inspect.h"
#include "gguf_test_util.h"

namespace essaim {
namespace {

using nlohmann::json;

struct Inspected {
  std::vector<uint8_t> bytes;
  GgufFile file;
};

std::vector<uint8_t> small_moe_bytes() {
  GgufWriter w;
  w.set_string("general.architecture", "qwen3moe");
  w.set_u32("qwen3moe.expert_count", 5);
  w.set_f32("qwen3moe.rope.freq_base", 1e6f);
  w.set_bool("tokenizer.ggml.add_bos_token", false);
  w.set_i64("neg", -3);
  std::vector<std::string> tokens;
  for (int i = 0; i < 40; ++i) tokens.push_back("tok" + std::to_string(i));
  w.set_array_string("tokenizer.ggml.tokens", tokens);
  w.set_string("bad_utf8", "ok\xff\xc3(");
  w.add_tensor("token_embd.weight", GgmlType::F32, {8, 4});
  w.add_tensor("blk.0.ffn_up_exps.weight", GgmlType::Q8_0, {64, 3, 5});
  w.add_tensor("blk.0.not_experts", GgmlType::F32, {2, 2, 2});
  w.add_tensor("blk.0.ffn_gate_exps.flat", GgmlType::F32, {4, 4});
  std::vector<std::vector<uint8_t>> data;
  for (size_t i = 0; i < w.tensor_count(); ++i) data.push_back(test::pattern_bytes(w.tensor_nbytes(i), 3));
  return test::write_gguf(w, data);
}

TEST(GgufInspect, JsonMetadataWithArrayCap) {
  const std::vector<uint8_t> bytes = small_moe_bytes();
  Result<GgufFile> f = GgufFile::parse(bytes);
  ASSERT_TRUE(f) << f.status().message();
  const json j = gguf_inspect_json(*f, {});
  EXPECT_EQ(j["version"], 3);
  EXPECT_EQ(j["alignment"], 32);
  EXPECT_EQ(j["kv_count"], 7);
  EXPECT_EQ(j["tensor_count"], 4);
  EXPECT_EQ(j["file_size"], bytes.size());
  const json& m = j["metadata"];
  EXPECT_EQ(m["general.architecture"]["type"], "STRING");
  EXPECT_EQ(m["general.architecture"]["value"], "qwen3moe");
  EXPECT_EQ(m["qwen3moe.expert_count"]["type"], "UINT32");
  EXPECT_EQ(m["qwen3moe.expert_count"]["value"], 5);
  EXPECT_EQ(m["qwen3moe.rope.freq_base"]["value"], 1e6);
  EXPECT_EQ(m["tokenizer.ggml.add_bos_token"]["value"], false);
  EXPECT_EQ(m["neg"]["value"], -3);
  const json& tokens = m["tokenizer.ggml.tokens"];
  EXPECT_EQ(tokens["type"], "ARRAY");
  EXPECT_EQ(tokens["elem_type"], "STRING");
  EXPECT_EQ(tokens["count"], 40);
  EXPECT_EQ(tokens["values"].size(), 16u);
  EXPECT_EQ(tokens["values"][15], "tok15");
  EXPECT_EQ(tokens["truncated"], true);
  // Invalid UTF-8 is replaced, so the document always serialises.
  EXPECT_EQ(m["bad_utf8"]["value"], "ok\xEF\xBF\xBD\xEF\xBF\xBD(");
  EXPECT_NO_THROW((void)j.dump());

  const json full = gguf_inspect_json(*f, {.full_arrays = true});
  EXPECT_EQ(full["metadata"]["tokenizer.ggml.tokens"]["values"].size(), 40u);
  EXPECT_EQ(full["metadata"]["tokenizer.ggml.tokens"]["values"][39], "tok39");
  EXPECT_EQ(full["metadata"]["tokenizer.ggml.tokens"]["truncated"], false);
}

TEST(GgufInspect, JsonTensorsAndExpertSlabs) {
  const std::vector<uint8_t> bytes = small_moe_bytes();
  Result<GgufFile> f = GgufFile::parse(bytes);
  ASSERT_TRUE(f) << f.status().message();
  const json j = gguf_inspect_json(*f, {});
  const json& t = j["tensors"];
  ASSERT_EQ(t.size(), 4u);
  EXPECT_EQ(t[0]["name"], "token_embd.weight");
  EXPECT_EQ(t[0]["type"], "F32");
  EXPECT_EQ(t[0]["ne"], json::array({8, 4}));
  EXPECT_EQ(t[0]["offset"], 0);
  EXPECT_EQ(t[0]["file_offset"], f->data_start());
  EXPECT_EQ(t[0]["bytes"], 128);
  EXPECT_FALSE(t[0].contains("expert_slabs"));
  const json& up = t[1];
  EXPECT_EQ(up["type"], "Q8_0");
  EXPECT_EQ(up["ne"], json::array({64, 3, 5}));
  ASSERT_EQ(up["expert_slabs"].size(), 5u);
  uint64_t next = up["file_offset"];
  for (int e = 0; e < 5; ++e) {
    EXPECT_EQ(up["expert_slabs"][e]["expert"], e);
    EXPECT_EQ(up["expert_slabs"][e]["file_offset"], next);
    EXPECT_EQ(up["expert_slabs"][e]["bytes"], 2 * 34 * 3);
    next += up["expert_slabs"][e]["bytes"].get<uint64_t>();
  }
  EXPECT_EQ(next, up["file_offset"].get<uint64_t>() + up["bytes"].get<uint64_t>());
  EXPECT_FALSE(t[2].contains("expert_slabs"));  // 3-D but not "_exps"
  EXPECT_FALSE(t[3].contains("expert_slabs"));  // "_exps" but 2-D
}

TEST(GgufInspect, TextForPeople) {
  const std::vector<uint8_t> bytes = small_moe_bytes();
  Result<GgufFile> f = GgufFile::parse(bytes);
  ASSERT_TRUE(f) << f.status().message();
  const std::string text = gguf_inspect_text(*f, {.text_expert_preview = 2});
  auto has = [&](const std::string& s) { return text.find(s) != std::string::npos; };
  EXPECT_TRUE(has("GGUF v3")) << text;
  EXPECT_TRUE(has("metadata (7 keys)"));
  EXPECT_TRUE(has("\"qwen3moe\""));
  EXPECT_TRUE(has("ARRAY[STRING]"));
  EXPECT_TRUE(has("count 40 [\"tok0\", \"tok1\""));
  EXPECT_TRUE(has("ok\\xff"));  // escaped, not raw bytes
  EXPECT_TRUE(has("tensors (4)"));
  EXPECT_TRUE(has("[64, 3, 5]"));
  EXPECT_TRUE(has("expert slabs: 5 x 204 bytes"));
  EXPECT_TRUE(has("... 1 more"));
  EXPECT_FALSE(has("expert 2 "));
  const std::string full = gguf_inspect_text(*f, {.full_arrays = true, .text_expert_preview = 2});
  EXPECT_NE(full.find("expert 2 "), std::string::npos);
  EXPECT_NE(full.find("\"tok39\"]"), std::string::npos);
}

}  // namespace
}  // namespace essaim
