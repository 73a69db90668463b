// The reader loads every GGUF written by llama.cpp's tools in ../shared/fixtures, and the inspect JSON
// shows what the fixtures' README.md describes.
#include <filesystem>

#include "gguf/gguf_inspect.h"
#include "gguf_test_util.h"

namespace essaim {
namespace {

using nlohmann::json;

std::vector<std::string> fixture_files() {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(ESSAIM_FIXTURES_DIR, ec))
    if (e.path().extension() == ".gguf") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

json inspect(const std::string& path) {
  Result<GgufFile> f = GgufFile::open(path);
  EXPECT_TRUE(f) << f.status().message();
  if (!f) return json();
  return gguf_inspect_json(*f, {.full_arrays = true});
}

uint64_t u(const json& m, const std::string& key) {
  EXPECT_TRUE(m.contains(key)) << key;
  if (!m.contains(key)) return 0;
  EXPECT_EQ(m[key]["type"], "UINT32") << key;
  return m[key]["value"].get<uint64_t>();
}

const json* tensor(const json& j, const std::string& name) {
  for (const json& t : j["tensors"])
    if (t["name"] == name) return &t;
  return nullptr;
}

TEST(GgufFixtures, AllFourFilesArePresent) {
  const std::vector<std::string> files = fixture_files();
  EXPECT_EQ(files.size(), 4u) << "fixtures dir: " << ESSAIM_FIXTURES_DIR;
}

TEST(GgufFixtures, MetadataMatchesTheReadme) {
  const std::vector<std::string> files = fixture_files();
  ASSERT_FALSE(files.empty());
  for (const std::string& path : files) {
    SCOPED_TRACE(path);
    const json j = inspect(path);
    ASSERT_TRUE(j.is_object());
    const json& m = j["metadata"];
    const bool q35 = path.find("qwen35moe") != std::string::npos;
    const std::string a = q35 ? "qwen35moe" : "qwen3moe";
    EXPECT_EQ(m["general.architecture"]["value"], a);
    EXPECT_EQ(u(m, a + ".block_count"), 2u);
    EXPECT_EQ(u(m, a + ".embedding_length"), 256u);
    EXPECT_EQ(u(m, a + ".expert_count"), 8u);
    EXPECT_EQ(u(m, a + ".expert_used_count"), 4u);
    EXPECT_EQ(u(m, a + ".expert_feed_forward_length"), 256u);
    EXPECT_EQ(u(m, a + ".attention.head_count"), 4u);
    EXPECT_EQ(u(m, a + ".attention.head_count_kv"), 2u);
    EXPECT_EQ(u(m, a + ".attention.key_length"), 64u);
    EXPECT_EQ(u(m, a + ".attention.value_length"), 64u);
    EXPECT_EQ(m["tokenizer.ggml.model"]["value"], "gpt2");
    EXPECT_EQ(m["tokenizer.ggml.pre"]["value"], "qwen2");
    const json& tokens = m["tokenizer.ggml.tokens"];
    EXPECT_EQ(tokens["count"], 279);
    ASSERT_EQ(tokens["values"].size(), 279u);
    EXPECT_EQ(tokens["values"][276], "<|endoftext|>");
    EXPECT_EQ(tokens["values"][277], "<|im_start|>");
    EXPECT_EQ(tokens["values"][278], "<|im_end|>");
    EXPECT_EQ(m["tokenizer.ggml.merges"]["count"], 20);
    if (q35) {
      // Gated DeltaNet + gated attention specifics (README: 16 rotary dims, GDN 2 key / 4 value heads x 32,
      // conv kernel 4, full attention every 2nd layer, shared expert ff 256).
      EXPECT_EQ(u(m, a + ".rope.dimension_count"), 16u);
      EXPECT_EQ(u(m, a + ".full_attention_interval"), 2u);
      EXPECT_EQ(u(m, a + ".ssm.conv_kernel"), 4u);
      EXPECT_EQ(u(m, a + ".ssm.group_count"), 2u);
      EXPECT_EQ(u(m, a + ".ssm.time_step_rank"), 4u);
      EXPECT_EQ(u(m, a + ".ssm.state_size"), 32u);
      EXPECT_EQ(u(m, a + ".ssm.inner_size"), 128u);
      EXPECT_EQ(u(m, a + ".expert_shared_feed_forward_length"), 256u);
      EXPECT_NE(tensor(j, "blk.0.ssm_conv1d.weight"), nullptr);  // layer 0 recurrent
      EXPECT_EQ(tensor(j, "blk.0.attn_q.weight"), nullptr);
      EXPECT_NE(tensor(j, "blk.1.attn_q.weight"), nullptr);      // layer 1 full attention
      EXPECT_EQ(tensor(j, "blk.1.ssm_conv1d.weight"), nullptr);
    }
  }
}

// F32 files: everything F32. Q4_K files: routed (and shared) experts Q4_K, other 2-D weights Q8_0 including
// token_embd and output, norms / router / conv F32.
TEST(GgufFixtures, TensorTypesMatchTheReadme) {
  for (const std::string& path : fixture_files()) {
    SCOPED_TRACE(path);
    const json j = inspect(path);
    ASSERT_TRUE(j.is_object());
    const bool q4k = path.find("q4k") != std::string::npos;
    for (const json& t : j["tensors"]) {
      const std::string name = t["name"];
      SCOPED_TRACE(name);
      std::string want = "F32";
      if (q4k) {
        const bool expert = name.find("_exps") != std::string::npos || name.find("_shexp.") != std::string::npos;
        const bool f32_2d = name.find("ffn_gate_inp") != std::string::npos ||
                            name.find("ssm_conv1d") != std::string::npos;
        if (t["n_dims"] == 1 || f32_2d) want = "F32";
        else if (expert) want = "Q4_K";
        else want = "Q8_0";
      }
      EXPECT_EQ(t["type"], want);
    }
    if (q4k) {
      EXPECT_EQ((*tensor(j, "token_embd.weight"))["type"], "Q8_0");
      EXPECT_EQ((*tensor(j, "output.weight"))["type"], "Q8_0");
    }
    EXPECT_EQ((*tensor(j, "token_embd.weight"))["ne"], json::array({256, 279}));
  }
}

TEST(GgufFixtures, ExpertSlabsCoverEachExpertTensorExactly) {
  for (const std::string& path : fixture_files()) {
    SCOPED_TRACE(path);
    const json j = inspect(path);
    ASSERT_TRUE(j.is_object());
    size_t expert_tensors = 0;
    for (const json& t : j["tensors"]) {
      if (t["name"].get<std::string>().find("_exps") == std::string::npos) continue;
      SCOPED_TRACE(t["name"].get<std::string>());
      ++expert_tensors;
      EXPECT_EQ(t["ne"], json::array({256, 256, 8}));
      const json& slabs = t["expert_slabs"];
      ASSERT_EQ(slabs.size(), 8u);
      uint64_t next = t["file_offset"];
      for (size_t e = 0; e < 8; ++e) {
        EXPECT_EQ(slabs[e]["expert"], e);
        EXPECT_EQ(slabs[e]["file_offset"], next);
        next += slabs[e]["bytes"].get<uint64_t>();
      }
      EXPECT_EQ(next - t["file_offset"].get<uint64_t>(), t["bytes"].get<uint64_t>());
      EXPECT_LE(next, j["file_size"].get<uint64_t>());
    }
    EXPECT_EQ(expert_tensors, 6u);  // gate, up, down x 2 layers
  }
}

TEST(GgufFixtures, TextRenderingListsEveryTensor) {
  for (const std::string& path : fixture_files()) {
    Result<GgufFile> f = GgufFile::open(path);
    ASSERT_TRUE(f) << f.status().message();
    const std::string text = gguf_inspect_text(*f, {});
    for (const GgufTensor& t : f->tensors()) EXPECT_NE(text.find(t.name), std::string::npos) << t.name;
    EXPECT_NE(text.find("expert slabs: 8 x"), std::string::npos);
  }
}

}  // namespace
}  // namespace essaim
