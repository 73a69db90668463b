// A chat answer's text split the way OpenAI clients want it, as it streams: reasoning (`<think>…</think>`,
// which the prompt may already have opened) into reasoning_content, the model's tool-call syntax into
// structured calls, the rest into content. Two tool-call syntaxes are read: Qwen3's
// `<tool_call>{"name": …, "arguments": {…}}</tool_call>` and Qwen3.5's
// `<tool_call><function=NAME><parameter=P>value</parameter>…</function></tool_call>`. A call is accepted only
// when it names an offered tool and its arguments validate against that tool's JSON schema (the subset
// tool schemas use: type, properties, required, enum, items, additionalProperties); anything else stays
// text, in content. Only what could still become a tag (or trailing whitespace before one) is held back.
//
//   ChatOutputSplitter s({.in_reasoning = prompt_opens_reasoning(prompt), .tools = &request.tools});
//   for (const ChatDelta& d : s.push(text_piece)) ...   // REASONING / CONTENT text, or a TOOL_CALL
//   for (const ChatDelta& d : s.finish()) ...           // at the end of generation
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace essaim::serve {

struct ToolCall {
  size_t index = 0;        // position among this answer's calls
  std::string name;
  std::string arguments;   // JSON text of the arguments object
};

struct ChatDelta {
  enum class Kind : uint8_t { CONTENT, REASONING, TOOL_CALL };
  Kind kind = Kind::CONTENT;
  std::string text;  // CONTENT, REASONING
  ToolCall call;     // TOOL_CALL
};

struct ChatOutputOptions {
  bool in_reasoning = false;                      // the prompt ended inside <think>
  const nlohmann::ordered_json* tools = nullptr;  // offered tools; null or empty: tool calls are not parsed
};

class ChatOutputSplitter {
 public:
  explicit ChatOutputSplitter(ChatOutputOptions options);
  std::vector<ChatDelta> push(std::string_view text);
  std::vector<ChatDelta> finish();
  size_t tool_calls() const { return calls_; }
  bool in_reasoning() const { return state_ == State::REASONING; }

 private:
  // START: may open with <think>; AFTER_TAG: whitespace after </think> or a call is dropped.
  enum class State : uint8_t { START, REASONING, AFTER_TAG, CONTENT, TOOL_CALL };
  void run(std::vector<ChatDelta>& out, bool final);
  void emit(std::vector<ChatDelta>& out, ChatDelta::Kind kind, std::string text);
  void close_call(std::vector<ChatDelta>& out, std::string_view raw);

  ChatOutputOptions options_;
  State state_;
  std::string buf_;
  size_t calls_ = 0;
  bool reasoning_begun_ = false;  // leading whitespace of the reasoning is dropped
};

// One tool call's text (what lies between <tool_call> and </tool_call>) checked against the offered tools:
// the call, or the reason it is not one.
struct ParsedToolCall {
  std::optional<ToolCall> call;
  std::string error;
};
ParsedToolCall parse_tool_call(std::string_view inner, const nlohmann::ordered_json& tools);

// The arguments against a tool's "parameters" schema (the subset above); empty when they conform.
std::string schema_violation(const nlohmann::ordered_json& value, const nlohmann::ordered_json& schema,
                             const std::string& path = "arguments", int depth = 0);

}  // namespace essaim::serve
