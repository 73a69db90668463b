#include "text/json_schema_compiler.h"

namespace essaim::schema_grammar {

// Keywords that say nothing about which values are valid.
const std::set<std::string>& annotation_keywords() {
  static const std::set<std::string> k = {"title", "description", "default", "examples", "$schema", "$id",
                                          "$comment", "deprecated", "readOnly", "writeOnly", "$defs", "definitions"};
  return k;
}
namespace {
const std::set<std::string>& supported_keywords() {
  static const std::set<std::string> k = {"type", "properties", "required", "additionalProperties", "items", "enum",
                                          "const", "anyOf", "oneOf", "allOf", "$ref", "minItems", "maxItems",
                                          "minLength", "maxLength", "format", "nullable"};
  return k;
}
}  // namespace

std::string json_text(const ojson& v) { return v.dump(-1, ' ', false, ojson::error_handler_t::strict); }

std::vector<std::string> constraining(const ojson& s) {
  std::vector<std::string> out;
  for (const auto& [k, v] : s.items())
    if (!annotation_keywords().count(k)) out.push_back(k);
  return out;
}

namespace {

bool type_matches(const ojson& v, const std::string& type) {
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "string") return v.is_string();
  if (type == "boolean") return v.is_boolean();
  if (type == "null") return v.is_null();
  if (type == "number") return v.is_number();
  if (type == "integer") return v.is_number_integer();
  return false;
}

}  // namespace


uint32_t Compiler::ws_rule() {
  // Nothing, a space, or a newline and an indent: what models write, bounded so that no output runs away.
  if (!ws_) {
    ByteSet indent;
    indent.set(' ');
    indent.set('\t');
    const uint32_t ind = b_.repeat({b_.bytes(indent)}, 0, 16);
    ws_ = b_.rule({{}, b_.literal(" "), b_.seq({b_.literal("\n"), {b_.ref(ind)}})});
  }
  return *ws_;
}

int64_t Compiler::bound(const ojson& s, const char* keyword, int64_t cap, const std::string& path) {
  if (!s.contains(keyword)) return -1;
  const ojson& v = s[keyword];
  if (!v.is_number_integer() || v.get<int64_t>() < 0)
    refuse(std::string("'") + keyword + "' at " + path + " must be an integer >= 0");
  if (v.get<int64_t>() > cap)
    refuse(std::string("'") + keyword + "' at " + path + " is over the supported " + std::to_string(cap));
  return v.get<int64_t>();
}

Seq Compiler::value(const ojson& s, const std::string& path, int depth) {
  if (depth > kSchemaMaxDepth) refuse("the schema nests deeper than " + std::to_string(kSchemaMaxDepth) + " at " + path);
  if (s.is_boolean()) {
    if (!s.get<bool>()) refuse("the schema at " + path + " is false: no value satisfies it");
    return any_value(kAnyJsonDepth);
  }
  if (!s.is_object()) refuse("the schema at " + path + " is not an object");
  for (const auto& [k, v] : s.items())
    if (!annotation_keywords().count(k) && !supported_keywords().count(k))
      refuse("unsupported JSON Schema keyword '" + k + "' at " + path);
  const std::vector<std::string> kw = constraining(s);
  const auto alone = [&](const char* keyword) {
    for (const std::string& k : kw)
      if (k != keyword && k != "nullable")
        refuse("'" + std::string(keyword) + "' beside '" + k + "' at " + path + " is not supported");
  };
  const bool nullable = s.contains("nullable") && s["nullable"] == true;
  const auto with_null = [&](Seq body) {
    return nullable ? Seq{b_.ref(b_.rule({std::move(body), b_.literal("null")}))} : body;
  };
  if (s.contains("$ref")) {
    alone("$ref");
    if (!s["$ref"].is_string()) refuse("'$ref' at " + path + " must be a string");
    return with_null(ref(s["$ref"].get<std::string>(), path, depth));
  }
  if (s.contains("allOf")) {
    alone("allOf");
    if (!s["allOf"].is_array() || s["allOf"].size() != 1)
      refuse("'allOf' at " + path + " is supported with exactly one schema");
    return with_null(value(s["allOf"][0], path + "/allOf/0", depth + 1));
  }
  for (const char* k : {"anyOf", "oneOf"})
    if (s.contains(k)) {
      alone(k);
      return with_null(alternatives(s[k], k, path, depth));
    }
  if (s.contains("enum") || s.contains("const")) return with_null(literals(s.contains("enum") ? s["enum"] : ojson::array({s["const"]}), s, path));
  std::vector<std::string> types;
  if (s.contains("type")) {
    const ojson& t = s["type"];
    if (t.is_string()) types.push_back(t.get<std::string>());
    else if (t.is_array() && !t.empty())
      for (const ojson& one : t) types.push_back(one.is_string() ? one.get<std::string>() : std::string("?"));
    else refuse("'type' at " + path + " must be a type name or a non-empty list of them");
  } else if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required")) {
    types.push_back("object");
  } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
    types.push_back("array");
  } else if (s.contains("minLength") || s.contains("maxLength") || s.contains("format")) {
    types.push_back("string");
  } else {
    return with_null(any_value(kAnyJsonDepth));
  }
  if (nullable) types.push_back("null");
  std::vector<Seq> alts;
  std::set<std::string> seen;
  for (const std::string& t : types)
    if (seen.insert(t).second) alts.push_back(typed(t, s, path, depth));
  return {b_.ref(b_.rule(std::move(alts)))};
}

Seq Compiler::typed(const std::string& t, const ojson& s, const std::string& path, int depth) {
  if (t == "object") return object(s, path, depth);
  if (t == "array") return array(s, path, depth);
  if (t == "string") return string(s, path, CharKind::JSON);
  if (t == "number") return number();
  if (t == "integer") return integer();
  if (t == "boolean") return {b_.ref(b_.rule({b_.literal("true"), b_.literal("false")}))};
  if (t == "null") return b_.literal("null");
  refuse("unknown type '" + t + "' at " + path + " (object, array, string, number, integer, boolean, null)");
}

Seq Compiler::alternatives(const ojson& branches, const char* keyword, const std::string& path, int depth) {
  if (!branches.is_array() || branches.empty()) refuse(std::string("'") + keyword + "' at " + path + " must be a non-empty array");
  std::vector<Seq> alts;
  for (size_t i = 0; i < branches.size(); ++i)
    alts.push_back(value(branches[i], path + "/" + keyword + "/" + std::to_string(i), depth + 1));
  return {b_.ref(b_.rule(std::move(alts)))};
}

// enum / const: each value's JSON text, those of the wrong type (when one is given) left out.
Seq Compiler::literals(const ojson& values, const ojson& s, const std::string& path) {
  if (!values.is_array() || values.empty()) refuse("'enum' at " + path + " must be a non-empty array");
  if (values.size() > kSchemaMaxEnum) refuse("'enum' at " + path + " has over " + std::to_string(kSchemaMaxEnum) + " values");
  for (const std::string& k : constraining(s))
    if (k != "enum" && k != "const" && k != "type" && k != "nullable")
      refuse("'" + k + "' beside 'enum'/'const' at " + path + " is not supported");
  std::vector<Seq> alts;
  for (const ojson& v : values) {
    bool ok = !s.contains("type");
    if (s.contains("type") && s["type"].is_string()) ok = type_matches(v, s["type"].get<std::string>());
    if (s.contains("type") && s["type"].is_array())
      for (const ojson& t : s["type"]) ok = ok || (t.is_string() && type_matches(v, t.get<std::string>()));
    if (ok) alts.push_back(b_.literal(json_text(v)));
  }
  if (alts.empty()) refuse("no value of 'enum'/'const' at " + path + " has the schema's type");
  return {b_.ref(b_.rule(std::move(alts)))};
}

Seq Compiler::ref(const std::string& target, const std::string& path, int depth) {
  const auto it = refs_.find(target);
  if (it != refs_.end()) return {b_.ref(it->second)};
  std::string pointer;
  for (const char* prefix : {"#/$defs/", "#/definitions/"})
    if (target.starts_with(prefix)) pointer = target.substr(1);
  if (pointer.empty()) refuse("'$ref' " + target + " at " + path + ": only #/$defs/NAME and #/definitions/NAME are supported");
  const ojson::json_pointer ptr(pointer);
  if (pointer.find('~') != std::string::npos || !root_->contains(ptr))
    refuse("'$ref' " + target + " at " + path + " names no schema of this document");
  if (!refs_open_.insert(target).second) refuse("'$ref' " + target + " at " + path + " is recursive, which is not supported");
  const uint32_t r = b_.rule({value((*root_)[ptr], target, depth + 1)});
  refs_open_.erase(target);
  refs_.emplace(target, r);
  return {b_.ref(r)};
}


namespace {

// Compiles `body` (given the compiler) behind the reasoning prefix when the prompt opened <think>, and
// turns refusals and library errors into an error value.
template <typename Body>
Result<std::shared_ptr<const Grammar>> compile(const ojson& root, const StructuredOutputOptions& options, Body body) {
  try {
    Compiler c(root, options.limits);
    Seq s = body(c);
    if (options.in_reasoning) s = GrammarBuilder::seq({c.think_prefix(), s});
    GrammarBuilder& b = c.builder();
    b.set_root(b.rule({std::move(s)}));
    return b.build();
  } catch (const Refusal& r) {
    return Status::error(r.message);
  } catch (const nlohmann::json::exception& e) {
    return Status::error(std::string("the schema cannot be read: ") + e.what());
  }
}

Seq xml_call(Compiler& c, const std::string& name, const ojson& params, const std::string& path) {
  GrammarBuilder& b = c.builder();
  Seq call = b.literal("<tool_call>\n<function=" + name + ">\n");
  if (params.is_object() && params.contains("properties")) {
    if (!params["properties"].is_object()) refuse("'properties' at " + path + " must be an object");
    std::set<std::string> required;
    if (params.contains("required") && params["required"].is_array())
      for (const ojson& r : params["required"])
        if (r.is_string()) required.insert(r.get<std::string>());
    for (const auto& [p, schema] : params["properties"].items()) {
      if (p.find_first_of("<>\n") != std::string::npos) refuse("parameter name " + json_text(p) + " at " + path + " cannot be written in this model's tool-call syntax");
      const std::string at = path + "/properties/" + p;
      const bool text = !schema.is_object() || !schema.contains("type") || schema["type"] == "string";
      const Seq v = text && schema.is_object() ? c.raw_string_value(schema, at) : c.value(schema, at, 1);
      Seq one = b.seq({b.literal("<parameter=" + p + ">\n"), v, b.literal("\n</parameter>\n")});
      call = b.seq({call, required.count(p) ? one : Seq{b.ref(b.optional(std::move(one)))}});
      required.erase(p);
    }
    if (!required.empty()) refuse("required parameter '" + *required.begin() + "' at " + path + " is not in 'properties'");
  }
  return b.seq({call, b.literal("</function>\n</tool_call>")});
}

}  // namespace

}  // namespace essaim::schema_grammar

namespace essaim {

using schema_grammar::Compiler;
using schema_grammar::ojson;
using schema_grammar::Seq;

Result<std::shared_ptr<const Grammar>> json_schema_grammar(const ojson& schema, const StructuredOutputOptions& options) {
  return schema_grammar::compile(schema, options, [&](Compiler& c) { return c.value(schema, "#", 0); });
}

Result<std::shared_ptr<const Grammar>> json_object_grammar(const StructuredOutputOptions& options) {
  static const ojson kNone = ojson::object();
  return schema_grammar::compile(kNone, options, [&](Compiler& c) { return c.any_object(kAnyJsonDepth); });
}

Result<std::shared_ptr<const Grammar>> tool_call_grammar(const ojson& tools, const std::string& only, ToolCallSyntax syntax,
                                                         const StructuredOutputOptions& options) {
  if (!tools.is_array() || tools.empty()) return Status::error("no tools were offered to call");
  auto body = [&](Compiler& c) {
    GrammarBuilder& b = c.builder();
    std::vector<Seq> calls;
    for (size_t i = 0; i < tools.size(); ++i) {
      const ojson& f = tools[i]["function"];
      const std::string name = f["name"].get<std::string>();
      if (!only.empty() && name != only) continue;
      const std::string path = "tools[" + std::to_string(i) + "].function.parameters";
      static const ojson kAnyObject = {{"type", "object"}};
      const ojson& params = f.contains("parameters") ? f["parameters"] : kAnyObject;
      c.set_document(params);  // a $ref inside points into this tool's parameters
      if (syntax == ToolCallSyntax::XML) {
        calls.push_back(schema_grammar::xml_call(c, name, params, path));
      } else {
        calls.push_back(b.seq({b.literal("<tool_call>\n{\"name\": " + schema_grammar::json_text(name) + ", \"arguments\": "),
                               c.value(params, path, 1), b.literal("}\n</tool_call>")}));
      }
    }
    if (calls.empty()) schema_grammar::refuse("tool_choice names '" + only + "', which is not among the tools");
    const Seq one = {b.ref(b.rule(std::move(calls)))};
    if (!only.empty()) return one;
    return b.seq({one, {b.ref(b.star(b.seq({b.literal("\n"), one})))}});
  };
  return schema_grammar::compile(tools, options, body);
}

}  // namespace essaim
