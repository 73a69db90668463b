// Anthropic's Messages API shapes (POST /v1/messages; docs/serve.md): error bodies, server-sent events
// ("event: NAME\ndata: JSON"), content blocks and stop reasons. The request side is parse_anthropic_request
// (serve/api_request.h); generation is the OpenAI endpoints' (serve/generation.h), which writes these shapes
// when its setup says anthropic.
//
//   out->reply({.status = 400, .body = anthropic_error_json(e)});
//   out->stream_write(anthropic_event("message_stop", {{"type", "message_stop"}}));
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "serve/api_request.h"
#include "serve/chat_output.h"

namespace essaim::serve {

// {"type":"error","error":{"type": invalid_request_error | authentication_error | not_found_error |
// request_too_large | overloaded_error | api_error, "message": ...}}
std::string anthropic_error_json(const ApiError& e);
std::string anthropic_event(std::string_view type, const nlohmann::ordered_json& data);
// OpenAI's finish_reason as Anthropic's stop_reason: stop -> end_turn, length -> max_tokens, tool_calls ->
// tool_use; a stop string -> stop_sequence.
const char* anthropic_stop_reason(std::string_view finish, bool stop_string);
// A content block as a whole answer carries it; `call_id` names a tool_use block.
nlohmann::ordered_json anthropic_block(const ChatDelta& d, const std::string& call_id);

}  // namespace essaim::serve
