// libFuzzer target for the serve layer's request parser: any bytes as the body of POST /v1/chat/completions
// (first byte 0 mod 3), /v1/completions (1) or POST /v1/messages, Anthropic's (2). The parser must return a request or an OpenAI error object,
// never crash; an accepted request must satisfy what later stages rely on, and every error must serialise
// to a JSON object with error.message/type/code. The stop-string matcher then runs over the accepted
// request's text, which must come out as a prefix of what went in.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "serve/api_request.h"
#include "serve/stop_strings.h"

namespace {

void require(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace essaim::serve;
  if (size == 0) return 0;
  // First byte: 0 mod 3 chat, 1 completion, 2 Anthropic's messages (parse_anthropic_request).
  const ApiEndpoint endpoint = data[0] % 3 == 0 ? ApiEndpoint::CHAT : data[0] % 3 == 1 ? ApiEndpoint::COMPLETION : ApiEndpoint::MESSAGES;
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  const ApiParse p = endpoint == ApiEndpoint::MESSAGES ? parse_anthropic_request(body) : parse_api_request(endpoint, body);
  require(p.request.has_value() != p.error.has_value());
  if (p.error) {
    require(p.error->status >= 400 && p.error->status < 600);
    const nlohmann::json j = nlohmann::json::parse(api_error_json(*p.error), nullptr, false);
    require(j.is_object() && j["error"]["message"].is_string() && j["error"]["type"].is_string() &&
            j["error"].contains("code"));
    return 0;
  }
  const ApiRequest& r = *p.request;
  require(!r.max_tokens || *r.max_tokens >= 0);
  require(r.sampling.top_p >= 0 && r.sampling.top_p <= 1 && r.sampling.min_p >= 0 && r.sampling.min_p <= 1);
  require(r.sampling.temperature >= 0 && r.sampling.top_k >= 0);
  require(r.stop.size() <= kMaxStopStrings);
  if (endpoint != ApiEndpoint::COMPLETION) require(!r.messages.empty() && r.messages.size() <= kMaxMessages + 1);
  if (endpoint == ApiEndpoint::MESSAGES) require(r.max_tokens && *r.max_tokens >= 1);
  if (endpoint == ApiEndpoint::COMPLETION) require(!r.prompts.empty() && r.prompts.size() <= kMaxPrompts);
  std::string text;
  for (const PromptInput& p : r.prompts) {
    require(p.is_tokens != p.tokens.empty());
    for (int32_t t : p.tokens) require(t >= 0);
    text += p.text;
  }
  for (const auto& m : r.messages) {
    require(m.is_object() && m["role"].is_string() && m["content"].is_string());
    text += m["content"].get<std::string>();
    if (m.contains("tool_calls"))
      for (const auto& c : m["tool_calls"]) require(c["function"]["arguments"].is_object() && c["function"]["name"].is_string());
  }
  require(r.tools.is_null() || (r.tools.is_array() && r.tools.size() <= kMaxTools));
  StopMatcher stops(r.stop);
  std::string out;
  for (size_t i = 0; i < text.size(); i += 3) out += stops.push(std::string_view(text).substr(i, 3));
  out += stops.flush();
  require(text.compare(0, out.size(), out) == 0);
  return 0;
}
