#include "serve/api_request.h"

#include <cmath>
#include <nlohmann/json.hpp>

namespace essaim::serve {
namespace {

// Ordered: tool arguments and schemas reach the chat template (and its tojson) in the client's key order.
using json = nlohmann::ordered_json;

ApiError bad(std::string message, std::string param = {}, std::string code = "invalid_value") {
  return ApiError{.status = 400, .message = std::move(message), .type = "invalid_request_error",
                  .code = std::move(code), .param = std::move(param)};
}

// Fields OpenAI clients send that change nothing here; accepted so that ordinary clients work.
bool is_ignored_field(std::string_view k) {
  return k == "user" || k == "logit_bias" || k == "cache_prompt" ||
         k == "parallel_tool_calls" || k == "store" || k == "metadata";
}

std::optional<ApiError> number_in(const json& v, const char* name, double lo, double hi, float& out) {
  if (!v.is_number()) return bad(std::string(name) + " must be a number", name, "invalid_type");
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < lo || d > hi)
    return bad(std::string(name) + " must be between " + json(lo).dump() + " and " + json(hi).dump(), name);
  out = float(d);
  return std::nullopt;
}

std::optional<ApiError> integer_in(const json& v, const char* name, int64_t lo, int64_t hi, int64_t& out) {
  if (!v.is_number_integer()) return bad(std::string(name) + " must be an integer", name, "invalid_type");
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX))
    return bad(std::string(name) + " is out of range", name);
  const int64_t i = v.get<int64_t>();
  if (i < lo || i > hi)
    return bad(std::string(name) + " must be between " + std::to_string(lo) + " and " + std::to_string(hi), name);
  out = i;
  return std::nullopt;
}

std::optional<ApiError> parse_content(const json& v, const std::string& param, std::string& out) {
  if (v.is_null()) return std::nullopt;  // an assistant turn with only tool calls
  if (v.is_string()) {
    out = v.get<std::string>();
    return std::nullopt;
  }
  if (!v.is_array()) return bad(param + " must be a string or an array of text parts", param, "invalid_type");
  for (const json& part : v) {
    if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
        !part["text"].is_string())
      return bad(param + ": only {\"type\":\"text\",\"text\":...} parts are supported", param);
    out += part["text"].get<std::string>();
  }
  return std::nullopt;
}

// An assistant message's tool_calls, as the chat templates read them: arguments as a JSON object (OpenAI
// sends them as JSON text), ids kept.
std::optional<ApiError> parse_tool_calls(const json& v, const std::string& param, json& out) {
  if (!v.is_array()) return bad(param + " must be an array", param, "invalid_type");
  if (v.size() > kMaxTools) return bad(param + ": at most " + std::to_string(kMaxTools) + " tool calls", param);
  out = json::array();
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string p = param + "[" + std::to_string(i) + "]";
    const json& c = v[i];
    if (!c.is_object() || !c.contains("function") || !c["function"].is_object())
      return bad(p + " must be {\"type\":\"function\",\"id\":...,\"function\":{\"name\":...,\"arguments\":...}}", p, "invalid_type");
    if (c.contains("type") && c["type"] != "function") return bad(p + ".type must be \"function\"", p + ".type");
    const json& f = c["function"];
    if (!f.contains("name") || !f["name"].is_string()) return bad(p + ".function.name must be a string", p + ".function.name", "invalid_type");
    json args = json::object();
    if (f.contains("arguments")) {
      const json& a = f["arguments"];
      if (a.is_string()) {
        const std::string text = a.get<std::string>();
        if (json_nesting_depth(text) > kMaxJsonDepth) return bad(p + ".function.arguments nests too deeply", p + ".function.arguments");
        args = text.empty() ? json::object() : json::parse(text, nullptr, false);
      } else {
        args = a;
      }
      if (!args.is_object()) return bad(p + ".function.arguments must be a JSON object (or its text)", p + ".function.arguments");
    }
    std::string id = c.contains("id") && c["id"].is_string() ? c["id"].get<std::string>() : "call_" + std::to_string(i);
    out.push_back({{"id", id}, {"type", "function"}, {"function", {{"name", f["name"]}, {"arguments", args}}}});
  }
  return std::nullopt;
}

std::optional<ApiError> parse_message(const json& m, size_t i, json& out) {
  const std::string param = "messages[" + std::to_string(i) + "]";
  if (!m.is_object()) return bad(param + " must be an object", param, "invalid_type");
  out = json::object();
  std::string role, content;
  for (const auto& [k, f] : m.items()) {
    if (k == "role") {
      if (!f.is_string()) return bad(param + ".role must be a string", param + ".role", "invalid_type");
      role = f.get<std::string>();
      if (role == "developer") role = "system";  // OpenAI's newer name for the system role
      if (role != "system" && role != "user" && role != "assistant" && role != "tool")
        return bad(param + ".role must be system, developer, user, assistant or tool", param + ".role");
    } else if (k == "content") {
      if (auto e = parse_content(f, param + ".content", content)) return e;
    } else if (k == "name" || k == "tool_call_id") {
      if (!f.is_string()) return bad(param + "." + k + " must be a string", param + "." + k, "invalid_type");
      out[k] = f;
    } else if (k == "tool_calls") {
      if (f.is_null()) continue;
      json calls;
      if (auto e = parse_tool_calls(f, param + ".tool_calls", calls)) return e;
      out["tool_calls"] = std::move(calls);
    } else if (k == "reasoning_content") {  // llama-server's field for an assistant turn's reasoning
      if (!f.is_string() && !f.is_null()) return bad(param + ".reasoning_content must be a string", param + "." + k, "invalid_type");
      if (f.is_string()) out[k] = f;
    } else {
      return bad("unknown field " + param + "." + k, param + "." + k, "unknown_parameter");
    }
  }
  if (role.empty()) return bad(param + ".role is required", param + ".role", "missing_required_parameter");
  if (out.contains("tool_calls") && role != "assistant")
    return bad(param + ".tool_calls is for assistant messages", param + ".tool_calls");
  // Templates index these first; absent content reads as "" (Qwen3's template cannot test a null for "<think>").
  json head = {{"role", role}, {"content", content}};
  for (auto& [k, f] : out.items()) head[k] = f;
  out = std::move(head);
  return std::nullopt;
}

std::optional<ApiError> parse_messages(const json& v, json& out) {
  if (!v.is_array()) return bad("messages must be an array", "messages", "invalid_type");
  if (v.empty()) return bad("messages must not be empty", "messages");
  if (v.size() > kMaxMessages) return bad("too many messages (at most " + std::to_string(kMaxMessages) + ")", "messages");
  out = json::array();
  for (size_t i = 0; i < v.size(); ++i) {
    json m;
    if (auto e = parse_message(v[i], i, m)) return e;
    out.push_back(std::move(m));
  }
  return std::nullopt;
}

// OpenAI's tools: [{"type":"function","function":{"name","description"?,"parameters"?,"strict"?}}].
std::optional<ApiError> parse_tools(const json& v, json& out) {
  if (v.is_null()) return std::nullopt;
  if (!v.is_array()) return bad("tools must be an array", "tools", "invalid_type");
  if (v.size() > kMaxTools) return bad("at most " + std::to_string(kMaxTools) + " tools", "tools");
  out = json::array();
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string p = "tools[" + std::to_string(i) + "]";
    const json& t = v[i];
    if (!t.is_object() || t.value("type", "") != "function" || !t.contains("function") || !t["function"].is_object())
      return bad(p + " must be {\"type\":\"function\",\"function\":{\"name\":...}}", p, "invalid_type");
    const json& f = t["function"];
    for (const auto& [k, x] : f.items()) {
      if (k != "name" && k != "description" && k != "parameters" && k != "strict")
        return bad("unknown field " + p + ".function." + k, p + ".function." + k, "unknown_parameter");
    }
    if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty())
      return bad(p + ".function.name must be a non-empty string", p + ".function.name", "invalid_type");
    if (f.contains("description") && !f["description"].is_string())
      return bad(p + ".function.description must be a string", p + ".function.description", "invalid_type");
    if (f.contains("parameters") && !f["parameters"].is_object())
      return bad(p + ".function.parameters must be a JSON schema object", p + ".function.parameters", "invalid_type");
    for (const json& seen : out)
      if (seen["function"]["name"] == f["name"]) return bad(p + ": a second tool named " + f["name"].dump(), p + ".function.name");
    out.push_back(t);
  }
  return std::nullopt;
}

// auto, none, required, or {"type":"function","function":{"name":...}} (checked against the tools once all
// fields are read).
std::optional<ApiError> parse_tool_choice(const json& v, ApiRequest& r) {
  if (v.is_string() && (v == "auto" || v == "none" || v == "required")) {
    r.tool_choice = v == "auto" ? ToolChoice::AUTO : v == "none" ? ToolChoice::NONE : ToolChoice::REQUIRED;
    return std::nullopt;
  }
  if (v.is_object() && v.value("type", "") == "function" && v.contains("function") && v["function"].is_object() &&
      v["function"].contains("name") && v["function"]["name"].is_string()) {
    r.tool_choice = ToolChoice::FUNCTION;
    r.tool_choice_name = v["function"]["name"].get<std::string>();
    return std::nullopt;
  }
  return bad("tool_choice must be \"auto\", \"none\", \"required\" or {\"type\":\"function\",\"function\":{\"name\":...}}",
             "tool_choice", "invalid_value");
}

// {"type":"text"}, {"type":"json_object"}, or {"type":"json_schema","json_schema":{"name","schema"?,"strict"?,
// "description"?}}; the schema is compiled (and refused keyword by keyword) once the prompt is known.
std::optional<ApiError> parse_response_format(const json& v, ApiRequest& r) {
  if (v.is_null()) return std::nullopt;
  if (!v.is_object() || !v.contains("type") || !v["type"].is_string())
    return bad("response_format must be {\"type\": \"text\" | \"json_object\" | \"json_schema\", ...}", "response_format", "invalid_type");
  const std::string type = v["type"].get<std::string>();
  for (const auto& [k, x] : v.items())
    if (k != "type" && !(type == "json_schema" && k == "json_schema") && !(type == "json_object" && k == "schema"))
      return bad("unknown field response_format." + k, "response_format." + k, "unknown_parameter");
  if (type == "text") return std::nullopt;
  if (type == "json_object") {
    r.response_format = v.contains("schema") ? ResponseFormat::JSON_SCHEMA : ResponseFormat::JSON_OBJECT;
    if (v.contains("schema")) r.response_schema = v["schema"];  // llama-server's spelling of a schema
    return std::nullopt;
  }
  if (type != "json_schema") return bad("response_format.type must be \"text\", \"json_object\" or \"json_schema\"", "response_format.type");
  const std::string p = "response_format.json_schema";
  if (!v.contains("json_schema") || !v["json_schema"].is_object())
    return bad(p + " must be {\"name\": ..., \"schema\": {...}}", p, "invalid_type");
  const json& js = v["json_schema"];
  for (const auto& [k, x] : js.items()) {
    if (k != "name" && k != "schema" && k != "strict" && k != "description")
      return bad("unknown field " + p + "." + k, p + "." + k, "unknown_parameter");
    if ((k == "name" || k == "description") && !x.is_string()) return bad(p + "." + k + " must be a string", p + "." + k, "invalid_type");
    if (k == "strict" && !x.is_boolean() && !x.is_null()) return bad(p + ".strict must be a boolean", p + ".strict", "invalid_type");
    if (k == "schema" && !x.is_object() && !x.is_boolean()) return bad(p + ".schema must be a JSON Schema object", p + ".schema", "invalid_type");
  }
  if (!js.contains("name")) return bad(p + ".name is required", p + ".name", "missing_required_parameter");
  r.response_format = ResponseFormat::JSON_SCHEMA;
  r.response_schema = js.contains("schema") ? js["schema"] : json::object();
  return std::nullopt;
}

// What the fields say together: a named function must be offered; constraints need something to constrain to.
std::optional<ApiError> check_constraints(const ApiRequest& r) {
  const bool calls = r.tool_choice == ToolChoice::REQUIRED || r.tool_choice == ToolChoice::FUNCTION;
  if (calls && (!r.tools.is_array() || r.tools.empty()))
    return bad("tool_choice asks for a tool call, but no tools are offered", "tool_choice");
  if (r.tool_choice == ToolChoice::FUNCTION) {
    bool found = false;
    for (const json& t : r.tools) found = found || t["function"]["name"] == r.tool_choice_name;
    if (!found) return bad("tool_choice names '" + r.tool_choice_name + "', which is not among the tools", "tool_choice");
  }
  if (calls && r.response_format != ResponseFormat::TEXT)
    return bad("tool_choice \"required\" or a named function cannot be combined with a JSON response_format", "response_format");
  return std::nullopt;
}

std::optional<ApiError> parse_stop(const json& v, std::vector<std::string>& out) {
  if (v.is_null()) return std::nullopt;
  std::vector<json> items;
  if (v.is_string()) items.push_back(v);
  else if (v.is_array()) items.assign(v.begin(), v.end());
  else return bad("stop must be a string or an array of strings", "stop", "invalid_type");
  if (items.size() > kMaxStopStrings) return bad("at most " + std::to_string(kMaxStopStrings) + " stop strings", "stop");
  for (const json& s : items) {
    if (!s.is_string()) return bad("stop must be a string or an array of strings", "stop", "invalid_type");
    std::string text = s.get<std::string>();
    if (text.size() > kMaxStopBytes) return bad("a stop string is longer than " + std::to_string(kMaxStopBytes) + " bytes", "stop");
    if (!text.empty()) out.push_back(std::move(text));
  }
  return std::nullopt;
}

// OpenAI's four prompt shapes: "text", ["text", ...], [id, ...], [[id, ...], ...]; each prompt one choice.
std::optional<ApiError> parse_prompt(const json& v, std::vector<PromptInput>& out) {
  const auto token_list = [](const json& a, PromptInput& p) -> std::optional<ApiError> {
    if (a.empty()) return bad("a prompt of token ids must not be empty", "prompt");
    for (const json& t : a) {
      if (!t.is_number_integer() || (t.is_number_unsigned() && t.get<uint64_t>() > uint64_t(INT32_MAX)) ||
          t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX)
        return bad("prompt token ids must be integers >= 0", "prompt", "invalid_type");
      p.tokens.push_back(int32_t(t.get<int64_t>()));
    }
    p.is_tokens = true;
    return std::nullopt;
  };
  constexpr const char* kShapes = "prompt must be a string, an array of strings, an array of token ids or an array of such arrays";
  if (v.is_string()) {
    out.push_back({.text = v.get<std::string>(), .tokens = {}, .is_tokens = false});
    return std::nullopt;
  }
  if (!v.is_array() || v.empty()) return bad(kShapes, "prompt", "invalid_type");
  if (v.front().is_number()) {
    PromptInput p;
    if (auto e = token_list(v, p)) return e;
    out.push_back(std::move(p));
    return std::nullopt;
  }
  if (v.size() > kMaxPrompts) return bad("at most " + std::to_string(kMaxPrompts) + " prompts", "prompt");
  for (const json& item : v) {
    PromptInput p;
    if (item.is_string()) p.text = item.get<std::string>();
    else if (!item.is_array()) return bad(kShapes, "prompt", "invalid_type");
    else if (auto e = token_list(item, p)) return e;
    out.push_back(std::move(p));
  }
  return std::nullopt;
}

std::optional<ApiError> parse_field(ApiRequest& r, const std::string& k, const json& v, bool& have_messages,
                                    bool& have_prompt) {
  const bool chat = r.endpoint == ApiEndpoint::CHAT;
  int64_t i = 0;
  if (k == "model") {
    if (!v.is_string()) return bad("model must be a string", k, "invalid_type");
    r.model = v.get<std::string>();
  } else if (chat && k == "messages") {
    have_messages = true;
    return parse_messages(v, r.messages);
  } else if (!chat && k == "prompt") {
    have_prompt = true;
    return parse_prompt(v, r.prompts);
  } else if (k == "stream") {
    if (!v.is_boolean()) return bad("stream must be a boolean", k, "invalid_type");
    r.stream = v.get<bool>();
  } else if (k == "stream_options") {
    if (v.is_null()) return std::nullopt;
    if (!v.is_object()) return bad("stream_options must be an object", k, "invalid_type");
    for (const auto& [sk, sv] : v.items()) {
      if (sk != "include_usage") return bad("unknown field stream_options." + sk, "stream_options." + sk, "unknown_parameter");
      if (!sv.is_boolean()) return bad("stream_options.include_usage must be a boolean", "stream_options.include_usage", "invalid_type");
      r.include_usage = sv.get<bool>();
    }
  } else if (k == "max_tokens" || k == "max_completion_tokens" || k == "n_predict") {
    if (v.is_null()) return std::nullopt;
    if (auto e = integer_in(v, k.c_str(), 0, INT32_MAX, i)) return e;
    r.max_tokens = int32_t(i);
  } else if (k == "temperature") {
    return number_in(v, "temperature", 0, 100, r.sampling.temperature);
  } else if (k == "top_p") {
    return number_in(v, "top_p", 0, 1, r.sampling.top_p);
  } else if (k == "min_p") {
    return number_in(v, "min_p", 0, 1, r.sampling.min_p);
  } else if (k == "top_k") {
    if (auto e = integer_in(v, "top_k", 0, INT32_MAX, i)) return e;
    r.sampling.top_k = int32_t(i);
  } else if (k == "frequency_penalty") {
    return number_in(v, "frequency_penalty", -2, 2, r.sampling.frequency_penalty);
  } else if (k == "presence_penalty") {
    return number_in(v, "presence_penalty", -2, 2, r.sampling.presence_penalty);
  } else if (k == "repeat_penalty") {
    return number_in(v, "repeat_penalty", 0, 100, r.sampling.repeat_penalty);
  } else if (k == "seed") {
    if (v.is_null()) return std::nullopt;
    // -1 asks for a random seed, as in llama-server; SEED_RANDOM itself means the same.
    if (auto e = integer_in(v, "seed", -1, int64_t(UINT32_MAX), i)) return e;
    r.sampling.seed = i < 0 ? SamplerParams::SEED_RANDOM : uint32_t(i);
  } else if (k == "ignore_eos") {
    if (!v.is_boolean()) return bad("ignore_eos must be a boolean", k, "invalid_type");
    r.ignore_eos = v.get<bool>();
  } else if (k == "stop") {
    return parse_stop(v, r.stop);
  } else if (k == "n") {
    if (auto e = integer_in(v, "n", 1, 1, i)) return bad("only n = 1 is supported", k);
  } else if (chat && k == "chat_template_kwargs") {
    if (!v.is_object()) return bad("chat_template_kwargs must be an object", k, "invalid_type");
    for (const auto& [ck, cv] : v.items()) {
      if (ck == "messages" || ck == "tools" || ck == "add_generation_prompt")
        return bad("chat_template_kwargs." + ck + " is set by the server", "chat_template_kwargs." + ck);
      if (ck == "enable_thinking" && !cv.is_boolean())
        return bad("chat_template_kwargs.enable_thinking must be a boolean", "chat_template_kwargs.enable_thinking", "invalid_type");
      r.template_kwargs[ck] = cv;
    }
  } else if (chat && k == "tools") {
    return parse_tools(v, r.tools);
  } else if (chat && k == "tool_choice") {
    return parse_tool_choice(v, r);
  } else if (k == "response_format") {
    return parse_response_format(v, r);
  } else if (k == "logprobs" || k == "echo") {
    if (!v.is_null() && !(v.is_boolean() && !v.get<bool>())) return bad(k + " is not supported", k);
  } else if (is_ignored_field(k)) {
    // accepted and ignored (docs/serve.md)
  } else {
    return bad("unknown field '" + k + "'", k, "unknown_parameter");
  }
  return std::nullopt;
}


// ---- Anthropic's Messages API ----

std::optional<ApiError> anthropic_text(const json& v, const std::string& param, std::string& out) {
  if (v.is_string()) {
    out += v.get<std::string>();
    return std::nullopt;
  }
  if (!v.is_array()) return bad(param + " must be a string or an array of text blocks", param, "invalid_type");
  for (const json& b : v) {
    if (!b.is_object() || b.value("type", "") != "text" || !b.contains("text") || !b["text"].is_string())
      return bad(param + ": only {\"type\":\"text\",\"text\":...} blocks are supported here", param);
    out += b["text"].get<std::string>();
  }
  return std::nullopt;
}

// One Anthropic message as OpenAI-shaped messages: a user turn's tool_result blocks become tool messages
// (before its text, as a client answers the calls first); an assistant turn keeps text, thinking and tool_use.
std::optional<ApiError> anthropic_message(const json& m, size_t i, json& out) {
  const std::string param = "messages[" + std::to_string(i) + "]";
  if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
    return bad(param + " must be {\"role\": \"user\"|\"assistant\", \"content\": ...}", param, "invalid_type");
  const std::string role = m["role"].get<std::string>();
  if (role != "user" && role != "assistant") return bad(param + ".role must be user or assistant", param + ".role");
  for (const auto& [k, f] : m.items())
    if (k != "role" && k != "content") return bad("unknown field " + param + "." + k, param + "." + k, "unknown_parameter");
  if (!m.contains("content")) return bad(param + ".content is required", param + ".content", "missing_required_parameter");
  const json& content = m["content"];
  if (content.is_string()) {
    out.push_back({{"role", role}, {"content", content}});
    return std::nullopt;
  }
  if (!content.is_array()) return bad(param + ".content must be a string or an array of blocks", param + ".content", "invalid_type");
  std::string text, thinking;
  json calls = json::array();
  for (size_t b = 0; b < content.size(); ++b) {
    const json& block = content[b];
    const std::string p = param + ".content[" + std::to_string(b) + "]";
    const std::string type = block.is_object() ? block.value("type", "") : "";
    if (type == "text" && block.contains("text") && block["text"].is_string()) {
      text += block["text"].get<std::string>();
    } else if (type == "thinking" && role == "assistant" && block.contains("thinking") && block["thinking"].is_string()) {
      thinking += block["thinking"].get<std::string>();
    } else if (type == "redacted_thinking" && role == "assistant") {
      // opaque to this server: nothing to render
    } else if (type == "tool_use" && role == "assistant") {
      if (!block.contains("id") || !block["id"].is_string() || !block.contains("name") || !block["name"].is_string() ||
          !block.contains("input") || !block["input"].is_object())
        return bad(p + " must be {\"type\":\"tool_use\",\"id\":...,\"name\":...,\"input\":{...}}", p, "invalid_type");
      calls.push_back({{"id", block["id"]}, {"type", "function"},
                       {"function", {{"name", block["name"]}, {"arguments", block["input"]}}}});
    } else if (type == "tool_result" && role == "user") {
      if (!block.contains("tool_use_id") || !block["tool_use_id"].is_string())
        return bad(p + ".tool_use_id must be a string", p + ".tool_use_id", "invalid_type");
      std::string result;
      if (block.contains("content"))
        if (auto e = anthropic_text(block["content"], p + ".content", result)) return e;
      if (block.value("is_error", false)) result = "Error: " + result;
      out.push_back({{"role", "tool"}, {"content", result}, {"tool_call_id", block["tool_use_id"]}});
    } else {
      return bad(p + ": a " + (type.empty() ? std::string("block without a type") : "'" + type + "' block") +
                     " is not supported in a " + role + " message (text, thinking, tool_use, tool_result are)", p);
    }
  }
  if (role == "user" && text.empty() && !out.empty() && out.back()["role"] == "tool") return std::nullopt;
  json msg = {{"role", role}, {"content", text}};
  if (!thinking.empty()) msg["reasoning_content"] = thinking;
  if (!calls.empty()) msg["tool_calls"] = calls;
  out.push_back(std::move(msg));
  return std::nullopt;
}

std::optional<ApiError> anthropic_field(ApiRequest& r, const std::string& k, const json& v, bool& have_max) {
  int64_t i = 0;
  if (k == "model") {
    if (!v.is_string()) return bad("model must be a string", k, "invalid_type");
    r.model = v.get<std::string>();
  } else if (k == "max_tokens") {
    if (auto e = integer_in(v, "max_tokens", 1, INT32_MAX, i)) return e;
    r.max_tokens = int32_t(i);
    have_max = true;
  } else if (k == "messages") {
    if (!v.is_array() || v.empty()) return bad("messages must be a non-empty array", k, "invalid_type");
    if (v.size() > kMaxMessages) return bad("too many messages (at most " + std::to_string(kMaxMessages) + ")", k);
    for (size_t m = 0; m < v.size(); ++m)
      if (auto e = anthropic_message(v[m], m, r.messages)) return e;
  } else if (k == "system") {
    std::string text;
    if (auto e = anthropic_text(v, "system", text)) return e;
    r.messages.insert(r.messages.begin(), json{{"role", "system"}, {"content", text}});
  } else if (k == "stream") {
    if (!v.is_boolean()) return bad("stream must be a boolean", k, "invalid_type");
    r.stream = v.get<bool>();
  } else if (k == "stop_sequences") {
    return parse_stop(v, r.stop);
  } else if (k == "temperature") {
    return number_in(v, "temperature", 0, 1, r.sampling.temperature);
  } else if (k == "top_p") {
    return number_in(v, "top_p", 0, 1, r.sampling.top_p);
  } else if (k == "top_k") {
    if (auto e = integer_in(v, "top_k", 0, INT32_MAX, i)) return e;
    r.sampling.top_k = int32_t(i);
  } else if (k == "tools") {
    if (!v.is_array()) return bad("tools must be an array", k, "invalid_type");
    json openai = json::array();
    for (const json& t : v) {
      if (!t.is_object() || !t.contains("name") || !t.contains("input_schema"))
        return bad("tools[]: {\"name\":...,\"input_schema\":{...}} (server tools are not supported)", k, "invalid_type");
      json f = {{"name", t["name"]}};
      if (t.contains("description")) f["description"] = t["description"];
      f["parameters"] = t["input_schema"];
      openai.push_back({{"type", "function"}, {"function", f}});
    }
    return parse_tools(openai, r.tools);
  } else if (k == "tool_choice") {
    const std::string type = v.is_object() ? v.value("type", "") : "";
    if (type == "auto") r.tool_choice = ToolChoice::AUTO;
    else if (type == "none") r.tool_choice = ToolChoice::NONE;
    else if (type == "any") r.tool_choice = ToolChoice::REQUIRED;
    else if (type == "tool" && v.contains("name") && v["name"].is_string()) {
      r.tool_choice = ToolChoice::FUNCTION;
      r.tool_choice_name = v["name"].get<std::string>();
    } else return bad("tool_choice must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}", k);
  } else if (k == "thinking") {
    const std::string type = v.is_object() ? v.value("type", "") : "";
    if (type != "enabled" && type != "disabled") return bad("thinking must be {\"type\": \"enabled\" | \"disabled\", ...}", k);
    r.template_kwargs["enable_thinking"] = type == "enabled";
  } else if (k == "metadata" || k == "service_tier") {
    // accepted and ignored (docs/serve.md)
  } else {
    return bad("unknown field '" + k + "'", k, "unknown_parameter");
  }
  return std::nullopt;
}

}  // namespace

ApiParse parse_anthropic_request(std::string_view body) {
  if (json_nesting_depth(body) > kMaxJsonDepth)
    return {std::nullopt, bad("the JSON body nests deeper than " + std::to_string(kMaxJsonDepth) + " levels")};
  const json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return {std::nullopt, bad("the body is not valid JSON", {}, "invalid_json")};
  if (!j.is_object()) return {std::nullopt, bad("the body must be a JSON object", {}, "invalid_type")};
  ApiRequest r;
  r.endpoint = ApiEndpoint::MESSAGES;
  bool have_max = false;
  for (const auto& [k, v] : j.items())
    if (std::optional<ApiError> e = anthropic_field(r, k, v, have_max)) return {std::nullopt, std::move(e)};
  if (!have_max) return {std::nullopt, bad("max_tokens is required", "max_tokens", "missing_required_parameter")};
  if (r.messages.empty() || (r.messages.size() == 1 && r.messages[0]["role"] == "system"))
    return {std::nullopt, bad("messages is required", "messages", "missing_required_parameter")};
  if (r.messages.size() > kMaxMessages) return {std::nullopt, bad("too many messages", "messages")};
  if (std::optional<ApiError> e = check_constraints(r)) return {std::nullopt, std::move(e)};
  return {std::move(r), std::nullopt};
}

namespace {
}  // namespace

std::string api_error_json(const ApiError& e) {
  json err = {{"message", e.message}, {"type", e.type}, {"code", e.code}};
  err["param"] = e.param.empty() ? json(nullptr) : json(e.param);
  return json{{"error", err}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

size_t json_nesting_depth(std::string_view text) {
  size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') deepest = std::max(deepest, ++depth);
    else if ((c == ']' || c == '}') && depth > 0) --depth;
  }
  return deepest;
}

ApiParse parse_api_request(ApiEndpoint endpoint, std::string_view body) {
  if (json_nesting_depth(body) > kMaxJsonDepth)
    return {std::nullopt, bad("the JSON body nests deeper than " + std::to_string(kMaxJsonDepth) + " levels")};
  const json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return {std::nullopt, bad("the body is not valid JSON", {}, "invalid_json")};
  if (!j.is_object()) return {std::nullopt, bad("the body must be a JSON object", {}, "invalid_type")};
  ApiRequest r;
  r.endpoint = endpoint;
  bool have_messages = false, have_prompt = false;
  for (const auto& [k, v] : j.items()) {
    if (std::optional<ApiError> e = parse_field(r, k, v, have_messages, have_prompt)) return {std::nullopt, std::move(e)};
  }
  if (endpoint == ApiEndpoint::CHAT && !have_messages)
    return {std::nullopt, bad("messages is required", "messages", "missing_required_parameter")};
  if (endpoint == ApiEndpoint::COMPLETION && !have_prompt)
    return {std::nullopt, bad("prompt is required", "prompt", "missing_required_parameter")};
  if (std::optional<ApiError> e = check_constraints(r)) return {std::nullopt, std::move(e)};
  return {std::move(r), std::nullopt};
}

}  // namespace essaim::serve
