// An independent JSON Schema validator for the tests of structured output: written from the JSON Schema
// specification (draft 2020-12 semantics for the keywords below), sharing no code with the grammar compiler
// (text/json_schema_grammar.h), so that "the output validates" means something. oneOf is exactly one branch;
// formats are checked with regular expressions plus calendar rules.
//
//   std::string why = schema_check(value, schema);   // empty: valid
#pragma once

#include <cstdint>
#include <regex>
#include <string>

#include <nlohmann/json.hpp>

namespace essaim::test {

using ojson = nlohmann::ordered_json;

inline size_t code_points(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

inline bool check_format(const std::string& format, const std::string& s) {
  static const std::regex date(R"((\d{4})-(\d{2})-(\d{2}))");
  static const std::regex time(R"(([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?(Z|z|[+-]([01]\d|2[0-3]):[0-5]\d))");
  static const std::regex uuid(R"([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})");
  const auto valid_date = [](const std::string& d) {
    std::smatch m;
    if (!std::regex_match(d, m, date)) return false;
    const int y = std::stoi(m[1]), mo = std::stoi(m[2]), day = std::stoi(m[3]);
    const bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    const int days[] = {31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    return mo >= 1 && mo <= 12 && day >= 1 && day <= days[mo - 1];
  };
  if (format == "date") return valid_date(s);
  if (format == "time") return std::regex_match(s, time);
  if (format == "date-time") {
    const size_t t = s.find_first_of("Tt");
    return t != std::string::npos && valid_date(s.substr(0, t)) && std::regex_match(s.substr(t + 1), time);
  }
  if (format == "uuid") return std::regex_match(s, uuid);
  return false;
}

inline bool is_type(const ojson& v, const std::string& t) {
  if (t == "null") return v.is_null();
  if (t == "boolean") return v.is_boolean();
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "string") return v.is_string();
  if (t == "number") return v.is_number();
  if (t == "integer") return v.is_number_integer() || (v.is_number_float() && v.get<double>() == double(int64_t(v.get<double>())));
  return false;
}

inline std::string schema_check(const ojson& v, const ojson& s, const ojson& root, const std::string& at);

inline std::string schema_check(const ojson& v, const ojson& s) { return schema_check(v, s, s, "#"); }

inline std::string schema_check(const ojson& v, const ojson& s, const ojson& root, const std::string& at) {
  if (s.is_boolean()) return s.get<bool>() ? "" : at + ": false schema";
  if (s.contains("$ref")) {
    const std::string ref = s["$ref"].get<std::string>();
    return schema_check(v, root[ojson::json_pointer(ref.substr(1))], root, at);
  }
  if (s.contains("nullable") && s["nullable"] == true && v.is_null()) return "";
  if (s.contains("type")) {
    bool ok = false;
    if (s["type"].is_string()) ok = is_type(v, s["type"].get<std::string>());
    else for (const ojson& t : s["type"]) ok = ok || is_type(v, t.get<std::string>());
    if (!ok) return at + ": not of type " + s["type"].dump();
  }
  if (s.contains("enum")) {
    bool found = false;
    for (const ojson& e : s["enum"]) found = found || e == v;
    if (!found) return at + ": not in enum";
  }
  if (s.contains("const") && s["const"] != v) return at + ": not the const";
  if (s.contains("anyOf")) {
    bool any = false;
    for (const ojson& b : s["anyOf"]) any = any || schema_check(v, b, root, at).empty();
    if (!any) return at + ": no anyOf branch";
  }
  if (s.contains("oneOf")) {
    int n = 0;
    for (const ojson& b : s["oneOf"]) n += schema_check(v, b, root, at).empty();
    if (n != 1) return at + ": " + std::to_string(n) + " oneOf branches";
  }
  if (s.contains("allOf"))
    for (const ojson& b : s["allOf"])
      if (std::string why = schema_check(v, b, root, at); !why.empty()) return why;
  if (v.is_string()) {
    const std::string str = v.get<std::string>();
    if (s.contains("minLength") && code_points(str) < s["minLength"].get<size_t>()) return at + ": shorter than minLength";
    if (s.contains("maxLength") && code_points(str) > s["maxLength"].get<size_t>()) return at + ": longer than maxLength";
    if (s.contains("format") && !check_format(s["format"].get<std::string>(), str)) return at + ": not a " + s["format"].get<std::string>();
  }
  if (v.is_array()) {
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return at + ": fewer than minItems";
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return at + ": more than maxItems";
    if (s.contains("items"))
      for (size_t i = 0; i < v.size(); ++i)
        if (std::string why = schema_check(v[i], s["items"], root, at + "/" + std::to_string(i)); !why.empty()) return why;
  }
  if (v.is_object()) {
    if (s.contains("required"))
      for (const ojson& r : s["required"])
        if (!v.contains(r.get<std::string>())) return at + ": missing required " + r.get<std::string>();
    for (const auto& [k, x] : v.items()) {
      const std::string here = at + "/" + k;
      if (s.contains("properties") && s["properties"].contains(k)) {
        if (std::string why = schema_check(x, s["properties"][k], root, here); !why.empty()) return why;
      } else if (s.contains("additionalProperties")) {
        if (std::string why = schema_check(x, s["additionalProperties"], root, here); !why.empty()) return why;
      }
    }
  }
  return "";
}

}  // namespace essaim::test
