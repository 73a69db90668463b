// libFuzzer target for the chat answer splitter and tool-call parser (serve/chat_output.h): any bytes as a
// model's answer, with or without an opened <think> and offered tools, fed whole and in small chunks. The
// two must give the same reasoning, content and calls; every call must name an offered tool and carry a JSON
// object that satisfies the tool's schema; without tools, the content is the text itself.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "serve/chat_output.h"

namespace {

void require(bool ok) {
  if (!ok) std::abort();
}

using ojson = nlohmann::ordered_json;

const ojson& tools() {
  static const ojson t = ojson::parse(R"([
    {"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
      "properties":{"city":{"type":"string"},"days":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"}}},
      "required":["city"],"additionalProperties":false}}},
    {"type":"function","function":{"name":"ping"}}])");
  return t;
}

struct Out {
  std::string reasoning, content;
  std::vector<essaim::serve::ToolCall> calls;
};

Out split(std::string_view text, bool in_reasoning, const ojson* offered, size_t chunk) {
  essaim::serve::ChatOutputSplitter s({.in_reasoning = in_reasoning, .tools = offered});
  Out o;
  const auto take = [&](const std::vector<essaim::serve::ChatDelta>& ds) {
    for (const auto& d : ds) {
      if (d.kind == essaim::serve::ChatDelta::Kind::REASONING) o.reasoning += d.text;
      else if (d.kind == essaim::serve::ChatDelta::Kind::CONTENT) o.content += d.text;
      else o.calls.push_back(d.call);
    }
  };
  for (size_t i = 0; i < text.size(); i += chunk) take(s.push(text.substr(i, chunk)));
  take(s.finish());
  return o;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool in_reasoning = data[0] & 1, with_tools = data[0] & 2;
  const size_t chunk = 1 + (data[0] >> 2) % 7;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const ojson* offered = with_tools ? &tools() : nullptr;
  const Out whole = split(text, in_reasoning, offered, text.size() + 1);
  const Out parts = split(text, in_reasoning, offered, chunk);
  require(whole.reasoning == parts.reasoning && whole.content == parts.content && whole.calls.size() == parts.calls.size());
  if (!with_tools && !in_reasoning && text.find("<think>") != 0) require(whole.content == text);
  for (const auto& c : whole.calls) {
    const ojson args = ojson::parse(c.arguments, nullptr, false);
    require(args.is_object());
    const ojson* schema = nullptr;
    for (const ojson& t : tools())
      if (t["function"]["name"] == c.name) schema = t["function"].contains("parameters") ? &t["function"]["parameters"] : &t;
    require(schema != nullptr);
    if (schema->contains("type")) require(essaim::serve::schema_violation(args, *schema).empty());
  }
  return 0;
}
