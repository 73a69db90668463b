#include "serve/chat_output.h"

#include "serve/api_request.h"

namespace essaim::serve {
namespace {

using ojson = nlohmann::ordered_json;

constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>", kCallClose = "</tool_call>";
constexpr std::string_view kSpace = " \t\r\n";
constexpr int kMaxSchemaDepth = 32;

// The longest end of `s` that is the start of `tag` (and not all of it): text that may still become the tag.
size_t partial_tag(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  return 0;
}
size_t trailing_space(std::string_view s) {
  const size_t e = s.find_last_not_of(kSpace);
  return e == std::string_view::npos ? s.size() : s.size() - e - 1;
}
// What to hold back before a possible tag: its possible start, and the whitespace before that.
size_t held_before(std::string_view s, std::string_view tag) {
  const size_t p = partial_tag(s, tag);
  return p + trailing_space(s.substr(0, s.size() - p));
}
std::string_view trim(std::string_view s) {
  const size_t b = s.find_first_not_of(kSpace);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(kSpace) - b + 1);
}

// A model's bytes need not be UTF-8 (a parameter value cut mid-character): such bytes become U+FFFD.
std::string json_text(const ojson& v) { return v.dump(-1, ' ', false, ojson::error_handler_t::replace); }

const ojson* find_tool(const ojson& tools, const std::string& name) {
  if (!tools.is_array()) return nullptr;
  for (const ojson& t : tools)
    if (t.contains("function") && t["function"].value("name", "") == name) return &t["function"];
  return nullptr;
}

bool type_matches(const ojson& v, const std::string& type) {
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "string") return v.is_string();
  if (type == "boolean") return v.is_boolean();
  if (type == "null") return v.is_null();
  if (type == "number") return v.is_number();
  if (type == "integer")
    return v.is_number_integer() || (v.is_number_float() && v.get<double>() == double(int64_t(v.get<double>())));
  return true;  // a type name this subset does not know constrains nothing it can check
}

// A Qwen3.5 parameter's text as the schema wants it: a string stays a string; anything else is read as JSON
// when it parses (42, true, {"a": 1}), else kept as the text.
ojson parameter_value(const std::string& text, const ojson* schema) {
  const bool string_typed = schema == nullptr || !schema->is_object() || !schema->contains("type") ||
                            (*schema)["type"] == "string";
  if (string_typed) return text;
  if (json_nesting_depth(text) > kMaxJsonDepth) return text;
  ojson v = ojson::parse(text, nullptr, false);
  return v.is_discarded() ? ojson(text) : v;
}

ParsedToolCall parse_json_call(std::string_view inner, const ojson& tools) {
  if (json_nesting_depth(inner) > kMaxJsonDepth) return {std::nullopt, "the call nests too deeply"};
  const ojson j = ojson::parse(inner, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("name") || !j["name"].is_string())
    return {std::nullopt, "not a {\"name\": ..., \"arguments\": {...}} object"};
  ojson args = j.value("arguments", ojson::object());
  if (args.is_string()) args = ojson::parse(args.get<std::string>(), nullptr, false);
  if (!args.is_object()) return {std::nullopt, "arguments is not an object"};
  const std::string name = j["name"].get<std::string>();
  const ojson* tool = find_tool(tools, name);
  if (tool == nullptr) return {std::nullopt, "no tool named '" + name + "' was offered"};
  if (tool->contains("parameters")) {
    std::string why = schema_violation(args, (*tool)["parameters"]);
    if (!why.empty()) return {std::nullopt, why};
  }
  return {ToolCall{.index = 0, .name = name, .arguments = json_text(args)}, {}};
}

ParsedToolCall parse_xml_call(std::string_view s, const ojson& tools) {
  constexpr std::string_view kFn = "<function=", kFnEnd = "</function>", kParam = "<parameter=", kParamEnd = "</parameter>";
  s.remove_prefix(kFn.size());
  const size_t gt = s.find('>');
  if (gt == std::string_view::npos) return {std::nullopt, "unterminated <function=...>"};
  const std::string name(trim(s.substr(0, gt)));
  s.remove_prefix(gt + 1);
  const ojson* tool = find_tool(tools, name);
  if (tool == nullptr) return {std::nullopt, "no tool named '" + name + "' was offered"};
  const ojson* props = tool->contains("parameters") && (*tool)["parameters"].contains("properties")
                           ? &(*tool)["parameters"]["properties"] : nullptr;
  ojson args = ojson::object();
  for (;;) {
    s = trim(s);
    if (!s.starts_with(kParam)) break;
    s.remove_prefix(kParam.size());
    const size_t pgt = s.find('>'), end = s.find(kParamEnd);
    if (pgt == std::string_view::npos || end == std::string_view::npos || end < pgt) return {std::nullopt, "unterminated <parameter=...>"};
    const std::string pname(trim(s.substr(0, pgt)));
    std::string_view value = s.substr(pgt + 1, end - pgt - 1);
    if (value.starts_with('\n')) value.remove_prefix(1);
    if (value.ends_with('\n')) value.remove_suffix(1);
    const ojson* pschema = props && props->is_object() && props->contains(pname) ? &(*props)[pname] : nullptr;
    args[pname] = parameter_value(std::string(value), pschema);
    s.remove_prefix(end + kParamEnd.size());
  }
  if (!s.starts_with(kFnEnd) || !trim(s.substr(kFnEnd.size())).empty()) return {std::nullopt, "expected </function> to end the call"};
  if (tool->contains("parameters")) {
    std::string why = schema_violation(args, (*tool)["parameters"]);
    if (!why.empty()) return {std::nullopt, why};
  }
  return {ToolCall{.index = 0, .name = name, .arguments = json_text(args)}, {}};
}

}  // namespace

std::string schema_violation(const ojson& v, const ojson& schema, const std::string& path, int depth) {
  if (!schema.is_object()) return {};
  if (depth > kMaxSchemaDepth) return path + ": the schema nests too deeply";
  if (schema.contains("type")) {
    const ojson& t = schema["type"];
    bool ok = false;
    if (t.is_string()) ok = type_matches(v, t.get<std::string>());
    else if (t.is_array())
      for (const ojson& one : t) ok = ok || (one.is_string() && type_matches(v, one.get<std::string>()));
    else ok = true;
    if (!ok) return path + " is not of type " + t.dump();
  }
  if (schema.contains("enum") && schema["enum"].is_array()) {
    bool found = false;
    for (const ojson& e : schema["enum"]) found = found || e == v;
    if (!found) return path + " is not one of " + schema["enum"].dump();
  }
  if (v.is_object()) {
    if (schema.contains("required") && schema["required"].is_array())
      for (const ojson& r : schema["required"])
        if (r.is_string() && !v.contains(r.get<std::string>())) return path + "." + r.get<std::string>() + " is required";
    const ojson* props = schema.contains("properties") && schema["properties"].is_object() ? &schema["properties"] : nullptr;
    for (const auto& [k, x] : v.items()) {
      if (props && props->contains(k)) {
        std::string why = schema_violation(x, (*props)[k], path + "." + k, depth + 1);
        if (!why.empty()) return why;
      } else if (schema.contains("additionalProperties") && schema["additionalProperties"] == false) {
        return path + "." + k + " is not a parameter of this tool";
      }
    }
  }
  if (v.is_array() && schema.contains("items")) {
    for (size_t i = 0; i < v.size(); ++i) {
      std::string why = schema_violation(v[i], schema["items"], path + "[" + std::to_string(i) + "]", depth + 1);
      if (!why.empty()) return why;
    }
  }
  return {};
}

ParsedToolCall parse_tool_call(std::string_view inner, const ojson& tools) {
  inner = trim(inner);
  if (inner.starts_with("<function=")) return parse_xml_call(inner, tools);
  if (inner.starts_with("{")) return parse_json_call(inner, tools);
  return {std::nullopt, "neither a JSON object nor a <function=...> block"};
}

ChatOutputSplitter::ChatOutputSplitter(ChatOutputOptions options)
    : options_(options), state_(options.in_reasoning ? State::REASONING : State::START) {
  if (options_.tools != nullptr && (!options_.tools->is_array() || options_.tools->empty())) options_.tools = nullptr;
}

std::vector<ChatDelta> ChatOutputSplitter::push(std::string_view text) {
  buf_ += text;
  std::vector<ChatDelta> out;
  run(out, false);
  return out;
}

std::vector<ChatDelta> ChatOutputSplitter::finish() {
  std::vector<ChatDelta> out;
  run(out, true);
  return out;
}

void ChatOutputSplitter::emit(std::vector<ChatDelta>& out, ChatDelta::Kind kind, std::string text) {
  if (kind == ChatDelta::Kind::REASONING && !reasoning_begun_) {
    const size_t b = text.find_first_not_of(kSpace);
    text = b == std::string::npos ? std::string() : text.substr(b);
    reasoning_begun_ = !text.empty();
  }
  if (text.empty()) return;
  if (!out.empty() && out.back().kind == kind && kind != ChatDelta::Kind::TOOL_CALL) {
    out.back().text += text;
    return;
  }
  out.push_back({.kind = kind, .text = std::move(text), .call = {}});
}

void ChatOutputSplitter::close_call(std::vector<ChatDelta>& out, std::string_view inner) {
  ParsedToolCall p = parse_tool_call(inner, *options_.tools);
  if (!p.call) {  // not a call after all: the text stays the answer's
    emit(out, ChatDelta::Kind::CONTENT, std::string(kCallOpen) + std::string(inner) + std::string(kCallClose));
    return;
  }
  p.call->index = calls_++;
  out.push_back({.kind = ChatDelta::Kind::TOOL_CALL, .text = {}, .call = std::move(*p.call)});
}

// Moves what is certain out of buf_, state by state; `final`: nothing more will come, hold nothing back.
void ChatOutputSplitter::run(std::vector<ChatDelta>& out, bool final) {
  for (;;) {
    switch (state_) {
      case State::START:
        if (buf_.empty()) return;
        if (!final && buf_.size() < kThinkOpen.size() && kThinkOpen.starts_with(buf_)) return;
        if (buf_.starts_with(kThinkOpen)) {
          buf_.erase(0, kThinkOpen.size());
          state_ = State::REASONING;
        } else {
          state_ = State::CONTENT;
        }
        continue;
      case State::REASONING: {
        const size_t close = buf_.find(kThinkClose);
        if (close != std::string::npos) {
          std::string r = buf_.substr(0, close);
          r.resize(r.size() - trailing_space(r));
          emit(out, ChatDelta::Kind::REASONING, std::move(r));
          buf_.erase(0, close + kThinkClose.size());
          state_ = State::AFTER_TAG;
          continue;
        }
        const size_t hold = final ? 0 : held_before(buf_, kThinkClose);
        emit(out, ChatDelta::Kind::REASONING, buf_.substr(0, buf_.size() - hold));
        buf_.erase(0, buf_.size() - hold);
        return;
      }
      case State::AFTER_TAG: {
        const size_t b = buf_.find_first_not_of(kSpace);
        if (b == std::string::npos) {
          buf_.clear();
          return;
        }
        buf_.erase(0, b);
        state_ = State::CONTENT;
        continue;
      }
      case State::CONTENT: {
        if (options_.tools == nullptr) {
          emit(out, ChatDelta::Kind::CONTENT, std::move(buf_));
          buf_.clear();
          return;
        }
        const size_t open = buf_.find(kCallOpen);
        if (open != std::string::npos) {
          std::string c = buf_.substr(0, open);
          c.resize(c.size() - trailing_space(c));  // the space between an answer and its calls is no answer
          emit(out, ChatDelta::Kind::CONTENT, std::move(c));
          buf_.erase(0, open + kCallOpen.size());
          state_ = State::TOOL_CALL;
          continue;
        }
        const size_t hold = final ? 0 : held_before(buf_, kCallOpen);
        emit(out, ChatDelta::Kind::CONTENT, buf_.substr(0, buf_.size() - hold));
        buf_.erase(0, buf_.size() - hold);
        return;
      }
      case State::TOOL_CALL: {
        const size_t close = buf_.find(kCallClose);
        if (close == std::string::npos) {
          if (!final) return;
          emit(out, ChatDelta::Kind::CONTENT, std::string(kCallOpen) + buf_);  // cut off inside a call
          buf_.clear();
          return;
        }
        close_call(out, std::string_view(buf_).substr(0, close));
        buf_.erase(0, close + kCallClose.size());
        state_ = State::AFTER_TAG;
        continue;
      }
    }
  }
}

}  // namespace essaim::serve
