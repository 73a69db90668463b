// Internals of text/jinja.h: values (Python's data model, as far as templates see it), the expression and
// statement trees the parser builds, and the error both stages throw (caught at jinja.h's seam).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace essaim::jinja {

struct JinjaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Value;
using Array = std::vector<Value>;
using Object = std::vector<std::pair<std::string, Value>>;  // insertion order, as Python's dict
struct Macro;

struct Value {
  enum class Type : uint8_t { UNDEFINED, NONE, BOOL, INT, FLOAT, STRING, ARRAY, OBJECT, NAMESPACE, MACRO };
  Type type = Type::UNDEFINED;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::shared_ptr<const std::string> s;
  std::shared_ptr<const Array> a;
  std::shared_ptr<Object> o;  // OBJECT (shared, never mutated) or NAMESPACE (mutated by `set ns.x`)
  std::shared_ptr<const Macro> m;

  static Value of(Type t) {
    Value v;
    v.type = t;
    return v;
  }
  static Value none() { return of(Type::NONE); }
  static Value boolean(bool x) {
    Value v = of(Type::BOOL);
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v = of(Type::INT);
    v.i = x;
    return v;
  }
  static Value real(double x) {
    Value v = of(Type::FLOAT);
    v.f = x;
    return v;
  }
  static Value string(std::string x) {
    Value v = of(Type::STRING);
    v.s = std::make_shared<const std::string>(std::move(x));
    return v;
  }
  static Value array(Array x) {
    Value v = of(Type::ARRAY);
    v.a = std::make_shared<const Array>(std::move(x));
    return v;
  }
  static Value object(Object x, Type t = Type::OBJECT) {
    Value v = of(t);
    v.o = std::make_shared<Object>(std::move(x));
    return v;
  }

  bool defined() const { return type != Type::UNDEFINED; }
  bool is_string() const { return type == Type::STRING; }
  bool is_number() const { return type == Type::INT || type == Type::FLOAT; }
  bool is_mapping() const { return type == Type::OBJECT || type == Type::NAMESPACE; }
  const std::string& str() const { return *s; }
  bool truthy() const;
  const Value* find(const std::string& key) const;  // a mapping's entry, or nullptr
};

Value from_json(const nlohmann::ordered_json& j, int depth = 0);
std::string to_text(const Value& v);   // Python's str()
std::string to_repr(const Value& v);   // Python's repr()
std::string to_json(const Value& v);   // json.dumps(v, ensure_ascii=False)
bool equal(const Value& a, const Value& b);
const char* type_name(const Value& v);

struct Expr {
  enum class Kind : uint8_t {
    LITERAL, NAME, ATTR, INDEX, SLICE, CALL, FILTER, TEST, NOT, NEG, BINARY, AND, OR, COND, LIST, DICT
  };
  Kind kind = Kind::LITERAL;
  Value literal;
  std::string name;  // NAME, ATTR's attribute, FILTER/TEST's name, BINARY's operator
  bool negate = false;  // TEST: "is not"
  std::vector<std::unique_ptr<Expr>> args;  // operands; CALL: callee then positional; SLICE: obj, start, stop, step (may be null)
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> kwargs;  // CALL, FILTER
  int line = 0;
};

struct Node {
  enum class Kind : uint8_t { BODY, TEXT, OUTPUT, IF, FOR, SET, MACRO };
  Kind kind = Kind::BODY;
  std::string text;                       // TEXT; SET's attribute (ns.attr), MACRO's name
  std::vector<std::string> names;         // FOR's loop variables, SET's target, MACRO's parameters
  std::vector<std::unique_ptr<Expr>> exprs;  // OUTPUT: 1; IF: conditions; FOR: iterable; SET: value; MACRO: defaults (null: none)
  std::vector<std::unique_ptr<Node>> children;  // BODY: statements; IF: one body per condition (+ else); FOR: body (+ else); MACRO: body
  int line = 0;
};

struct Macro {
  const Node* node = nullptr;
};

std::unique_ptr<Node> parse_template(std::string_view source, int max_nesting);

}  // namespace essaim::jinja
