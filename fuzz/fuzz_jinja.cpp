// libFuzzer target for the chat-template engine (text/jinja.h): any bytes as a template, parsed under the
// default limits and, when it parses, rendered over a fixed chat context (messages with tool calls, tools,
// flags) under small limits. Parsing and rendering must return a value or an error with a message — never
// crash, hang, or write past the output limit.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "text/jinja.h"

namespace {

void require(bool ok) {
  if (!ok) std::abort();
}

const nlohmann::ordered_json& context() {
  static const nlohmann::ordered_json c = nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "Be brief."},
                 {"role": "user", "content": "Weather in Paris?"},
                 {"role": "assistant", "content": "<think>\nr\n</think>\n\nok", "reasoning_content": "r",
                  "tool_calls": [{"id": "c1", "type": "function",
                                  "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}}]},
                 {"role": "tool", "content": "sunny", "tool_call_id": "c1"}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
    "add_generation_prompt": true, "enable_thinking": false, "bos_token": "", "eos_token": "<|im_end|>"})");
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace essaim::jinja;
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  Limits limits;
  limits.max_steps = 20'000;
  limits.max_output_bytes = 64 * 1024;
  auto t = Template::parse(source, limits);
  if (!t) {
    require(!t.status().message().empty());
    return 0;
  }
  auto out = t->render(context());
  if (out) require(out->size() <= limits.max_output_bytes);
  else require(!out.status().message().empty());
  return 0;
}
