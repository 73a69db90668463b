#include "text/chat.h"

#include <gtest/gtest.h>

#include <vector>

namespace essaim {
namespace {

using Msgs = std::vector<ChatMessage>;

TEST(ChatQwen3, SystemUserAndGenerationPrompt) {
  const Msgs msgs = {{"system", "You are terse."}, {"user", "Hi there"}};
  EXPECT_EQ(chat_render(ChatFormat::QWEN3, msgs),
            "<|im_start|>system\nYou are terse.<|im_end|>\n"
            "<|im_start|>user\nHi there<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(chat_render(ChatFormat::QWEN3, msgs, {.enable_thinking = false}),
            "<|im_start|>system\nYou are terse.<|im_end|>\n"
            "<|im_start|>user\nHi there<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(chat_render(ChatFormat::QWEN3, msgs, {.add_generation_prompt = false}),
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n");
}

TEST(ChatQwen3, EarlierReasoningIsDroppedLaterKept) {
  const Msgs msgs = {{"user", "q1"}, {"assistant", "<think>\nr1\n</think>\n\na1"}, {"user", "q2"},
                     {"assistant", "<think>\nr2\n</think>\n\na2"}};
  EXPECT_EQ(chat_render(ChatFormat::QWEN3, msgs, {.add_generation_prompt = false}),
            "<|im_start|>user\nq1<|im_end|>\n"
            "<|im_start|>assistant\na1<|im_end|>\n"
            "<|im_start|>user\nq2<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nr2\n</think>\n\na2<|im_end|>\n");
}

TEST(ChatQwen3, ContentIsNotTrimmedAndLateSystemIsATurn) {
  const Msgs msgs = {{"user", "  spaced  "}, {"system", "late"}, {"narrator", "ignored"}};
  EXPECT_EQ(chat_render(ChatFormat::QWEN3, msgs),
            "<|im_start|>user\n  spaced  <|im_end|>\n"
            "<|im_start|>system\nlate<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatQwen3, ToolResponsesAreGroupedIntoOneUserTurn) {
  const Msgs msgs = {{"user", "weather?"}, {"assistant", "calling"}, {"tool", "sunny"}, {"tool", "22C"}};
  EXPECT_EQ(chat_render(ChatFormat::QWEN3, msgs),
            "<|im_start|>user\nweather?<|im_end|>\n"
            "<|im_start|>assistant\ncalling<|im_end|>\n"  // after the query, but no reasoning and not last
            "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\n22C\n</tool_response>"
            "<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatQwen35, TrimsAndOpensThinking) {
  const Msgs msgs = {{"system", "  Be brief. \n"}, {"user", "\n Hi \n"}};
  EXPECT_EQ(chat_render(ChatFormat::QWEN35, msgs),
            "<|im_start|>system\nBe brief.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n");
  EXPECT_EQ(chat_render(ChatFormat::QWEN35, msgs, {.enable_thinking = false}),
            "<|im_start|>system\nBe brief.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST(ChatQwen35, HistoryWithoutReasoning) {
  const Msgs msgs = {{"user", "q1"}, {"assistant", "<think>\nr1\n</think>\n\na1"}, {"user", "q2"}};
  EXPECT_EQ(chat_render(ChatFormat::QWEN35, msgs),
            "<|im_start|>user\nq1<|im_end|>\n"
            "<|im_start|>assistant\na1<|im_end|>\n"
            "<|im_start|>user\nq2<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n");
}

TEST(ChatFormatFor, ArchitectureThenTemplate) {
  EXPECT_EQ(*chat_format_for("qwen3moe", ""), ChatFormat::QWEN3);
  EXPECT_EQ(*chat_format_for("qwen35moe", ""), ChatFormat::QWEN35);
  EXPECT_EQ(*chat_format_for("other", "{{ '<|im_start|>assistant\\n' }}"), ChatFormat::QWEN3);
  EXPECT_EQ(*chat_format_for("other", "{%- set c = m|trim %}{{- '<|im_start|>assistant\\n<think>\\n' }}"),
            ChatFormat::QWEN35);
  Result<ChatFormat> none = chat_format_for("llama", "[INST]");
  ASSERT_FALSE(none.is_ok());
  EXPECT_NE(none.status().message().find("llama"), std::string::npos);
  EXPECT_EQ(chat_format_name(ChatFormat::QWEN35), "qwen35");
}

}  // namespace
}  // namespace essaim
