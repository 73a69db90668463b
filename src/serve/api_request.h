// The OpenAI request bodies this server accepts, parsed and validated in one place: JSON text in, either a
// request every later stage can trust or an OpenAI error object out. Never throws, never asserts: bodies are
// untrusted (fuzz/fuzz_serve_request.cpp). Field names and ranges: docs/serve.md.
//
//   ApiParse p = parse_api_request(ApiEndpoint::CHAT, body);
//   if (p.error) return reply(p.error->status, api_error_json(*p.error));
//   const ApiRequest& r = *p.request;   // r.messages, r.tools, r.sampling, r.max_tokens, r.stop, r.stream
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/sampler.h"

namespace essaim::serve {

// MESSAGES: Anthropic's POST /v1/messages, parsed into the same request (messages in OpenAI's shape).
enum class ApiEndpoint : uint8_t { CHAT, COMPLETION, MESSAGES };

// An OpenAI error: HTTP status and the {"error":{"message","type","param","code"}} fields.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string code = "invalid_value";
  std::string param;  // the offending field, or empty
};
// {"error":{"message":...,"type":...,"param":...|null,"code":...}}
std::string api_error_json(const ApiError& e);

inline constexpr size_t kMaxJsonDepth = 32;      // nesting of objects and arrays in a body
inline constexpr size_t kMaxMessages = 1024;     // chat messages per request
inline constexpr size_t kMaxStopStrings = 16;    // OpenAI allows 4; llama-server more
inline constexpr size_t kMaxStopBytes = 256;     // per stop string
inline constexpr size_t kMaxPrompts = 64;        // COMPLETION: prompts in one request (one choice each)
inline constexpr size_t kMaxTools = 128;         // tools offered, and tool calls in one assistant message

// REQUIRED and FUNCTION constrain decoding to tool calls (text/json_schema_grammar.h).
enum class ToolChoice : uint8_t { AUTO, NONE, REQUIRED, FUNCTION };
// JSON_OBJECT and JSON_SCHEMA constrain decoding to JSON (text/json_schema_grammar.h).
enum class ResponseFormat : uint8_t { TEXT, JSON_OBJECT, JSON_SCHEMA };

// One prompt of /v1/completions: text, or token ids as sent (checked against the vocabulary later).
struct PromptInput {
  std::string text;
  std::vector<int32_t> tokens;
  bool is_tokens = false;
};

struct ApiRequest {
  ApiEndpoint endpoint = ApiEndpoint::CHAT;
  std::string model;                  // as sent (informational: one model is served)
  // CHAT: the messages as the chat template reads them — {"role", "content" (a string: text parts joined, null
  // read as ""), "name"?, "tool_call_id"?, "tool_calls"? (arguments as JSON objects), "reasoning_content"?}.
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;        // CHAT: OpenAI tool objects, or null
  ToolChoice tool_choice = ToolChoice::AUTO;
  std::string tool_choice_name;        // FUNCTION: the function to call (one of `tools`)
  ResponseFormat response_format = ResponseFormat::TEXT;
  nlohmann::ordered_json response_schema;  // JSON_SCHEMA: the schema the answer satisfies
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();  // chat_template_kwargs (enable_thinking...)
  std::vector<PromptInput> prompts;   // COMPLETION: a string, a list of strings, token ids, lists of token ids
  bool stream = false;
  bool include_usage = false;         // stream_options.include_usage
  std::optional<int32_t> max_tokens;  // max_tokens or max_completion_tokens; absent: until the context is full
  SamplerParams sampling;             // llama-server's defaults for what is absent
  std::vector<std::string> stop;
  // llama-server's: end-of-generation ids are never sampled (their logits -inf), so an answer runs to
  // max_tokens or a full context (benchmarks use it to make every server generate the same lengths).
  bool ignore_eos = false;
};

struct ApiParse {
  std::optional<ApiRequest> request;
  std::optional<ApiError> error;
};

ApiParse parse_api_request(ApiEndpoint endpoint, std::string_view body);
// Anthropic's Messages API body (system, content blocks: text, thinking, tool_use, tool_result; tools with
// input_schema; tool_choice; thinking; stop_sequences), as the chat request the templates read: tool_use
// blocks become tool_calls, tool_result blocks tool messages, thinking blocks reasoning_content, `thinking`
// the template's enable_thinking. Errors use the same ApiError (serve/anthropic_api.h renders them).
ApiParse parse_anthropic_request(std::string_view body);

// Depth of the deepest object/array nesting, scanning the text (strings skipped) without building anything:
// lets the parser refuse a hostile "[[[[..." before a recursive parser sees it.
size_t json_nesting_depth(std::string_view text);

}  // namespace essaim::serve
