// The messages a user sees for broken model files, each asserted as text (issue: errors that say what is
// wrong): metadata strings shown escaped, a non-finite RMS epsilon, a token list shorter than the
// embedding, an absurd general.alignment, and `essaim eval` naming the file once (tokenizer errors too).
// Models are synthesised here (seeded), so the test needs no fixture files.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>

#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "gguf_edit.h"
#include "model/model.h"
#include "synth/synth.h"
#include "temp_dir.h"

namespace essaim {
namespace {

const std::string& base_model() {
  static const std::string path = [] {
    // ctest runs each test in its own process, concurrently: write under a private name, then rename
    // (atomic), so no process ever opens a half-written file.
    const std::string p = std::string(ESSAIM_BINARY_DIR) + "/error_messages_base.gguf";
    const std::string tmp = essaim::testing::make_temp_file_beside(p);
    Result<SynthPlan> plan = synth_plan({.arch = SynthArch::QWEN3MOE, .preset = SynthPreset::TINY, .seed = 3});
    EXPECT_TRUE(plan.is_ok());
    EXPECT_TRUE(synth_write(*plan, tmp).is_ok());
    std::filesystem::rename(tmp, p);
    return p;
  }();
  return path;
}

std::string load_error(const std::string& path) {
  Result<std::unique_ptr<Model>> m = load_model(path);
  return m ? "" : m.status().message();
}

GgufValue f32(float v) {
  GgufValue x;
  x.type = GgufValueType::FLOAT32;
  x.f = v;
  return x;
}

TEST(ErrorMessages, NulAndNonUtf8BytesOfAStringValueAreShownEscaped) {
  const std::string nul = test::gguf_rewrite(
      base_model(), "err_arch_nul", {.set_keys = {{"general.architecture", gguf_string(std::string("qwen3moe\0x", 10))}}});
  std::string e = load_error(nul);
  EXPECT_NE(e.find("unsupported architecture 'qwen3moe\\x00x'"), std::string::npos) << e;
  const std::string raw = test::gguf_rewrite(
      base_model(), "err_arch_ff", {.set_keys = {{"general.architecture", gguf_string("qwen\xff\x01moe")}}});
  e = load_error(raw);
  EXPECT_NE(e.find("'qwen\\xff\\x01moe'"), std::string::npos) << e;
  for (char c : e) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << "raw byte " << int(uint8_t(c)) << " in: " << e;
  // Valid UTF-8 stays readable.
  EXPECT_EQ(gguf_quote_string("modèle"), "'modèle'");
}

TEST(ErrorMessages, NonFiniteRmsEpsilonIsRefusedAsNotAFiniteNumber) {
  const std::string key = "qwen3moe.attention.layer_norm_rms_epsilon";
  const struct {
    float v;
    const char* shown;
  } cases[] = {{std::numeric_limits<float>::quiet_NaN(), "is NaN"},
               {std::numeric_limits<float>::infinity(), "is +Inf"},
               {-std::numeric_limits<float>::infinity(), "is -Inf"}};
  int i = 0;
  for (const auto& c : cases) {
    const std::string p = test::gguf_rewrite(base_model(), "err_eps_" + std::to_string(i++), {.set_keys = {{key, f32(c.v)}}});
    const std::string e = load_error(p);
    EXPECT_NE(e.find("metadata key '" + key + "' " + c.shown + ", not a finite number"), std::string::npos) << e;
  }
  const std::string neg = test::gguf_rewrite(base_model(), "err_eps_neg", {.set_keys = {{key, f32(-1e-6f)}}});
  EXPECT_NE(load_error(neg).find("is negative"), std::string::npos) << load_error(neg);
}

TEST(ErrorMessages, ATokenListShorterThanTheEmbeddingSaysSo) {
  Result<GgufFile> f = GgufFile::open(base_model());
  ASSERT_TRUE(f);
  GgufValue tokens = f->find_kv("tokenizer.ggml.tokens") ? *f->find_kv("tokenizer.ggml.tokens") : GgufValue{};
  const size_t n = tokens.strs.size();
  ASSERT_GT(n, 10u);
  tokens.strs.resize(n - 7);
  const std::string p = test::gguf_rewrite(base_model(), "err_short_vocab", {.set_keys = {{"tokenizer.ggml.tokens", tokens}}});
  const std::string e = load_error(p);
  EXPECT_NE(e.find("'tokenizer.ggml.tokens' lists " + std::to_string(n - 7) + " tokens but token_embd.weight has " +
                   std::to_string(n) + " rows (one per token): the token list is short of 7 entries"),
            std::string::npos)
      << e;
  EXPECT_EQ(e.find("has shape"), std::string::npos) << e;
}

TEST(ErrorMessages, AbsurdAlignmentIsRefusedAsSuch) {
  // A bare header: "GGUF", v3, no tensors, one KV general.alignment (UINT32) = value.
  auto header = [](uint32_t value) {
    std::vector<uint8_t> b = {'G', 'G', 'U', 'F', 3, 0, 0, 0};
    auto u64 = [&](uint64_t v) { for (int i = 0; i < 8; ++i) b.push_back(uint8_t(v >> (8 * i))); };
    auto u32 = [&](uint32_t v) { for (int i = 0; i < 4; ++i) b.push_back(uint8_t(v >> (8 * i))); };
    u64(0);
    u64(1);
    const std::string key = "general.alignment";
    u64(key.size());
    b.insert(b.end(), key.begin(), key.end());
    u32(4);  // UINT32
    u32(value);
    return b;
  };
  for (uint32_t v : {1u << 31, 1u << 17}) {
    std::vector<uint8_t> bytes = header(v);
    Result<GgufFile> f = GgufFile::parse(bytes);
    ASSERT_FALSE(f);
    EXPECT_NE(f.status().message().find("alignment " + std::to_string(v)), std::string::npos) << f.status().message();
    EXPECT_NE(f.status().message().find("is absurdly large (at most 65536 is accepted"), std::string::npos)
        << f.status().message();
  }
  std::vector<uint8_t> ok = header(1u << 16);
  EXPECT_TRUE(GgufFile::parse(ok)) << GgufFile::parse(ok).status().message();
}

struct CliRun {
  int code = -1;
  std::string out;  // stdout and stderr
};

CliRun essaim_cli(const std::string& args) {
  const std::string cmd = std::string(ESSAIM_BINARY_DIR) + "/src/cli/essaim " + args + " 2>&1";
  CliRun r;
  std::FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  for (size_t n; (n = std::fread(buf.data(), 1, buf.size(), p)) > 0;) r.out.append(buf.data(), n);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

size_t occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(ErrorMessages, EvalNamesTheFileOnceAndTokenizerErrorsNameIt) {
  const std::string truncated = std::string(ESSAIM_BINARY_DIR) + "/err_truncated.gguf";
  {
    std::ifstream in(base_model(), std::ios::binary);
    std::vector<char> head(200);
    in.read(head.data(), std::streamsize(head.size()));
    std::ofstream(truncated, std::ios::binary).write(head.data(), std::streamsize(head.size()));
  }
  CliRun r = essaim_cli("eval -m " + truncated + " --tokens 1,2 --logits-out /dev/null");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_EQ(occurrences(r.out, "err_truncated.gguf"), 1u) << r.out;

  const std::string llama_tok = test::gguf_rewrite(
      base_model(), "err_tokenizer", {.set_keys = {{"tokenizer.ggml.model", gguf_string("llama")}}});
  r = essaim_cli("eval -m " + llama_tok + " -p hello --logits-out /dev/null");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("err_tokenizer.gguf: tokenizer.ggml.model is 'llama'"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace essaim
