// ChatML prompt formatting for Qwen3 and Qwen3.5 (docs/reference.md 7.7): what their Jinja chat templates render
// for plain conversations (system / user / assistant / tool messages, no tool definitions), written out in C++
// so no Jinja engine is needed.
//
//   ESSAIM_ASSIGN_OR_RETURN(ChatFormat fmt, chat_format_for("qwen3moe", vocab.chat_template));
//   std::vector<ChatMessage> msgs = {{"system", "Be brief."}, {"user", "Hi"}};
//   std::string prompt = chat_render(fmt, msgs, {.enable_thinking = false});
//   // "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
//   // "<|im_start|>assistant\n<think>\n\n</think>\n\n"
//   std::vector<TokenId> ids = tokenizer.encode(prompt, /*parse_special=*/true);
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "core/status.h"

namespace essaim {

enum class ChatFormat {
  QWEN3,   // Qwen3 / Qwen3-MoE: reasoning kept only after the last user query; "<think>" only when disabled
  QWEN35,  // Qwen3.5: contents trimmed; the generation prompt opens "<think>\n" by default
};

struct ChatMessage {
  std::string role;     // "system", "user", "assistant" or "tool"; other roles render nothing, as in the templates
  std::string content;  // an assistant turn may carry "<think>...</think>" reasoning before its answer
};

struct ChatOptions {
  bool add_generation_prompt = true;
  bool enable_thinking = true;
};

// Chooses the format from the GGUF architecture (qwen3, qwen3moe -> QWEN3; qwen35, qwen35moe -> QWEN35), or, for
// another architecture, from a ChatML Jinja template. Anything else is an error naming both.
Result<ChatFormat> chat_format_for(std::string_view architecture, std::string_view jinja_template);
std::string_view chat_format_name(ChatFormat format);

std::string chat_render(ChatFormat format, std::span<const ChatMessage> messages, const ChatOptions& options = {});

}  // namespace essaim
