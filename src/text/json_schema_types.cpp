// The JSON value kinds of the schema compiler (text/json_schema_compiler.h): objects, arrays, strings (and
// their formats), numbers, any value, and the reasoning prefix.
#include "text/json_schema_compiler.h"

namespace essaim::schema_grammar {
namespace {

constexpr std::string_view kThinkClose = "</think>";

}  // namespace

Seq Compiler::object(const ojson& s, const std::string& path, int depth) {
  static const ojson kNone = ojson::object();
  const ojson& props = s.contains("properties") ? s["properties"] : kNone;
  if (!props.is_object()) refuse("'properties' at " + path + " must be an object");
  std::set<std::string> required;
  if (s.contains("required")) {
    if (!s["required"].is_array()) refuse("'required' at " + path + " must be an array of names");
    for (const ojson& r : s["required"]) {
      if (!r.is_string()) refuse("'required' at " + path + " must be an array of names");
      required.insert(r.get<std::string>());
    }
  }
  // Extra members: absent additionalProperties generates none beside declared properties (valid, and what
  // a client means), and any member when nothing is declared.
  const ojson* add = s.contains("additionalProperties") ? &s["additionalProperties"] : nullptr;
  if (add && !add->is_boolean() && !add->is_object()) refuse("'additionalProperties' at " + path + " must be a boolean or a schema");
  const bool extra = add ? !(add->is_boolean() && !add->get<bool>()) : props.empty();
  const auto extra_value = [&] {
    return add && add->is_object() ? value(*add, path + "/additionalProperties", depth + 1) : any_value(kAnyJsonDepth);
  };
  std::vector<Seq> declared;
  std::vector<bool> is_required;
  std::set<std::string> names;
  const auto member = [&](const std::string& name, Seq v) {
    names.insert(name);
    declared.push_back(b_.seq({b_.literal(json_text(name)), ws(), b_.literal(":"), ws(), v, ws()}));
    is_required.push_back(required.count(name) > 0);
  };
  for (const auto& [name, sub] : props.items()) member(name, value(sub, path + "/properties/" + name, depth + 1));
  for (const std::string& name : required) {
    if (names.count(name)) continue;
    if (!extra) refuse("required property '" + name + "' at " + path + " is not in 'properties' and additionalProperties is false");
    member(name, extra_value());
  }
  std::optional<Seq> extra_member;
  if (extra)
    extra_member = b_.seq({key_not_in(names), ws(), b_.literal(":"), ws(), extra_value(), ws()});
  return b_.seq({b_.literal("{"), ws(), members(declared, is_required, extra_member), b_.literal("}")});
}

Seq Compiler::members(const std::vector<Seq>& declared, const std::vector<bool>& required, const std::optional<Seq>& extra) {
  const size_t n = declared.size();
  const Seq comma = b_.seq({b_.literal(","), ws()});
  // rest[i][first]: the members from i on; `first`: none written yet (no comma before the next).
  std::vector<std::array<uint32_t, 2>> rest(n + 1);
  if (extra) {
    const uint32_t more = b_.star(b_.seq({comma, *extra}));
    rest[n][0] = more;
    rest[n][1] = b_.rule({b_.seq({*extra, {b_.ref(more)}}), {}});
  } else {
    rest[n][0] = rest[n][1] = b_.rule({{}});
  }
  for (size_t i = n; i-- > 0;) {
    for (int first = 0; first < 2; ++first) {
      std::vector<Seq> alts = {b_.seq({first ? Seq{} : comma, declared[i], {b_.ref(rest[i + 1][0])}})};
      if (!required[i]) alts.push_back({b_.ref(rest[i + 1][first])});
      rest[i][first] = b_.rule(std::move(alts));
    }
  }
  return {b_.ref(rest[0][1])};
}

// A member name that is none of `names` and uses no escape (an escape could spell a declared name): where it
// leaves the trie of the names, anything may follow.
Seq Compiler::key_not_in(const std::set<std::string>& names) {
  const uint32_t free_char = string_char(CharKind::JSON_NO_ESCAPE);
  if (names.empty()) return b_.seq({b_.literal("\""), {b_.ref(b_.star({b_.ref(free_char)}))}, b_.literal("\"")});
  for (const std::string& n : names)
    for (char c : n)
      if (uint8_t(c) < 0x20 || uint8_t(c) >= 0x80 || c == '"' || c == '\\')
        refuse("additional properties beside a property named " + json_text(n) +
               " (non-ASCII or escaped characters) are not supported");
  const Seq tail = b_.seq({{b_.ref(b_.star({b_.ref(free_char)}))}, b_.literal("\"")});
  // One rule per prefix of the names, built from the longest prefixes up.
  std::map<std::string, uint32_t> at;
  std::set<std::string> prefixes;
  for (const std::string& n : names)
    for (size_t i = 0; i <= n.size(); ++i) prefixes.insert(n.substr(0, i));
  for (auto it = prefixes.rbegin(); it != prefixes.rend(); ++it) {
    const std::string& p = *it;
    std::vector<Seq> alts;
    if (!names.count(p)) alts.push_back(b_.literal("\""));
    ByteSet other;  // printable ASCII but quote, backslash and the bytes that continue a name
    for (unsigned c = 0x20; c < 0x7F; ++c) other.set(c);
    other.reset('"');
    other.reset('\\');
    for (const std::string& q : prefixes)
      if (q.size() == p.size() + 1 && q.starts_with(p)) {
        other.reset(uint8_t(q.back()));
        alts.push_back(b_.seq({b_.literal(q.substr(p.size())), {b_.ref(at.at(q))}}));
      }
    if (other.any()) alts.push_back(b_.seq({{b_.bytes(other)}, tail}));
    alts.push_back(b_.seq({{b_.ref(utf8_multibyte())}, tail}));
    at[p] = b_.rule(std::move(alts));
  }
  return b_.seq({b_.literal("\""), {b_.ref(at.at(""))}});
}

Seq Compiler::array(const ojson& s, const std::string& path, int depth) {
  int64_t max = bound(s, "maxItems", kSchemaMaxItems, path);
  const int64_t min = std::max<int64_t>(0, bound(s, "minItems", kSchemaMaxItems, path));
  Seq item;
  if (!s.contains("items") || s["items"] == true) item = any_value(kAnyJsonDepth);
  else if (s["items"] == false) max = 0;
  else if (s["items"].is_array()) refuse("'items' as an array (tuple validation) at " + path + " is not supported");
  else item = value(s["items"], path + "/items", depth + 1);
  if (max >= 0 && min > max) refuse("'minItems' over 'maxItems' at " + path + ": no array satisfies it");
  if (max == 0) return b_.seq({b_.literal("["), ws(), b_.literal("]")});
  const Seq one = b_.seq({item, ws()});
  const Seq more = {b_.ref(b_.repeat(b_.seq({b_.literal(","), ws(), one}), std::max<int64_t>(min - 1, 0),
                                     max < 0 ? -1 : max - 1))};
  Seq list = b_.seq({one, more});
  if (min == 0) list = {b_.ref(b_.optional(std::move(list)))};
  return b_.seq({b_.literal("["), ws(), list, b_.literal("]")});
}

Seq Compiler::string(const ojson& s, const std::string& path, CharKind kind) {
  const Seq quote = kind == CharKind::RAW ? Seq{} : b_.literal("\"");
  if (s.contains("format")) {
    if (s.contains("minLength") || s.contains("maxLength"))
      refuse("'format' beside 'minLength'/'maxLength' at " + path + " is not supported");
    if (!s["format"].is_string()) refuse("'format' at " + path + " must be a string");
    return b_.seq({quote, format(s["format"].get<std::string>(), path), quote});
  }
  const int64_t max = bound(s, "maxLength", kSchemaMaxLength, path);
  const int64_t min = std::max<int64_t>(0, bound(s, "minLength", kSchemaMaxLength, path));
  if (max >= 0 && min > max) refuse("'minLength' over 'maxLength' at " + path + ": no string satisfies it");
  return b_.seq({quote, {b_.ref(b_.repeat({b_.ref(string_char(kind))}, min, max))}, quote});
}

// One code point of a string: printable ASCII, a well-formed UTF-8 sequence, or (JSON) an escape — never a
// lone surrogate, which JSON parsers refuse. Length keywords count these, as JSON Schema counts code points.
uint32_t Compiler::string_char(CharKind kind) {
  std::optional<uint32_t>& cached = char_[size_t(kind)];
  if (cached) return *cached;
  ByteSet plain;
  for (unsigned c = 0x20; c < 0x7F; ++c) plain.set(c);
  std::vector<Seq> alts;
  if (kind == CharKind::RAW) {
    plain.reset('<');
    plain.set('\n');
    plain.set('\t');
  } else {
    plain.reset('"');
    plain.reset('\\');
  }
  alts.push_back({b_.bytes(plain)});
  alts.push_back({b_.ref(utf8_multibyte())});
  if (kind == CharKind::JSON) {
    ByteSet simple;
    for (char c : std::string_view("\"\\/bfnrt")) simple.set(uint8_t(c));
    ByteSet hex, hex_not_d, low;
    for (char c : std::string_view("0123456789abcdefABCDEF")) hex.set(uint8_t(c));
    hex_not_d = hex;
    hex_not_d.reset('d');
    hex_not_d.reset('D');
    for (char c : std::string_view("01234567")) low.set(uint8_t(c));
    const uint32_t unit = b_.rule({{b_.bytes(hex_not_d), b_.bytes(hex), b_.bytes(hex), b_.bytes(hex)},
                                   b_.seq({b_.literal("d"), {b_.bytes(low), b_.bytes(hex), b_.bytes(hex)}}),
                                   b_.seq({b_.literal("D"), {b_.bytes(low), b_.bytes(hex), b_.bytes(hex)}})});
    alts.push_back(b_.seq({b_.literal("\\"), {b_.bytes(simple)}}));
    alts.push_back(b_.seq({b_.literal("\\u"), {b_.ref(unit)}}));
  }
  cached = b_.rule(std::move(alts));
  return *cached;
}

// A well-formed UTF-8 sequence of two to four bytes (RFC 3629's table: no overlong form, no surrogate).
uint32_t Compiler::utf8_multibyte() {
  if (utf8_) return *utf8_;
  const GrammarElement tail = b_.bytes(0x80, 0xBF);
  utf8_ = b_.rule({{b_.bytes(0xC2, 0xDF), tail},
                   {b_.bytes(0xE0, 0xE0), b_.bytes(0xA0, 0xBF), tail},
                   {b_.bytes(0xE1, 0xEC), tail, tail},
                   {b_.bytes(0xED, 0xED), b_.bytes(0x80, 0x9F), tail},
                   {b_.bytes(0xEE, 0xEF), tail, tail},
                   {b_.bytes(0xF0, 0xF0), b_.bytes(0x90, 0xBF), tail, tail},
                   {b_.bytes(0xF1, 0xF3), tail, tail, tail},
                   {b_.bytes(0xF4, 0xF4), b_.bytes(0x80, 0x8F), tail, tail}});
  return *utf8_;
}

Seq Compiler::digits(int64_t min, int64_t max) { return {b_.ref(b_.repeat({b_.bytes('0', '9')}, min, max))}; }

// Bounded so that every number fits a double (and an integer an int64): 16 integer digits, 15 fraction
// digits, a two-digit exponent.
Seq Compiler::integer() {
  const uint32_t natural = b_.rule({b_.literal("0"), b_.seq({{b_.bytes('1', '9')}, digits(0, 15)})});
  return b_.seq({{b_.ref(b_.optional(b_.literal("-")))}, {b_.ref(natural)}});
}

Seq Compiler::number() {
  ByteSet e, sign;
  e.set('e');
  e.set('E');
  sign.set('+');
  sign.set('-');
  const uint32_t frac = b_.optional(b_.seq({b_.literal("."), digits(1, 15)}));
  const uint32_t exp = b_.optional(b_.seq({{b_.bytes(e)}, {b_.ref(b_.optional({b_.bytes(sign)}))}, digits(1, 2)}));
  return b_.seq({integer(), {b_.ref(frac), b_.ref(exp)}});
}

// The formats generated, each a subset of its RFC 3339 / RFC 4122 grammar that is always valid (a day of
// February goes up to 28).
Seq Compiler::format(const std::string& name, const std::string& path) {
  const auto two = [&](char a_lo, char a_hi, char b_lo, char b_hi) {
    return Seq{b_.bytes(uint8_t(a_lo), uint8_t(a_hi)), b_.bytes(uint8_t(b_lo), uint8_t(b_hi))};
  };
  const auto date = [&] {
    const uint32_t day31 = b_.rule({b_.seq({b_.literal("0"), {b_.bytes('1', '9')}}), two('1', '2', '0', '9'), two('3', '3', '0', '1')});
    const uint32_t day30 = b_.rule({b_.seq({b_.literal("0"), {b_.bytes('1', '9')}}), two('1', '2', '0', '9'), b_.literal("30")});
    const uint32_t day28 = b_.rule({b_.seq({b_.literal("0"), {b_.bytes('1', '9')}}), b_.seq({b_.literal("1"), {b_.bytes('0', '9')}}),
                                    b_.seq({b_.literal("2"), {b_.bytes('0', '8')}})});
    std::vector<Seq> months;
    for (const char* m : {"01", "03", "05", "07", "08", "10", "12"}) months.push_back(b_.seq({b_.literal(m), b_.literal("-"), {b_.ref(day31)}}));
    for (const char* m : {"04", "06", "09", "11"}) months.push_back(b_.seq({b_.literal(m), b_.literal("-"), {b_.ref(day30)}}));
    months.push_back(b_.seq({b_.literal("02-"), {b_.ref(day28)}}));
    return b_.seq({digits(4, 4), b_.literal("-"), {b_.ref(b_.rule(std::move(months)))}});
  };
  const auto time = [&] {
    const uint32_t hour = b_.rule({two('0', '1', '0', '9'), two('2', '2', '0', '3')});
    const Seq minute = two('0', '5', '0', '9');
    ByteSet sign;
    sign.set('+');
    sign.set('-');
    const uint32_t offset = b_.rule({b_.literal("Z"), b_.seq({{b_.bytes(sign), b_.ref(hour)}, b_.literal(":"), minute})});
    const uint32_t frac = b_.optional(b_.seq({b_.literal("."), digits(1, 6)}));
    return b_.seq({{b_.ref(hour)}, b_.literal(":"), minute, b_.literal(":"), minute, {b_.ref(frac), b_.ref(offset)}});
  };
  if (name == "date") return date();
  if (name == "time") return time();
  if (name == "date-time") return b_.seq({date(), b_.literal("T"), time()});
  if (name == "uuid") {
    ByteSet hex;
    for (char c : std::string_view("0123456789abcdefABCDEF")) hex.set(uint8_t(c));
    const auto run = [&](int n) { return Seq{b_.ref(b_.repeat({b_.bytes(hex)}, n, n))}; };
    return b_.seq({run(8), b_.literal("-"), run(4), b_.literal("-"), run(4), b_.literal("-"), run(4), b_.literal("-"), run(12)});
  }
  refuse("unsupported string format '" + name + "' at " + path + " (date, time, date-time and uuid are supported)");
}

Seq Compiler::any_value(int depth) {
  const auto it = any_.find(depth);
  if (it != any_.end()) return it->second;
  std::vector<Seq> alts = {string(ojson::object(), "#", CharKind::JSON), number(), b_.literal("true"),
                           b_.literal("false"), b_.literal("null")};
  if (depth > 0) {
    alts.push_back(any_object(depth - 1));
    alts.push_back(any_array(depth - 1));
  }
  Seq v = {b_.ref(b_.rule(std::move(alts)))};
  any_.emplace(depth, v);
  return v;
}

Seq Compiler::any_object(int depth) {
  const Seq member = b_.seq({key_not_in({}), ws(), b_.literal(":"), ws(), any_value(depth), ws()});
  return b_.seq({b_.literal("{"), ws(), members({}, {}, member), b_.literal("}")});
}

Seq Compiler::any_array(int depth) {
  const Seq one = b_.seq({any_value(depth), ws()});
  const uint32_t more = b_.star(b_.seq({b_.literal(","), ws(), one}));
  const uint32_t list = b_.optional(b_.seq({one, {b_.ref(more)}}));
  return b_.seq({b_.literal("["), ws(), {b_.ref(list)}, b_.literal("]")});
}

// An XML tool-call parameter the parser keeps as text (its schema has no type, or "string"): the text itself,
// without quotes or escapes, and without '<' (so "</parameter>" cannot come early).
Seq Compiler::raw_string_value(const ojson& s, const std::string& path) {
  for (const std::string& k : constraining(s))
    if (k != "type" && k != "enum" && k != "const" && k != "minLength" && k != "maxLength" && k != "format")
      refuse("'" + k + "' at " + path + " is not supported for a text parameter of this model's tool calls");
  if (s.contains("enum") || s.contains("const")) {
    const ojson values = s.contains("enum") ? s["enum"] : ojson::array({s["const"]});
    if (!values.is_array() || values.empty() || values.size() > kSchemaMaxEnum) refuse("'enum' at " + path + " must be a non-empty array");
    std::vector<Seq> alts;
    for (const ojson& v : values) {
      if (!v.is_string() || v.get<std::string>().find('<') != std::string::npos)
        refuse("'enum' at " + path + ": a text parameter's values must be strings without '<'");
      alts.push_back(b_.literal(v.get<std::string>()));
    }
    return {b_.ref(b_.rule(std::move(alts)))};
  }
  return string(s, path, CharKind::RAW);
}

// Reasoning text up to and including "</think>" (a matcher of the tag, as a DFA: one parse alive), then the
// blank the model writes before its answer.
Seq Compiler::think_prefix() {
  const size_t n = kThinkClose.size();
  std::vector<uint32_t> at(n);
  for (size_t k = 0; k < n; ++k) at[k] = b_.new_rule();
  for (size_t k = 0; k < n; ++k) {
    const uint8_t want = uint8_t(kThinkClose[k]);
    b_.add_alt(at[k], k + 1 == n ? Seq{b_.bytes(want, want)} : Seq{b_.bytes(want, want), b_.ref(at[k + 1])});
    ByteSet other;
    other.set();
    other.reset(want);
    if (want != '<') {
      other.reset('<');
      b_.add_alt(at[k], b_.seq({b_.literal("<"), {b_.ref(at[1])}}));
    }
    b_.add_alt(at[k], {b_.bytes(other), b_.ref(at[0])});
  }
  ByteSet blank;
  blank.set(' ');
  blank.set('\n');
  return {b_.ref(at[0]), b_.ref(b_.repeat({b_.bytes(blank)}, 0, 4))};
}

}  // namespace essaim::schema_grammar
