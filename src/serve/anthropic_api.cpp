#include "serve/anthropic_api.h"

namespace essaim::serve {

using ojson = nlohmann::ordered_json;

std::string anthropic_error_json(const ApiError& e) {
  const char* type = e.status == 401   ? "authentication_error"
                     : e.status == 403 ? "permission_error"
                     : e.status == 404 ? "not_found_error"
                     : e.status == 413 ? "request_too_large"
                     : e.status == 429 || e.status == 503 ? "overloaded_error"
                     : e.status >= 500 ? "api_error"
                                       : "invalid_request_error";
  std::string message = e.message;
  if (!e.param.empty() && message.find(e.param) == std::string::npos) message = e.param + ": " + message;
  return ojson{{"type", "error"}, {"error", {{"type", type}, {"message", message}}}}.dump(-1, ' ', false,
                                                                                          ojson::error_handler_t::replace);
}

std::string anthropic_event(std::string_view type, const ojson& data) {
  return "event: " + std::string(type) + "\ndata: " + data.dump(-1, ' ', false, ojson::error_handler_t::replace) + "\n\n";
}

const char* anthropic_stop_reason(std::string_view finish, bool stop_string) {
  if (stop_string) return "stop_sequence";
  if (finish == "length") return "max_tokens";
  if (finish == "tool_calls") return "tool_use";
  return "end_turn";
}

ojson anthropic_block(const ChatDelta& d, const std::string& call_id) {
  switch (d.kind) {
    case ChatDelta::Kind::REASONING: return {{"type", "thinking"}, {"thinking", d.text}, {"signature", ""}};
    case ChatDelta::Kind::CONTENT: return {{"type", "text"}, {"text", d.text}};
    case ChatDelta::Kind::TOOL_CALL:
      return {{"type", "tool_use"}, {"id", call_id}, {"name", d.call.name}, {"input", ojson::parse(d.call.arguments)}};
  }
  return {};
}

}  // namespace essaim::serve
