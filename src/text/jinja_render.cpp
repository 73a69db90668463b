// The renderer of text/jinja.h: walks the tree with a stack of scopes (a for loop's body and a macro call
// each get their own, as in Jinja2), evaluates expressions with Python's semantics, and counts every step
// and output byte against the limits.
#include <algorithm>
#include <cmath>
#include <map>

#include "text/jinja.h"
#include "text/jinja_ast.h"

namespace essaim::jinja {
namespace {

[[noreturn]] void fail(int line, const std::string& what) {
  throw JinjaError("template line " + std::to_string(line) + ": " + what);
}

constexpr std::string_view kPyWhitespace = " \t\n\r\v\f";

std::string strip_chars(std::string_view s, std::string_view chars, bool left, bool right) {
  size_t b = 0, e = s.size();
  if (left) while (b < e && chars.find(s[b]) != std::string_view::npos) ++b;
  if (right) while (e > b && chars.find(s[e - 1]) != std::string_view::npos) --e;
  return std::string(s.substr(b, e - b));
}

// Python's str.split(sep) / str.split() (runs of whitespace, no empty pieces).
Value split(const std::string& s, const Value* sep, int64_t maxsplit) {
  Array parts;
  if (sep == nullptr || sep->type == Value::Type::NONE) {
    size_t p = 0;
    while (p < s.size()) {
      while (p < s.size() && kPyWhitespace.find(s[p]) != std::string_view::npos) ++p;
      if (p >= s.size()) break;
      if (maxsplit >= 0 && int64_t(parts.size()) == maxsplit) {
        parts.push_back(Value::string(strip_chars(s.substr(p), kPyWhitespace, false, true)));
        break;
      }
      size_t e = p;
      while (e < s.size() && kPyWhitespace.find(s[e]) == std::string_view::npos) ++e;
      parts.push_back(Value::string(s.substr(p, e - p)));
      p = e;
    }
    return Value::array(std::move(parts));
  }
  if (!sep->is_string()) throw JinjaError("split: the separator must be a string");
  const std::string& d = sep->str();
  if (d.empty()) throw JinjaError("split: empty separator");
  size_t p = 0;
  for (;;) {
    const size_t q = s.find(d, p);
    if (q == std::string::npos || (maxsplit >= 0 && int64_t(parts.size()) == maxsplit)) break;
    parts.push_back(Value::string(s.substr(p, q - p)));
    p = q + d.size();
  }
  parts.push_back(Value::string(s.substr(p)));
  return Value::array(std::move(parts));
}

int64_t as_int(const Value& v, int line, const char* what) {
  if (v.type == Value::Type::INT) return v.i;
  if (v.type == Value::Type::BOOL) return v.b;
  fail(line, std::string(what) + " must be an integer, not " + type_name(v));
}

double as_real(const Value& v) { return v.type == Value::Type::INT ? double(v.i) : v.type == Value::Type::BOOL ? v.b : v.f; }

// The items a for loop or a filter walks: a list's elements, a dict's keys, a string's characters.
Array items_of(const Value& v, int line) {
  switch (v.type) {
    case Value::Type::ARRAY: return *v.a;
    case Value::Type::OBJECT: {
      Array keys;
      for (const auto& kv : *v.o) keys.push_back(Value::string(kv.first));
      return keys;
    }
    case Value::Type::STRING: {
      Array chars;
      for (char c : v.str()) chars.push_back(Value::string(std::string(1, c)));
      return chars;
    }
    case Value::Type::UNDEFINED: return {};  // Jinja2 iterates an undefined value as empty
    default: fail(line, std::string("'") + type_name(v) + "' object is not iterable");
  }
}

using Scope = std::map<std::string, Value>;

class Renderer {
 public:
  Renderer(const Limits& limits, Scope globals) : limits_(limits) { scopes_.push_back(std::move(globals)); }

  std::string run(const Node& root) {
    std::string out;
    render(root, out);
    return out;
  }

 private:
  void step(int line) {
    if (++steps_ > limits_.max_steps)
      fail(line, "the template ran past " + std::to_string(limits_.max_steps) + " steps");
  }
  // Every byte written anywhere (macro results included) counts, so nothing a template does grows past
  // the limit however its output is nested.
  void emit(std::string& out, std::string_view text, int line) {
    step(line);
    emitted_ += text.size();
    if (emitted_ > limits_.max_output_bytes)
      fail(line, "the template wrote more than " + std::to_string(limits_.max_output_bytes) + " bytes");
    out += text;
  }

  const Value* lookup(const std::string& name) const {
    for (size_t k = scopes_.size(); k-- > 0;) {
      const auto it = scopes_[k].find(name);
      if (it != scopes_[k].end()) return &it->second;
    }
    return nullptr;
  }

  void render(const Node& n, std::string& out) {
    switch (n.kind) {
      case Node::Kind::BODY:
        for (const auto& c : n.children) render(*c, out);
        return;
      case Node::Kind::TEXT: return emit(out, n.text, n.line);
      case Node::Kind::OUTPUT: return emit(out, to_text(eval(*n.exprs[0])), n.line);
      case Node::Kind::IF:
        for (size_t k = 0; k < n.exprs.size(); ++k)
          if (eval(*n.exprs[k]).truthy()) return render(*n.children[k], out);
        if (n.children.size() > n.exprs.size()) render(*n.children.back(), out);
        return;
      case Node::Kind::FOR: return render_for(n, out);
      case Node::Kind::SET: {
        Value v = eval(*n.exprs[0]);
        if (n.text.empty()) {
          scopes_.back()[n.names[0]] = std::move(v);
          return;
        }
        const Value* ns = lookup(n.names[0]);
        if (ns == nullptr || ns->type != Value::Type::NAMESPACE)
          fail(n.line, "'" + n.names[0] + "' is not a namespace: only namespace() attributes can be set");
        for (auto& kv : *ns->o)
          if (kv.first == n.text) return void(kv.second = std::move(v));
        ns->o->emplace_back(n.text, std::move(v));
        return;
      }
      case Node::Kind::MACRO: {
        auto m = std::make_shared<Macro>();
        m->node = &n;
        Value v;
        v.type = Value::Type::MACRO;
        v.m = std::move(m);
        scopes_.back()[n.text] = std::move(v);
        return;
      }
    }
  }

  void render_for(const Node& n, std::string& out) {
    const Array items = items_of(eval(*n.exprs[0]), n.line);
    if (items.empty()) {
      if (n.children.size() > 1) render(*n.children[1], out);
      return;
    }
    for (size_t k = 0; k < items.size(); ++k) {
      step(n.line);
      Scope frame;
      const Value& item = items[k];
      if (n.names.size() == 1) {
        frame[n.names[0]] = item;
      } else {
        if (item.type != Value::Type::ARRAY || item.a->size() != n.names.size())
          fail(n.line, "cannot unpack " + std::string(type_name(item)) + " into " + std::to_string(n.names.size()) + " names");
        for (size_t v = 0; v < n.names.size(); ++v) frame[n.names[v]] = (*item.a)[v];
      }
      const int64_t len = int64_t(items.size()), i = int64_t(k);
      Object loop = {{"index0", Value::integer(i)}, {"index", Value::integer(i + 1)},
                     {"revindex0", Value::integer(len - i - 1)}, {"revindex", Value::integer(len - i)},
                     {"first", Value::boolean(k == 0)}, {"last", Value::boolean(k + 1 == items.size())},
                     {"length", Value::integer(len)}};
      if (k > 0) loop.emplace_back("previtem", items[k - 1]);
      if (k + 1 < items.size()) loop.emplace_back("nextitem", items[k + 1]);
      frame["loop"] = Value::object(std::move(loop));
      scopes_.push_back(std::move(frame));
      render(*n.children[0], out);
      scopes_.pop_back();
    }
  }

  // ---- Expressions ----
  Value eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::LITERAL: return e.literal;
      case Expr::Kind::NAME: {
        const Value* v = lookup(e.name);
        return v ? *v : Value{};
      }
      case Expr::Kind::ATTR: return attribute(eval(*e.args[0]), e.name, e.line);
      case Expr::Kind::INDEX: return index(eval(*e.args[0]), eval(*e.args[1]), e.line);
      case Expr::Kind::SLICE: return slice(e);
      case Expr::Kind::CALL: return call(e);
      case Expr::Kind::FILTER: return filter(e);
      case Expr::Kind::TEST: return Value::boolean(test(e) != e.negate);
      case Expr::Kind::NOT: return Value::boolean(!eval(*e.args[0]).truthy());
      case Expr::Kind::NEG: {
        const Value v = eval(*e.args[0]);
        if (v.type == Value::Type::INT) return Value::integer(-v.i);
        if (v.type == Value::Type::FLOAT) return Value::real(-v.f);
        fail(e.line, std::string("bad operand for unary -: ") + type_name(v));
      }
      case Expr::Kind::AND: {
        Value l = eval(*e.args[0]);
        return l.truthy() ? eval(*e.args[1]) : l;
      }
      case Expr::Kind::OR: {
        Value l = eval(*e.args[0]);
        return l.truthy() ? l : eval(*e.args[1]);
      }
      case Expr::Kind::COND: return eval(*e.args[0]).truthy() ? eval(*e.args[1]) : eval(*e.args[2]);
      case Expr::Kind::BINARY: return binary(e.name, eval(*e.args[0]), eval(*e.args[1]), e.line);
      case Expr::Kind::LIST: {
        Array a;
        for (const auto& x : e.args) a.push_back(eval(*x));
        return Value::array(std::move(a));
      }
      case Expr::Kind::DICT: {
        Object o;
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          const Value key = eval(*e.args[k]);
          if (!key.is_string()) fail(e.line, "dict keys must be strings here");
          o.emplace_back(key.str(), eval(*e.args[k + 1]));
        }
        return Value::object(std::move(o));
      }
    }
    return Value{};
  }

  Value attribute(const Value& obj, const std::string& name, int line) {
    if (obj.type == Value::Type::UNDEFINED) fail(line, "cannot read '" + name + "' of an undefined value");
    if (obj.type == Value::Type::NONE) fail(line, "'None' has no attribute '" + name + "'");
    if (const Value* v = obj.find(name)) return *v;
    return Value{};
  }

  Value index(const Value& obj, const Value& key, int line) {
    if (obj.type == Value::Type::UNDEFINED) fail(line, "cannot index an undefined value");
    if (obj.type == Value::Type::ARRAY || obj.type == Value::Type::STRING) {
      if (key.type != Value::Type::INT) return Value{};
      const int64_t n = obj.type == Value::Type::ARRAY ? int64_t(obj.a->size()) : int64_t(obj.str().size());
      const int64_t i = key.i < 0 ? key.i + n : key.i;
      if (i < 0 || i >= n) return Value{};
      return obj.type == Value::Type::ARRAY ? (*obj.a)[size_t(i)] : Value::string(std::string(1, obj.str()[size_t(i)]));
    }
    if (key.is_string()) {
      if (const Value* v = obj.find(key.str())) return *v;
    }
    return Value{};
  }

  Value slice(const Expr& e) {
    const Value obj = eval(*e.args[0]);
    const bool list = obj.type == Value::Type::ARRAY;
    if (!list && !obj.is_string()) fail(e.line, std::string("cannot slice ") + type_name(obj));
    const int64_t n = list ? int64_t(obj.a->size()) : int64_t(obj.str().size());
    const auto part = [&](size_t k) -> std::optional<int64_t> {
      if (!e.args[k]) return std::nullopt;
      const Value v = eval(*e.args[k]);
      if (v.type == Value::Type::NONE) return std::nullopt;
      return as_int(v, e.line, "a slice bound");
    };
    const int64_t stride = part(3).value_or(1);
    if (stride == 0) fail(e.line, "slice step cannot be zero");
    const auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
      if (!v) return dflt;
      int64_t x = *v < 0 ? *v + n : *v;
      return stride > 0 ? std::clamp<int64_t>(x, 0, n) : std::clamp<int64_t>(x, -1, n - 1);
    };
    const int64_t start = clamp(part(1), stride > 0 ? 0 : n - 1), stop = clamp(part(2), stride > 0 ? n : -1);
    Array a;
    std::string s;
    for (int64_t k = start; stride > 0 ? k < stop : k > stop; k += stride) {
      step(e.line);
      if (list) a.push_back((*obj.a)[size_t(k)]);
      else s += obj.str()[size_t(k)];
    }
    return list ? Value::array(std::move(a)) : Value::string(std::move(s));
  }

  Value binary(const std::string& op, const Value& l, const Value& r, int line) {
    if (op == "~") return Value::string(to_text(l) + to_text(r));
    if (op == "==") return Value::boolean(equal(l, r));
    if (op == "!=") return Value::boolean(!equal(l, r));
    if (op == "in" || op == "not in") return Value::boolean(contains(r, l, line) == (op == "in"));
    const bool nums = l.is_number() && r.is_number();
    if (op == "+") {
      if (l.type == Value::Type::INT && r.type == Value::Type::INT) return Value::integer(l.i + r.i);
      if (nums) return Value::real(as_real(l) + as_real(r));
      if (l.is_string() && r.is_string()) {
        if (l.str().size() + r.str().size() > limits_.max_output_bytes) fail(line, "a string grew past the output limit");
        return Value::string(l.str() + r.str());
      }
      if (l.type == Value::Type::ARRAY && r.type == Value::Type::ARRAY) {
        Array a = *l.a;
        a.insert(a.end(), r.a->begin(), r.a->end());
        return Value::array(std::move(a));
      }
    } else if (op == "-" && nums) {
      if (l.type == Value::Type::INT && r.type == Value::Type::INT) return Value::integer(l.i - r.i);
      return Value::real(as_real(l) - as_real(r));
    } else if (op == "*" && nums) {
      if (l.type == Value::Type::INT && r.type == Value::Type::INT) return Value::integer(l.i * r.i);
      return Value::real(as_real(l) * as_real(r));
    } else if ((op == "/" || op == "//" || op == "%") && nums) {
      if (as_real(r) == 0) fail(line, "division by zero");
      if (op == "/") return Value::real(as_real(l) / as_real(r));
      if (l.type == Value::Type::INT && r.type == Value::Type::INT) {
        const int64_t q = l.i / r.i - ((l.i % r.i != 0) && ((l.i < 0) != (r.i < 0)));
        return op == "//" ? Value::integer(q) : Value::integer(l.i - q * r.i);
      }
      const double q = std::floor(as_real(l) / as_real(r));
      return op == "//" ? Value::real(q) : Value::real(as_real(l) - q * as_real(r));
    } else if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      int c = 0;
      if (nums) c = as_real(l) < as_real(r) ? -1 : as_real(l) > as_real(r) ? 1 : 0;
      else if (l.is_string() && r.is_string()) c = l.str().compare(r.str());
      else fail(line, "cannot compare " + std::string(type_name(l)) + " and " + type_name(r));
      return Value::boolean(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
    }
    fail(line, "unsupported operand types for " + op + ": " + type_name(l) + " and " + type_name(r));
  }

  bool contains(const Value& hay, const Value& needle, int line) {
    if (hay.is_string()) {
      if (!needle.is_string()) fail(line, "'in <string>' requires a string on the left");
      return hay.str().find(needle.str()) != std::string::npos;
    }
    if (hay.type == Value::Type::ARRAY) {
      for (const Value& v : *hay.a)
        if (equal(v, needle)) return true;
      return false;
    }
    if (hay.is_mapping()) return needle.is_string() && hay.find(needle.str()) != nullptr;
    fail(line, std::string("argument of type '") + type_name(hay) + "' is not iterable");
  }

  // ---- Calls: macros, globals, methods ----
  Value call(const Expr& e) {
    step(e.line);
    std::vector<Value> args;
    for (size_t k = 1; k < e.args.size(); ++k) args.push_back(eval(*e.args[k]));
    std::vector<std::pair<std::string, Value>> kwargs;
    for (const auto& [k, x] : e.kwargs) kwargs.emplace_back(k, eval(*x));
    const Expr& callee = *e.args[0];
    if (callee.kind == Expr::Kind::ATTR) {
      const Value obj = eval(*callee.args[0]);
      if (!obj.is_mapping() || obj.find(callee.name) == nullptr) return method(obj, callee.name, args, e.line);
    }
    if (callee.kind == Expr::Kind::NAME && lookup(callee.name) == nullptr) return global(callee.name, args, kwargs, e.line);
    const Value f = eval(callee);
    if (f.type != Value::Type::MACRO) fail(e.line, std::string("'") + type_name(f) + "' object is not callable");
    return call_macro(*f.m->node, args, kwargs, e.line);
  }

  Value global(const std::string& name, const std::vector<Value>& args,
               const std::vector<std::pair<std::string, Value>>& kwargs, int line) {
    if (name == "raise_exception") fail(line, "the template raised: " + (args.empty() ? std::string() : to_text(args[0])));
    if (name == "namespace") {
      Object o;
      for (const auto& [k, v] : kwargs) o.emplace_back(k, v);
      return Value::object(std::move(o), Value::Type::NAMESPACE);
    }
    if (name == "range") {
      if (args.empty() || args.size() > 3) fail(line, "range takes 1 to 3 arguments");
      const int64_t a = args.size() == 1 ? 0 : as_int(args[0], line, "range"), b = as_int(args[args.size() == 1 ? 0 : 1], line, "range");
      const int64_t s = args.size() == 3 ? as_int(args[2], line, "range") : 1;
      if (s == 0) fail(line, "range step cannot be zero");
      Array out;
      for (int64_t k = a; s > 0 ? k < b : k > b; k += s) {
        step(line);
        out.push_back(Value::integer(k));
      }
      return Value::array(std::move(out));
    }
    fail(line, "'" + name + "' is undefined (not a function this template engine knows)");
  }

  Value call_macro(const Node& m, const std::vector<Value>& args, const std::vector<std::pair<std::string, Value>>& kwargs,
                   int line) {
    if (depth_ >= limits_.max_call_depth) fail(line, "macro calls nested deeper than " + std::to_string(limits_.max_call_depth));
    if (args.size() > m.names.size()) fail(line, "macro '" + m.text + "' takes " + std::to_string(m.names.size()) + " arguments");
    Scope frame;
    for (size_t k = 0; k < m.names.size(); ++k) {
      if (k < args.size()) frame[m.names[k]] = args[k];
      else if (m.exprs[k]) frame[m.names[k]] = eval(*m.exprs[k]);
      else frame[m.names[k]] = Value{};
    }
    for (const auto& [k, v] : kwargs) {
      if (std::find(m.names.begin(), m.names.end(), k) == m.names.end())
        fail(line, "macro '" + m.text + "' has no parameter '" + k + "'");
      frame[k] = v;
    }
    // A macro sees its parameters and the template's top level (as it stands now), not its caller's loops.
    std::vector<Scope> saved;
    saved.swap(scopes_);
    scopes_.push_back(saved.front());
    scopes_.push_back(std::move(frame));
    ++depth_;
    std::string out;
    struct Restore {  // also on an error thrown through here
      Renderer& r;
      std::vector<Scope>& saved;
      ~Restore() {
        --r.depth_;
        r.scopes_.swap(saved);
      }
    } restore{*this, saved};
    render(*m.children[0], out);
    return Value::string(std::move(out));
  }

  Value method(const Value& obj, const std::string& name, const std::vector<Value>& args, int line) {
    const auto arg_str = [&](size_t k) -> const std::string& {
      if (k >= args.size() || !args[k].is_string()) fail(line, name + "() takes a string argument");
      return args[k].str();
    };
    if (obj.is_string()) {
      const std::string& s = obj.str();
      if (name == "startswith") return Value::boolean(s.starts_with(arg_str(0)));
      if (name == "endswith") return Value::boolean(s.ends_with(arg_str(0)));
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        const std::string_view chars = args.empty() || args[0].type == Value::Type::NONE ? kPyWhitespace : std::string_view(arg_str(0));
        return Value::string(strip_chars(s, chars, name != "rstrip", name != "lstrip"));
      }
      if (name == "split") return split(s, args.empty() ? nullptr : &args[0], args.size() > 1 ? as_int(args[1], line, "maxsplit") : -1);
      if (name == "lower" || name == "upper") {
        std::string t = s;
        for (char& c : t) c = char(name == "lower" ? std::tolower(static_cast<unsigned char>(c)) : std::toupper(static_cast<unsigned char>(c)));
        return Value::string(std::move(t));
      }
      if (name == "replace") return replace(s, arg_str(0), arg_str(1), line);
      if (name == "find") return Value::integer(int64_t(s.find(arg_str(0))));
      if (name == "join") return join(args.empty() ? Value{} : args[0], s, line);
    }
    if (obj.is_mapping()) {
      if (name == "items") return items_pairs(obj);
      if (name == "keys") return Value::array(items_of(obj, line));
      if (name == "values") {
        Array a;
        for (const auto& kv : *obj.o) a.push_back(kv.second);
        return Value::array(std::move(a));
      }
      if (name == "get") {
        const Value* v = obj.find(arg_str(0));
        return v ? *v : args.size() > 1 ? args[1] : Value::none();
      }
    }
    if (obj.type == Value::Type::UNDEFINED) fail(line, "cannot call '" + name + "' on an undefined value");
    fail(line, std::string("'") + type_name(obj) + "' object has no method '" + name + "'");
  }

  Value replace(const std::string& s, const std::string& from, const std::string& to, int line) {
    if (from.empty()) fail(line, "replace: an empty pattern is not supported");
    std::string out;
    size_t p = 0;
    for (size_t q; (q = s.find(from, p)) != std::string::npos; p = q + from.size()) {
      out += s.substr(p, q - p) + to;
      if (out.size() > limits_.max_output_bytes) fail(line, "a string grew past the output limit");
    }
    return Value::string(out + s.substr(p));
  }

  Value join(const Value& list, const std::string& sep, int line) {
    std::string out;
    const Array items = items_of(list, line);
    for (size_t k = 0; k < items.size(); ++k) {
      if (k) out += sep;
      out += to_text(items[k]);
      if (out.size() > limits_.max_output_bytes) fail(line, "a string grew past the output limit");
    }
    return Value::string(std::move(out));
  }

  static Value items_pairs(const Value& obj) {
    Array a;
    for (const auto& [k, v] : *obj.o) a.push_back(Value::array({Value::string(k), v}));
    return Value::array(std::move(a));
  }

  // ---- Filters and tests ----
  Value filter(const Expr& e) {
    step(e.line);
    const Value v = eval(*e.args[0]);
    std::vector<Value> args;
    for (size_t k = 1; k < e.args.size(); ++k) args.push_back(eval(*e.args[k]));
    const std::string& f = e.name;
    if (f == "safe") return v;
    if (f == "string") return Value::string(to_text(v));
    if (f == "trim") return Value::string(strip_chars(to_text(v), args.empty() ? kPyWhitespace : std::string_view(to_text(args[0])), true, true));
    if (f == "lower" || f == "upper") return method(Value::string(to_text(v)), f, {}, e.line);
    if (f == "length" || f == "count") {
      if (v.is_string()) return Value::integer(int64_t(v.str().size()));
      if (v.type == Value::Type::ARRAY) return Value::integer(int64_t(v.a->size()));
      if (v.is_mapping()) return Value::integer(int64_t(v.o->size()));
      fail(e.line, std::string("object of type '") + type_name(v) + "' has no len()");
    }
    if (f == "tojson") return Value::string(to_json(v));
    if (f == "items") {
      if (v.type == Value::Type::UNDEFINED) return Value::array({});
      if (!v.is_mapping()) fail(e.line, std::string("items: '") + type_name(v) + "' is not a mapping");
      return items_pairs(v);
    }
    if (f == "default" || f == "d") {
      const bool boolean = args.size() > 1 && args[1].truthy();
      if (boolean ? !v.truthy() : !v.defined()) return args.empty() ? Value::string("") : args[0];
      return v;
    }
    if (f == "first" || f == "last") {
      const Array items = items_of(v, e.line);
      if (items.empty()) return Value{};
      return f == "first" ? items.front() : items.back();
    }
    if (f == "list") return Value::array(items_of(v, e.line));
    if (f == "join") return join(v, args.empty() ? std::string() : to_text(args[0]), e.line);
    if (f == "replace") {
      if (args.size() < 2) fail(e.line, "replace takes two arguments");
      return replace(to_text(v), to_text(args[0]), to_text(args[1]), e.line);
    }
    if (f == "int") {
      if (v.type == Value::Type::FLOAT) return Value::integer(int64_t(v.f));
      if (v.type == Value::Type::INT) return v;
      return Value::integer(0);
    }
    fail(e.line, "unknown filter '" + f + "'");
  }

  bool test(const Expr& e) {
    const Value v = eval(*e.args[0]);
    const std::string& t = e.name;
    if (t == "defined") return v.defined();
    if (t == "undefined") return !v.defined();
    if (t == "none") return v.type == Value::Type::NONE;
    if (t == "string") return v.is_string();
    if (t == "number") return v.is_number();
    if (t == "integer") return v.type == Value::Type::INT;
    if (t == "float") return v.type == Value::Type::FLOAT;
    if (t == "boolean") return v.type == Value::Type::BOOL;
    if (t == "mapping") return v.is_mapping();
    if (t == "iterable") return v.is_string() || v.type == Value::Type::ARRAY || v.is_mapping();
    if (t == "sequence") return v.is_string() || v.type == Value::Type::ARRAY || v.is_mapping();
    if (t == "true") return v.type == Value::Type::BOOL && v.b;
    if (t == "false") return v.type == Value::Type::BOOL && !v.b;
    if (t == "callable") return v.type == Value::Type::MACRO;
    if (t == "even" || t == "odd") return (as_int(v, e.line, t.c_str()) % 2 == 0) == (t == "even");
    if (e.args.size() < 2) fail(e.line, "unknown test '" + t + "'");
    const Value other = eval(*e.args[1]);
    if (t == "eq" || t == "equalto" || t == "sameas") return equal(v, other);
    if (t == "in") return contains(other, v, e.line);
    fail(e.line, "unknown test '" + t + "'");
  }

  const Limits& limits_;
  std::vector<Scope> scopes_;
  uint64_t steps_ = 0;
  size_t emitted_ = 0;
  int depth_ = 0;
};

}  // namespace

Result<Template> Template::parse(std::string_view source, Limits limits) {
  if (source.size() > limits.max_template_bytes)
    return Status::error("the chat template is " + std::to_string(source.size()) + " bytes; at most " +
                         std::to_string(limits.max_template_bytes) + " are accepted");
  try {
    Template t;
    t.root_ = parse_template(source, limits.max_nesting);
    t.limits_ = limits;
    return t;
  } catch (const JinjaError& e) {
    return Status::error(std::string("chat template: ") + e.what());
  }
}

Result<std::string> Template::render(const nlohmann::ordered_json& context) const {
  if (!context.is_object()) return Status::error("chat template: the context must be a JSON object");
  try {
    Scope globals;
    for (const auto& [k, v] : context.items()) globals[k] = from_json(v);
    return Renderer(limits_, std::move(globals)).run(*root_);
  } catch (const JinjaError& e) {
    return Status::error(std::string("chat template: ") + e.what());
  }
}

}  // namespace essaim::jinja
