// The Qwen3 and Qwen3.5 chat templates (tests/text/data/templates) rendered by ChatTemplate for the
// conversations `essaim run --chat` and the server send: pinned strings, docs/reference.md 7.7.
#include "text/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

namespace essaim {
namespace {

using Msgs = std::vector<std::pair<std::string, std::string>>;  // role, content

std::string read_template(const std::string& name) {
  std::ifstream f(std::string(ESSAIM_SOURCE_DIR) + "/tests/text/data/templates/" + name, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

struct Options {
  bool add_generation_prompt = true;
  bool enable_thinking = true;
};

std::string render(const std::string& template_file, const Msgs& msgs, Options o = {}) {
  Result<ChatTemplate> t = ChatTemplate::create(read_template(template_file), "", "<|im_end|>");
  EXPECT_TRUE(t.is_ok()) << t.status().message();
  if (!t.is_ok()) return "";
  ChatTemplateInput in;
  for (const auto& [role, content] : msgs) in.messages.push_back({{"role", role}, {"content", content}});
  in.add_generation_prompt = o.add_generation_prompt;
  if (!o.enable_thinking) in.kwargs["enable_thinking"] = false;
  Result<std::string> out = t->render(in);
  EXPECT_TRUE(out.is_ok()) << out.status().message();
  return out.is_ok() ? *out : "";
}

std::string qwen3(const Msgs& msgs, Options o = {}) { return render("qwen3.jinja", msgs, o); }
std::string qwen35(const Msgs& msgs, Options o = {}) { return render("qwen35.jinja", msgs, o); }

TEST(ChatQwen3, SystemUserAndGenerationPrompt) {
  const Msgs msgs = {{"system", "You are terse."}, {"user", "Hi there"}};
  EXPECT_EQ(qwen3(msgs),
            "<|im_start|>system\nYou are terse.<|im_end|>\n"
            "<|im_start|>user\nHi there<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(qwen3(msgs, {.enable_thinking = false}),
            "<|im_start|>system\nYou are terse.<|im_end|>\n"
            "<|im_start|>user\nHi there<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(qwen3(msgs, {.add_generation_prompt = false}),
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n");
}

TEST(ChatQwen3, EarlierReasoningIsDroppedLaterKept) {
  const Msgs msgs = {{"user", "q1"}, {"assistant", "<think>\nr1\n</think>\n\na1"}, {"user", "q2"},
                     {"assistant", "<think>\nr2\n</think>\n\na2"}};
  EXPECT_EQ(qwen3(msgs, {.add_generation_prompt = false}),
            "<|im_start|>user\nq1<|im_end|>\n"
            "<|im_start|>assistant\na1<|im_end|>\n"
            "<|im_start|>user\nq2<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nr2\n</think>\n\na2<|im_end|>\n");
}

TEST(ChatQwen3, ContentIsNotTrimmedAndLateSystemIsATurn) {
  const Msgs msgs = {{"user", "  spaced  "}, {"system", "late"}, {"narrator", "ignored"}};
  EXPECT_EQ(qwen3(msgs),
            "<|im_start|>user\n  spaced  <|im_end|>\n"
            "<|im_start|>system\nlate<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatQwen3, ToolResponsesAreGroupedIntoOneUserTurn) {
  const Msgs msgs = {{"user", "weather?"}, {"assistant", "calling"}, {"tool", "sunny"}, {"tool", "22C"}};
  EXPECT_EQ(qwen3(msgs),
            "<|im_start|>user\nweather?<|im_end|>\n"
            "<|im_start|>assistant\ncalling<|im_end|>\n"  // after the query, but no reasoning and not last
            "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\n22C\n</tool_response>"
            "<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatQwen35, TrimsAndOpensThinking) {
  const Msgs msgs = {{"system", "  Be brief. \n"}, {"user", "\n Hi \n"}};
  EXPECT_EQ(qwen35(msgs),
            "<|im_start|>system\nBe brief.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n");
  EXPECT_EQ(qwen35(msgs, {.enable_thinking = false}),
            "<|im_start|>system\nBe brief.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST(ChatQwen35, HistoryWithoutReasoning) {
  const Msgs msgs = {{"user", "q1"}, {"assistant", "<think>\nr1\n</think>\n\na1"}, {"user", "q2"}};
  EXPECT_EQ(qwen35(msgs),
            "<|im_start|>user\nq1<|im_end|>\n"
            "<|im_start|>assistant\na1<|im_end|>\n"
            "<|im_start|>user\nq2<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n");
}

TEST(ChatTemplateFallback, AFileWithoutATemplateGetsChatMl) {
  Result<ChatTemplate> t = ChatTemplate::create("", "", "<|im_end|>");
  ASSERT_TRUE(t.is_ok());
  EXPECT_TRUE(t->is_chatml_fallback());
  ChatTemplateInput in;
  in.messages.push_back({{"role", "user"}, {"content", "Hi"}});
  EXPECT_EQ(*t->render(in), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

}  // namespace
}  // namespace essaim
