#include "text/chat.h"

namespace essaim {
namespace {

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

// Python's str.strip/lstrip/rstrip with a character set, as the templates call them.
constexpr std::string_view PY_WHITESPACE = " \t\n\r\v\f";
std::string_view lstrip(std::string_view s, std::string_view chars) {
  const size_t b = s.find_first_not_of(chars);
  return b == std::string_view::npos ? std::string_view() : s.substr(b);
}
std::string_view rstrip(std::string_view s, std::string_view chars) {
  const size_t e = s.find_last_not_of(chars);
  return e == std::string_view::npos ? std::string_view() : s.substr(0, e + 1);
}
std::string_view strip(std::string_view s, std::string_view chars) { return rstrip(lstrip(s, chars), chars); }

// Splits an assistant turn "<think>\nR\n</think>\n\nA" into reasoning R and answer A, as both templates do:
// the answer is what follows the last </think>, the reasoning what precedes the first one (after any <think>).
struct Turn {
  std::string_view reasoning;
  std::string_view content;
};
Turn split_reasoning(std::string_view content) {
  const size_t first_close = content.find("</think>");
  if (first_close == std::string_view::npos) return {{}, content};
  const size_t last_close = content.rfind("</think>");
  std::string_view before = rstrip(content.substr(0, first_close), "\n");
  const size_t open = before.rfind("<think>");
  if (open != std::string_view::npos) before = before.substr(open + 7);
  return {lstrip(before, "\n"), lstrip(content.substr(last_close + 8), "\n")};
}

bool is_tool_response(std::string_view content) {
  return starts_with(content, "<tool_response>") && ends_with(content, "</tool_response>");
}

}  // namespace

Result<ChatFormat> chat_format_for(std::string_view architecture, std::string_view jinja_template) {
  if (architecture == "qwen3" || architecture == "qwen3moe") return ChatFormat::QWEN3;
  if (architecture == "qwen35" || architecture == "qwen35moe") return ChatFormat::QWEN35;
  if (jinja_template.find("<|im_start|>") != std::string_view::npos) {
    // Qwen3.5's template trims contents and always opens a think block in its generation prompt.
    const bool qwen35 = jinja_template.find("|trim") != std::string_view::npos &&
                        jinja_template.find("'<|im_start|>assistant\\n<think>\\n'") != std::string_view::npos;
    return qwen35 ? ChatFormat::QWEN35 : ChatFormat::QWEN3;
  }
  return Status::error("no chat format for architecture '" + std::string(architecture) +
                       "' and its chat template is not ChatML");
}

std::string_view chat_format_name(ChatFormat format) {
  switch (format) {
    case ChatFormat::QWEN3: return "qwen3";
    case ChatFormat::QWEN35: return "qwen35";
  }
  return "?";
}

std::string chat_render(ChatFormat format, std::span<const ChatMessage> messages, const ChatOptions& options) {
  const bool qwen35 = format == ChatFormat::QWEN35;
  const auto content_of = [&](const ChatMessage& m) -> std::string_view {
    return qwen35 ? strip(m.content, PY_WHITESPACE) : std::string_view(m.content);
  };
  const size_t n = messages.size();
  std::string out;
  if (n > 0 && messages[0].role == "system") {
    out += "<|im_start|>system\n";
    out += content_of(messages[0]);
    out += "<|im_end|>\n";
  }
  // The last real user query: reasoning of assistant turns after it (an ongoing tool loop) is kept, earlier
  // reasoning is dropped from the history.
  size_t last_query = n == 0 ? 0 : n - 1;
  for (size_t k = n; k-- > 0;) {
    if (messages[k].role == "user" && !is_tool_response(content_of(messages[k]))) {
      last_query = k;
      break;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const ChatMessage& m = messages[i];
    const std::string_view content = content_of(m);
    if (m.role == "user" || (m.role == "system" && i != 0)) {
      out += "<|im_start|>" + m.role + "\n";
      out += content;
      out += "<|im_end|>\n";
    } else if (m.role == "assistant") {
      Turn turn = split_reasoning(content);
      if (qwen35) turn.reasoning = strip(turn.reasoning, PY_WHITESPACE);
      const bool with_reasoning =
          i > last_query && (qwen35 || i + 1 == n || !turn.reasoning.empty());
      out += "<|im_start|>assistant\n";
      if (with_reasoning) {
        out += "<think>\n";
        out += qwen35 ? turn.reasoning : strip(turn.reasoning, "\n");
        out += "\n</think>\n\n";
        out += lstrip(turn.content, "\n");
      } else {
        out += turn.content;
      }
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      if (i == 0 || messages[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n";
      out += content;
      out += "\n</tool_response>";
      if (i + 1 == n || messages[i + 1].role != "tool") out += "<|im_end|>\n";
    }
  }
  if (options.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (!options.enable_thinking) {
      out += "<think>\n\n</think>\n\n";
    } else if (qwen35) {
      out += "<think>\n";
    }
  }
  return out;
}

}  // namespace essaim
