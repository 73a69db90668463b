// Values of text/jinja.h as Python shows them: truthiness, str(), repr(), equality, and json.dumps with
// ensure_ascii=False (what Hugging Face's `tojson` calls), so that a rendering equals Jinja2's byte for byte.
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "text/jinja_ast.h"

namespace essaim::jinja {
namespace {

constexpr int kMaxJsonDepth = 64;

// Python's repr(float): the shortest text that reads back the same double, with ".0" on whole numbers and
// an exponent past 1e16 / below 1e-4.
std::string float_text(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[40];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  std::string s = buf;
  const size_t e = s.find('e');
  if (e != std::string::npos) {  // C: 1e+16, 1e-05; Python: 1e+16, 1e-05 — the same, but mantissa "1.5e" fine
    return s;
  }
  if (s.find('.') == std::string::npos && s.find("inf") == std::string::npos) s += ".0";
  return s;
}

void json_string(const std::string& s, std::string& out) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += char(c);
        }
    }
  }
  out += '"';
}

void json_value(const Value& v, std::string& out, int depth) {
  if (depth > kMaxJsonDepth) throw JinjaError("tojson: nested too deeply");
  switch (v.type) {
    case Value::Type::UNDEFINED: throw JinjaError("tojson: an undefined value");
    case Value::Type::NONE: out += "null"; return;
    case Value::Type::BOOL: out += v.b ? "true" : "false"; return;
    case Value::Type::INT: out += std::to_string(v.i); return;
    case Value::Type::FLOAT:
      if (!std::isfinite(v.f)) out += std::isnan(v.f) ? "NaN" : v.f > 0 ? "Infinity" : "-Infinity";
      else out += float_text(v.f);
      return;
    case Value::Type::STRING: json_string(v.str(), out); return;
    case Value::Type::ARRAY:
      out += '[';
      for (size_t k = 0; k < v.a->size(); ++k) {
        if (k) out += ", ";
        json_value((*v.a)[k], out, depth + 1);
      }
      out += ']';
      return;
    case Value::Type::OBJECT:
    case Value::Type::NAMESPACE:
      out += '{';
      for (size_t k = 0; k < v.o->size(); ++k) {
        if (k) out += ", ";
        json_string((*v.o)[k].first, out);
        out += ": ";
        json_value((*v.o)[k].second, out, depth + 1);
      }
      out += '}';
      return;
    case Value::Type::MACRO: throw JinjaError("tojson: a macro");
  }
}

// Python's repr of a str: single quotes unless the text has one and no double quote.
std::string string_repr(const std::string& s) {
  const char q = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == q) out += std::string("\\") + char(q);
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  return out + q;
}

void repr_value(const Value& v, std::string& out, int depth) {
  if (depth > kMaxJsonDepth) throw JinjaError("nested too deeply to print");
  switch (v.type) {
    case Value::Type::STRING: out += string_repr(v.str()); return;
    case Value::Type::ARRAY:
      out += '[';
      for (size_t k = 0; k < v.a->size(); ++k) {
        if (k) out += ", ";
        repr_value((*v.a)[k], out, depth + 1);
      }
      out += ']';
      return;
    case Value::Type::OBJECT:
      out += '{';
      for (size_t k = 0; k < v.o->size(); ++k) {
        if (k) out += ", ";
        out += string_repr((*v.o)[k].first) + ": ";
        repr_value((*v.o)[k].second, out, depth + 1);
      }
      out += '}';
      return;
    default: out += to_text(v);
  }
}

}  // namespace

bool Value::truthy() const {
  switch (type) {
    case Type::UNDEFINED:
    case Type::NONE: return false;
    case Type::BOOL: return b;
    case Type::INT: return i != 0;
    case Type::FLOAT: return f != 0;
    case Type::STRING: return !s->empty();
    case Type::ARRAY: return !a->empty();
    case Type::OBJECT: return !o->empty();
    case Type::NAMESPACE:
    case Type::MACRO: return true;
  }
  return false;
}

const Value* Value::find(const std::string& key) const {
  if (!is_mapping()) return nullptr;
  for (const auto& [k, v] : *o)
    if (k == key) return &v;
  return nullptr;
}

Value from_json(const nlohmann::ordered_json& j, int depth) {
  if (depth > kMaxJsonDepth) throw JinjaError("the template's data nests too deeply");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      if (j.get<uint64_t>() > uint64_t(INT64_MAX)) return Value::real(double(j.get<uint64_t>()));
      return Value::integer(int64_t(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return Value::real(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      Array a;
      a.reserve(j.size());
      for (const auto& e : j) a.push_back(from_json(e, depth + 1));
      return Value::array(std::move(a));
    }
    case nlohmann::ordered_json::value_t::object: {
      Object o;
      o.reserve(j.size());
      for (const auto& [k, e] : j.items()) o.emplace_back(k, from_json(e, depth + 1));
      return Value::object(std::move(o));
    }
    default: return Value{};
  }
}

std::string to_text(const Value& v) {
  switch (v.type) {
    case Value::Type::UNDEFINED: return "";
    case Value::Type::NONE: return "None";
    case Value::Type::BOOL: return v.b ? "True" : "False";
    case Value::Type::INT: return std::to_string(v.i);
    case Value::Type::FLOAT: return float_text(v.f);
    case Value::Type::STRING: return v.str();
    case Value::Type::NAMESPACE: return "<Namespace>";
    case Value::Type::MACRO: return "<Macro>";
    default: return to_repr(v);
  }
}

std::string to_repr(const Value& v) {
  std::string out;
  repr_value(v, out, 0);
  return out;
}

std::string to_json(const Value& v) {
  std::string out;
  json_value(v, out, 0);
  return out;
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.type == Value::Type::INT && b.type == Value::Type::INT) return a.i == b.i;
    return (a.type == Value::Type::INT ? double(a.i) : a.f) == (b.type == Value::Type::INT ? double(b.i) : b.f);
  }
  if (a.type == Value::Type::BOOL && b.is_number()) return equal(Value::integer(a.b), b);
  if (b.type == Value::Type::BOOL && a.is_number()) return equal(a, Value::integer(b.b));
  if (a.type != b.type) return false;
  switch (a.type) {
    case Value::Type::UNDEFINED:
    case Value::Type::NONE: return true;
    case Value::Type::BOOL: return a.b == b.b;
    case Value::Type::STRING: return a.str() == b.str();
    case Value::Type::ARRAY:
      if (a.a->size() != b.a->size()) return false;
      for (size_t k = 0; k < a.a->size(); ++k)
        if (!equal((*a.a)[k], (*b.a)[k])) return false;
      return true;
    case Value::Type::OBJECT:
      if (a.o->size() != b.o->size()) return false;
      for (const auto& [k, v] : *a.o) {
        const Value* w = b.find(k);
        if (w == nullptr || !equal(v, *w)) return false;
      }
      return true;
    default: return a.o == b.o && a.m == b.m;
  }
}

const char* type_name(const Value& v) {
  switch (v.type) {
    case Value::Type::UNDEFINED: return "undefined";
    case Value::Type::NONE: return "NoneType";
    case Value::Type::BOOL: return "bool";
    case Value::Type::INT: return "int";
    case Value::Type::FLOAT: return "float";
    case Value::Type::STRING: return "str";
    case Value::Type::ARRAY: return "list";
    case Value::Type::OBJECT: return "dict";
    case Value::Type::NAMESPACE: return "Namespace";
    case Value::Type::MACRO: return "Macro";
  }
  return "?";
}

}  // namespace essaim::jinja
