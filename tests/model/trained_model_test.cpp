// The trained model shipped in models/ (models/README.md): for a fixed prompt its teacher-forced logits are
// pinned bit for bit (SHA-256 of the float array) for the BF16 reference and the Q4_K_M file, with 1 and 2
// threads and in chunks; its greedy continuation is pinned as text, so CI sees it write, not just agree.
// A change in any number the engine computes changes these pins, and must then be deliberate: re-derive them
// and say why in the commit.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "slice/model_identity.h"
#include "model_test_util.h"
#include "text/tokenizer.h"

namespace essaim {
namespace {

const std::string kPrompt = "And God said unto Noah, Make thee an ark";

std::string model_path(const std::string& file) { return std::string(ESSAIM_SOURCE_DIR) + "/models/" + file; }

Tokenizer tokenizer_of(const Model& m) {
  Result<Vocab> v = vocab_from_gguf(m.file());
  EXPECT_TRUE(v.is_ok()) << v.status().message();
  Result<Tokenizer> t = Tokenizer::create(std::move(*v));
  EXPECT_TRUE(t.is_ok()) << t.status().message();
  return std::move(*t);
}

std::string logits_digest(const std::vector<float>& logits) {
  Sha256 h;
  h.update(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(logits.data()), logits.size() * sizeof(float)));
  return digest_hex(h.finish());
}

struct Pinned {
  const char* file;
  const char* logits_sha256;
  const char* greedy_text;
};

class TrainedModel : public ::testing::TestWithParam<Pinned> {};

TEST_P(TrainedModel, LogitsAndGreedyTextArePinned) {
  const Pinned& p = GetParam();
  std::unique_ptr<Model> m = test::load_or_die(model_path(p.file));
  ASSERT_TRUE(m);
  Tokenizer tok = tokenizer_of(*m);
  const std::vector<int32_t> ids = tok.encode(kPrompt, false);
  const std::vector<float> logits = test::eval_logits(*m, ids, {.threads = 1});
  EXPECT_EQ(logits_digest(logits), p.logits_sha256) << p.file;
  EXPECT_EQ(logits_digest(test::eval_logits(*m, ids, {.batch = 3, .threads = 2})), logits_digest(logits))
      << "chunking and threads must not change a bit";
  const std::vector<int32_t> out = test::greedy(*m, ids, 24, 2);
  const std::string text = tok.decode(out);
  EXPECT_EQ(text, p.greedy_text) << p.file;
}

INSTANTIATE_TEST_SUITE_P(
    Shipped, TrainedModel,
    ::testing::Values(Pinned{"kjv-moe-bf16.gguf", "5543f82879f7bcc18d2c318494eeaa7642caca646cc428af2be34638a7898907",
                           ", and say unto him, I have not heard thee, and I will not be ashamed.\nAnd the LORD said"},
                    Pinned{"kjv-moe-q4_k_m.gguf", "24d312b03605f271ebfe8159e0b806c5566db6d4933f8cecd81eed7a0fbfaccc",
                           ", and say unto him, I have not heard thee, and I will not be ashamed.\nAnd the LORD said"}),
    [](const auto& info) { return std::string(std::strstr(info.param.file, "bf16") ? "BF16" : "Q4_K_M"); });

}  // namespace
}  // namespace essaim
