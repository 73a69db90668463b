// The model's own chat template: the GGUF's `tokenizer.chat_template` rendered by text/jinja.h with the
// variables Hugging Face's apply_chat_template passes (messages, tools, add_generation_prompt, bos_token,
// eos_token, and the request's chat_template_kwargs such as enable_thinking). A file without a template gets
// ChatML, rendered by the same engine.
//
//   ESSAIM_ASSIGN_OR_RETURN(ChatTemplate t, ChatTemplate::create(vocab.chat_template, "<|endoftext|>", "<|im_end|>"));
//   ESSAIM_ASSIGN_OR_RETURN(std::string prompt, t.render({.messages = msgs, .kwargs = {{"enable_thinking", false}}}));
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "text/jinja.h"
#include "text/json_schema_grammar.h"
#include "text/tokenizer.h"

namespace essaim {

struct ChatTemplateInput {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // OpenAI-shaped message objects
  nlohmann::ordered_json tools;                                       // array of tool objects, or null: none
  bool add_generation_prompt = true;
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();   // extra top-level variables
};

class ChatTemplate {
 public:
  // ChatML when `source` is empty; a parse error names the template's line.
  static Result<ChatTemplate> create(std::string_view source, std::string bos_token, std::string eos_token);
  // bos_token and eos_token as the tokenizer spells them ("" where the vocabulary has none).
  static Result<ChatTemplate> create(std::string_view source, const Tokenizer& tokenizer);
  Result<std::string> render(const ChatTemplateInput& input) const;
  bool is_chatml_fallback() const { return fallback_; }
  // The tool-call syntax the template writes (and so the model learnt): Qwen3.5's XML form when it renders
  // "<function=", else Qwen3's JSON form.
  ToolCallSyntax tool_call_syntax() const { return syntax_; }

 private:
  jinja::Template template_;
  std::string bos_, eos_;
  bool fallback_ = false;
  ToolCallSyntax syntax_ = ToolCallSyntax::JSON;
};

// Whether a rendered prompt ends inside an opened <think> block (the Qwen3.5 templates end their generation
// prompt with "<think>\n"), so that what the model writes first is reasoning.
bool prompt_opens_reasoning(std::string_view prompt);

}  // namespace essaim
