#include "text/chat_template.h"

namespace essaim {
namespace {

// ChatML, for a file that carries no template of its own.
constexpr std::string_view kChatMl =
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

}  // namespace

Result<ChatTemplate> ChatTemplate::create(std::string_view source, std::string bos_token, std::string eos_token) {
  ChatTemplate t;
  t.fallback_ = source.empty();
  t.syntax_ = source.find("<function=") != std::string_view::npos ? ToolCallSyntax::XML : ToolCallSyntax::JSON;
  ESSAIM_ASSIGN_OR_RETURN(t.template_, jinja::Template::parse(t.fallback_ ? kChatMl : source));
  t.bos_ = std::move(bos_token);
  t.eos_ = std::move(eos_token);
  return t;
}

Result<ChatTemplate> ChatTemplate::create(std::string_view source, const Tokenizer& tokenizer) {
  const auto spelled = [&](std::optional<TokenId> id) {
    return id ? tokenizer.token_to_piece(*id, /*render_special=*/true) : std::string();
  };
  return create(source, spelled(tokenizer.bos()), spelled(tokenizer.eos()));
}

Result<std::string> ChatTemplate::render(const ChatTemplateInput& in) const {
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  for (const auto& [k, v] : in.kwargs.items()) ctx[k] = v;  // the fixed variables below take precedence
  ctx["messages"] = in.messages;
  if (!in.tools.is_null()) ctx["tools"] = in.tools;
  ctx["add_generation_prompt"] = in.add_generation_prompt;
  ctx["bos_token"] = bos_;
  ctx["eos_token"] = eos_;
  return template_.render(ctx);
}

bool prompt_opens_reasoning(std::string_view prompt) {
  const size_t end = prompt.find_last_not_of(" \t\r\n");
  return end != std::string_view::npos && prompt.substr(0, end + 1).ends_with("<think>");
}

}  // namespace essaim
