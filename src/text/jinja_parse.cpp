// The parser of text/jinja.h: the source cut into text and tags (whitespace control applied as Jinja2 with
// trim_blocks and lstrip_blocks does), each tag's inside tokenised, statements nested into a tree by a
// recursive-descent parser with Jinja2's operator precedence.
#include <cctype>
#include <cstring>

#include "text/jinja_ast.h"

namespace essaim::jinja {
namespace {

[[noreturn]] void fail(int line, const std::string& what) {
  throw JinjaError("template line " + std::to_string(line) + ": " + what);
}

// ---- Segments: text, {{ expr }}, {% stmt %}, {# comment #} ----
struct Segment {
  enum class Kind : uint8_t { TEXT, EXPR, STMT, COMMENT } kind = Kind::TEXT;
  std::string body;
  bool strip_left = false, strip_right = false, keep_left = false;  // '-' inside the delimiters; '+': no lstrip_blocks
  int line = 1;
};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

Segment text_segment(std::string_view text, int line) {
  Segment s;
  s.body = std::string(text);
  s.line = line;
  return s;
}

std::vector<Segment> cut(std::string_view src) {
  std::vector<Segment> out;
  size_t pos = 0;
  int line = 1;
  const auto count_lines = [&](size_t from, size_t to) {
    for (size_t k = from; k < to; ++k) line += src[k] == '\n';
  };
  while (pos < src.size()) {
    size_t open = src.find('{', pos);
    while (open != std::string_view::npos && open + 1 < src.size() && std::strchr("{%#", src[open + 1]) == nullptr)
      open = src.find('{', open + 1);
    if (open == std::string_view::npos || open + 1 >= src.size()) {
      out.push_back(text_segment(src.substr(pos), line));
      break;
    }
    if (open > pos) out.push_back(text_segment(src.substr(pos, open - pos), line));
    count_lines(pos, open);
    const char type = src[open + 1];
    Segment seg;
    seg.kind = type == '{' ? Segment::Kind::EXPR : type == '%' ? Segment::Kind::STMT : Segment::Kind::COMMENT;
    seg.line = line;
    size_t p = open + 2;
    if (p < src.size() && src[p] == '-') seg.strip_left = true, ++p;
    else if (p < src.size() && src[p] == '+') seg.keep_left = true, ++p;
    const char close = type == '{' ? '}' : type;
    size_t end = std::string_view::npos;
    if (seg.kind == Segment::Kind::COMMENT) {
      end = src.find("#}", p);
    } else {  // the closing delimiter outside string literals
      char quote = 0;
      for (size_t k = p; k + 1 < src.size(); ++k) {
        if (quote) {
          if (src[k] == '\\') ++k;
          else if (src[k] == quote) quote = 0;
        } else if (src[k] == '\'' || src[k] == '"') {
          quote = src[k];
        } else if (src[k] == close && src[k + 1] == '}') {
          end = k;
          break;
        }
      }
    }
    if (end == std::string_view::npos) fail(line, std::string("unclosed '{") + type + "'");
    size_t body_end = end;
    if (body_end > p && src[body_end - 1] == '-') seg.strip_right = true, --body_end;
    seg.body = std::string(src.substr(p, body_end - p));
    count_lines(open, end + 2);
    pos = end + 2;
    out.push_back(std::move(seg));
  }
  return out;
}

// Jinja2's whitespace control: '-' strips all whitespace on that side; block tags and comments also take
// lstrip_blocks (spaces and tabs before them on their line) and trim_blocks (the first newline after them).
void apply_whitespace(std::vector<Segment>& segs) {
  // Whether a text starts a line: the template's first, or one whose previous tag ate a newline (Jinja2's
  // lexer decides lstrip_blocks on that, not on the text left after trimming).
  std::vector<bool> line_start(segs.size(), false);
  if (!segs.empty()) line_start[0] = true;
  for (size_t k = 0; k < segs.size(); ++k) {
    Segment& s = segs[k];
    if (s.kind == Segment::Kind::TEXT) continue;
    const bool block = s.kind != Segment::Kind::EXPR;
    if (k > 0 && segs[k - 1].kind == Segment::Kind::TEXT) {
      std::string& t = segs[k - 1].body;
      if (s.strip_left) {
        while (!t.empty() && is_space(t.back())) t.pop_back();
      } else if (block && !s.keep_left) {
        size_t e = t.size();
        while (e > 0 && (t[e - 1] == ' ' || t[e - 1] == '\t')) --e;
        if (e == 0 ? line_start[k - 1] : t[e - 1] == '\n') t.resize(e);
      }
    }
    if (k + 1 < segs.size() && segs[k + 1].kind == Segment::Kind::TEXT) {
      std::string& t = segs[k + 1].body;
      if (s.strip_right) {
        size_t b = 0;
        while (b < t.size() && is_space(t[b])) ++b;
        line_start[k + 1] = b > 0 && t[b - 1] == '\n';
        t.erase(0, b);
      } else if (block) {
        if (t.starts_with("\r\n")) t.erase(0, 2), line_start[k + 1] = true;
        else if (t.starts_with("\n")) t.erase(0, 1), line_start[k + 1] = true;
      }
    }
  }
}

// ---- Tokens inside a tag ----
struct Token {
  enum class Kind : uint8_t { NAME, STRING, INT, FLOAT, OP, END } kind = Kind::END;
  std::string text;
  int64_t i = 0;
  double f = 0;
};

std::vector<Token> tokenize(const std::string& s, int line) {
  std::vector<Token> out;
  size_t p = 0;
  while (p < s.size()) {
    const char c = s[p];
    if (is_space(c)) {
      ++p;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t e = p;
      while (e < s.size() && (std::isalnum(static_cast<unsigned char>(s[e])) || s[e] == '_')) ++e;
      out.push_back({.kind = Token::Kind::NAME, .text = s.substr(p, e - p)});
      p = e;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t e = p;
      while (e < s.size() && (std::isdigit(static_cast<unsigned char>(s[e])) || s[e] == '_')) ++e;
      const bool real = e + 1 < s.size() && s[e] == '.' && std::isdigit(static_cast<unsigned char>(s[e + 1]));
      if (real) {
        ++e;
        while (e < s.size() && std::isdigit(static_cast<unsigned char>(s[e]))) ++e;
      }
      std::string digits;
      for (size_t k = p; k < e; ++k)
        if (s[k] != '_') digits += s[k];
      Token t{.kind = real ? Token::Kind::FLOAT : Token::Kind::INT, .text = digits};
      if (real) t.f = std::strtod(digits.c_str(), nullptr);
      else if (digits.size() > 18) fail(line, "integer literal too large");
      else t.i = std::stoll(digits);
      out.push_back(std::move(t));
      p = e;
    } else if (c == '\'' || c == '"') {
      std::string v;
      size_t k = p + 1;
      for (; k < s.size() && s[k] != c; ++k) {
        if (s[k] != '\\' || k + 1 >= s.size()) {
          v += s[k];
          continue;
        }
        const char e = s[++k];
        switch (e) {
          case 'n': v += '\n'; break;
          case 't': v += '\t'; break;
          case 'r': v += '\r'; break;
          case '\\': v += '\\'; break;
          case '\'': v += '\''; break;
          case '"': v += '"'; break;
          case '0': v += '\0'; break;
          default: v += '\\'; v += e;  // Python keeps unknown escapes as written
        }
      }
      if (k >= s.size()) fail(line, "unterminated string literal");
      out.push_back({.kind = Token::Kind::STRING, .text = std::move(v)});
      p = k + 1;
    } else {
      static constexpr const char* kTwo[] = {"==", "!=", "<=", ">=", "//", "**"};
      std::string op(1, c);
      for (const char* two : kTwo)
        if (s.compare(p, 2, two) == 0) op = two;
      if (op.size() == 1 && std::strchr("+-*/%~<>()[]{}.,:|=", c) == nullptr)
        fail(line, std::string("unexpected character '") + c + "'");
      out.push_back({.kind = Token::Kind::OP, .text = op});
      p += op.size();
    }
  }
  out.push_back(Token{});
  return out;
}

// ---- Expressions ----
class ExprParser {
 public:
  ExprParser(std::vector<Token> tokens, int line, int max_nesting) : t_(std::move(tokens)), line_(line), max_(max_nesting) {}

  std::unique_ptr<Expr> expression() {
    Guard g(*this);
    auto e = or_expr();
    if (!is_name("if")) return e;
    ++p_;
    auto cond = or_expr();
    auto other = is_name("else") ? (++p_, expression()) : literal(Value{});
    auto n = node(Expr::Kind::COND);
    n->args.push_back(std::move(cond));
    n->args.push_back(std::move(e));
    n->args.push_back(std::move(other));
    return n;
  }
  bool at_end() const { return t_[p_].kind == Token::Kind::END; }
  bool is_name(const char* w) const { return t_[p_].kind == Token::Kind::NAME && t_[p_].text == w; }
  bool is_op(const char* o) const { return t_[p_].kind == Token::Kind::OP && t_[p_].text == o; }
  void expect_op(const char* o) {
    if (!is_op(o)) fail(line_, std::string("expected '") + o + "', got '" + t_[p_].text + "'");
    ++p_;
  }
  std::string name() {
    if (t_[p_].kind != Token::Kind::NAME) fail(line_, "expected a name, got '" + t_[p_].text + "'");
    return t_[p_++].text;
  }
  void expect_end() {
    if (!at_end()) fail(line_, "unexpected '" + t_[p_].text + "'");
  }

 private:
  struct Guard {  // bounds recursion on hostile input ("((((((...")
    explicit Guard(ExprParser& p) : p_(p) {
      if (++p_.depth_ > p_.max_) fail(p_.line_, "expression nested too deeply");
    }
    ~Guard() { --p_.depth_; }
    ExprParser& p_;
  };
  std::unique_ptr<Expr> node(Expr::Kind k) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line_;
    return e;
  }
  std::unique_ptr<Expr> literal(Value v) {
    auto e = node(Expr::Kind::LITERAL);
    e->literal = std::move(v);
    return e;
  }
  std::unique_ptr<Expr> binary(Expr::Kind k, std::string op, std::unique_ptr<Expr> l, std::unique_ptr<Expr> r) {
    auto e = node(k);
    e->name = std::move(op);
    e->args.push_back(std::move(l));
    e->args.push_back(std::move(r));
    return e;
  }
  std::unique_ptr<Expr> or_expr() {
    auto l = and_expr();
    while (is_name("or")) ++p_, l = binary(Expr::Kind::OR, "or", std::move(l), and_expr());
    return l;
  }
  std::unique_ptr<Expr> and_expr() {
    auto l = not_expr();
    while (is_name("and")) ++p_, l = binary(Expr::Kind::AND, "and", std::move(l), not_expr());
    return l;
  }
  std::unique_ptr<Expr> not_expr() {
    Guard g(*this);
    if (!is_name("not")) return compare();
    ++p_;
    auto e = node(Expr::Kind::NOT);
    e->args.push_back(not_expr());
    return e;
  }
  std::unique_ptr<Expr> compare() {
    auto l = math1();
    for (;;) {
      std::string op;
      if (is_op("==") || is_op("!=") || is_op("<") || is_op(">") || is_op("<=") || is_op(">=")) {
        op = t_[p_++].text;
      } else if (is_name("in")) {
        ++p_, op = "in";
      } else if (is_name("not") && t_[p_ + 1].kind == Token::Kind::NAME && t_[p_ + 1].text == "in") {
        p_ += 2, op = "not in";
      } else {
        return l;
      }
      l = binary(Expr::Kind::BINARY, op, std::move(l), math1());
    }
  }
  std::unique_ptr<Expr> math1() {
    auto l = concat();
    while (is_op("+") || is_op("-")) {
      std::string op = t_[p_++].text;
      l = binary(Expr::Kind::BINARY, op, std::move(l), concat());
    }
    return l;
  }
  std::unique_ptr<Expr> concat() {
    auto l = math2();
    while (is_op("~")) ++p_, l = binary(Expr::Kind::BINARY, "~", std::move(l), math2());
    return l;
  }
  std::unique_ptr<Expr> math2() {
    auto l = unary();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = t_[p_++].text;
      l = binary(Expr::Kind::BINARY, op, std::move(l), unary());
    }
    return l;
  }
  std::unique_ptr<Expr> unary() {
    Guard g(*this);
    if (is_op("-")) {
      ++p_;
      auto e = node(Expr::Kind::NEG);
      e->args.push_back(unary());
      return e;
    }
    if (is_op("+")) return ++p_, unary();
    return filters(postfix(primary()));
  }
  void call_args(Expr& e) {  // after '(' up to and including ')'
    while (!is_op(")")) {
      if (t_[p_].kind == Token::Kind::NAME && t_[p_ + 1].kind == Token::Kind::OP && t_[p_ + 1].text == "=") {
        std::string k = t_[p_].text;
        p_ += 2;
        e.kwargs.emplace_back(std::move(k), expression());
      } else {
        if (!e.kwargs.empty()) fail(line_, "a positional argument after a keyword argument");
        e.args.push_back(expression());
      }
      if (!is_op(",")) break;
      ++p_;
    }
    expect_op(")");
  }
  std::unique_ptr<Expr> postfix(std::unique_ptr<Expr> e) {
    for (;;) {
      if (is_op(".")) {
        ++p_;
        auto a = node(Expr::Kind::ATTR);
        a->name = t_[p_].kind == Token::Kind::INT ? t_[p_++].text : name();
        a->args.push_back(std::move(e));
        e = std::move(a);
      } else if (is_op("[")) {
        ++p_;
        e = subscript(std::move(e));
      } else if (is_op("(")) {
        ++p_;
        auto c = node(Expr::Kind::CALL);
        c->args.push_back(std::move(e));
        call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }
  std::unique_ptr<Expr> subscript(std::unique_ptr<Expr> obj) {
    std::unique_ptr<Expr> parts[3];
    int n = 0;
    bool slice = false;
    for (;;) {
      if (!is_op(":") && !is_op("]")) parts[n] = expression();
      if (is_op(":")) {
        slice = true;
        if (++n > 2) fail(line_, "too many ':' in a slice");
        ++p_;
        continue;
      }
      expect_op("]");
      break;
    }
    auto e = node(slice ? Expr::Kind::SLICE : Expr::Kind::INDEX);
    e->args.push_back(std::move(obj));
    if (!slice) {
      if (!parts[0]) fail(line_, "empty subscript");
      e->args.push_back(std::move(parts[0]));
    } else {
      for (auto& part : parts) e->args.push_back(std::move(part));
    }
    return e;
  }
  std::unique_ptr<Expr> filters(std::unique_ptr<Expr> e) {
    for (;;) {
      if (is_op("|")) {
        ++p_;
        auto f = node(Expr::Kind::FILTER);
        f->name = name();
        f->args.push_back(std::move(e));
        if (is_op("(")) ++p_, call_args(*f);
        e = std::move(f);
      } else if (is_name("is")) {
        ++p_;
        auto t = node(Expr::Kind::TEST);
        if (is_name("not")) ++p_, t->negate = true;
        t->name = name();
        t->args.push_back(std::move(e));
        if (is_op("(")) {
          ++p_;
          call_args(*t);
        } else if (t_[p_].kind == Token::Kind::STRING || t_[p_].kind == Token::Kind::INT ||
                   (t_[p_].kind == Token::Kind::NAME && !is_name("and") && !is_name("or") && !is_name("if") &&
                    !is_name("else") && !is_name("is") && !is_name("in") && !is_name("not"))) {
          t->args.push_back(primary());  // `x is divisibleby 3`, `x is sameas none`
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }
  std::unique_ptr<Expr> primary() {
    Guard g(*this);
    const Token& t = t_[p_];
    switch (t.kind) {
      case Token::Kind::STRING: {
        std::string s = t_[p_++].text;
        while (t_[p_].kind == Token::Kind::STRING) s += t_[p_++].text;  // adjacent literals concatenate
        return literal(Value::string(std::move(s)));
      }
      case Token::Kind::INT: return ++p_, literal(Value::integer(t.i));
      case Token::Kind::FLOAT: return ++p_, literal(Value::real(t.f));
      case Token::Kind::NAME: {
        ++p_;
        if (t.text == "true" || t.text == "True") return literal(Value::boolean(true));
        if (t.text == "false" || t.text == "False") return literal(Value::boolean(false));
        if (t.text == "none" || t.text == "None") return literal(Value::none());
        auto n = node(Expr::Kind::NAME);
        n->name = t.text;
        return n;
      }
      case Token::Kind::OP:
        if (t.text == "(") {
          ++p_;
          if (is_op(")")) return ++p_, node(Expr::Kind::LIST);  // () — an empty tuple
          auto e = expression();
          if (!is_op(",")) {
            expect_op(")");
            return e;
          }
          auto tuple = node(Expr::Kind::LIST);
          tuple->args.push_back(std::move(e));
          while (is_op(",") && (++p_, !is_op(")"))) tuple->args.push_back(expression());
          expect_op(")");
          return tuple;
        }
        if (t.text == "[") {
          ++p_;
          auto list = node(Expr::Kind::LIST);
          while (!is_op("]")) {
            list->args.push_back(expression());
            if (!is_op(",")) break;
            ++p_;
          }
          expect_op("]");
          return list;
        }
        if (t.text == "{") {
          ++p_;
          auto dict = node(Expr::Kind::DICT);
          while (!is_op("}")) {
            dict->args.push_back(expression());
            expect_op(":");
            dict->args.push_back(expression());
            if (!is_op(",")) break;
            ++p_;
          }
          expect_op("}");
          return dict;
        }
        break;
      case Token::Kind::END: fail(line_, "unexpected end of expression");
    }
    fail(line_, "unexpected '" + t.text + "'");
  }

  std::vector<Token> t_;
  size_t p_ = 0;
  int line_;
  int max_;
  int depth_ = 0;
};

// ---- Statements ----
class StmtParser {
 public:
  StmtParser(std::vector<Segment> segs, int max_nesting) : segs_(std::move(segs)), max_(max_nesting) {}

  std::unique_ptr<Node> parse_all() {
    auto body = block({});
    if (pos_ < segs_.size()) fail(segs_[pos_].line, "unexpected '" + keyword_of(segs_[pos_]) + "'");
    return body;
  }

 private:
  static std::string keyword_of(const Segment& s) {
    size_t b = 0;
    while (b < s.body.size() && is_space(s.body[b])) ++b;
    size_t e = b;
    while (e < s.body.size() && (std::isalnum(static_cast<unsigned char>(s.body[e])) || s.body[e] == '_')) ++e;
    return s.body.substr(b, e - b);
  }
  // Statements until one of `enders` (left unconsumed) or the end.
  std::unique_ptr<Node> block(const std::vector<std::string>& enders) {
    if (++depth_ > max_) fail(pos_ < segs_.size() ? segs_[pos_].line : 0, "blocks nested too deeply");
    auto body = std::make_unique<Node>();
    body->kind = Node::Kind::BODY;
    while (pos_ < segs_.size()) {
      const Segment& s = segs_[pos_];
      if (s.kind == Segment::Kind::COMMENT) {
        ++pos_;
      } else if (s.kind == Segment::Kind::TEXT) {
        if (!s.body.empty()) {
          auto t = std::make_unique<Node>();
          t->kind = Node::Kind::TEXT;
          t->text = s.body;
          t->line = s.line;
          body->children.push_back(std::move(t));
        }
        ++pos_;
      } else if (s.kind == Segment::Kind::EXPR) {
        ExprParser p(tokenize(s.body, s.line), s.line, max_);
        auto out = std::make_unique<Node>();
        out->kind = Node::Kind::OUTPUT;
        out->line = s.line;
        out->exprs.push_back(p.expression());
        p.expect_end();
        body->children.push_back(std::move(out));
        ++pos_;
      } else {
        const std::string kw = keyword_of(s);
        for (const std::string& e : enders)
          if (kw == e) {
            --depth_;
            return body;
          }
        body->children.push_back(statement(kw));
      }
    }
    if (!enders.empty()) fail(segs_.empty() ? 0 : segs_.back().line, "missing '{% " + enders.back() + " %}'");
    --depth_;
    return body;
  }
  ExprParser tag_parser(const Segment& s) {
    ExprParser p(tokenize(s.body, s.line), s.line, max_);
    p.name();  // the keyword
    return p;
  }
  void expect_tag(const char* kw) {
    if (pos_ >= segs_.size() || keyword_of(segs_[pos_]) != kw) fail(0, std::string("missing '{% ") + kw + " %}'");
    tag_parser(segs_[pos_]).expect_end();
    ++pos_;
  }
  std::unique_ptr<Node> statement(const std::string& kw) {
    const Segment& s = segs_[pos_];
    auto n = std::make_unique<Node>();
    n->line = s.line;
    ExprParser p = tag_parser(s);
    ++pos_;
    if (kw == "if") {
      n->kind = Node::Kind::IF;
      n->exprs.push_back(p.expression());
      p.expect_end();
      for (;;) {
        n->children.push_back(block({"elif", "else", "endif"}));
        const std::string next = keyword_of(segs_[pos_]);
        ExprParser q = tag_parser(segs_[pos_]);
        ++pos_;
        if (next == "endif") {
          q.expect_end();
          return n;
        }
        if (next == "else") {
          q.expect_end();
          n->children.push_back(block({"endif"}));
          expect_tag("endif");
          return n;
        }
        n->exprs.push_back(q.expression());
        q.expect_end();
      }
    }
    if (kw == "for") {
      n->kind = Node::Kind::FOR;
      n->names.push_back(p.name());
      while (p.is_op(",")) p.expect_op(","), n->names.push_back(p.name());
      if (!p.is_name("in")) fail(s.line, "expected 'in' in a for loop");
      p.name();
      n->exprs.push_back(p.expression());
      p.expect_end();
      n->children.push_back(block({"else", "endfor"}));
      if (keyword_of(segs_[pos_]) == "else") {
        ++pos_;
        n->children.push_back(block({"endfor"}));
      }
      expect_tag("endfor");
      return n;
    }
    if (kw == "set") {
      n->kind = Node::Kind::SET;
      n->names.push_back(p.name());
      if (p.is_op(".")) p.expect_op("."), n->text = p.name();
      if (!p.is_op("=")) fail(s.line, "only '{% set name = value %}' and '{% set ns.attr = value %}' are supported");
      p.expect_op("=");
      n->exprs.push_back(p.expression());
      p.expect_end();
      return n;
    }
    if (kw == "macro") {
      n->kind = Node::Kind::MACRO;
      n->text = p.name();
      p.expect_op("(");
      while (!p.is_op(")")) {
        n->names.push_back(p.name());
        n->exprs.push_back(p.is_op("=") ? (p.expect_op("="), p.expression()) : nullptr);
        if (!p.is_op(",")) break;
        p.expect_op(",");
      }
      p.expect_op(")");
      p.expect_end();
      n->children.push_back(block({"endmacro"}));
      expect_tag("endmacro");
      return n;
    }
    fail(s.line, "unsupported statement '{% " + kw + " %}'");
  }

  std::vector<Segment> segs_;
  size_t pos_ = 0;
  int max_;
  int depth_ = 0;
};

}  // namespace

std::unique_ptr<Node> parse_template(std::string_view source, int max_nesting) {
  std::vector<Segment> segs = cut(source);
  apply_whitespace(segs);
  return StmtParser(std::move(segs), max_nesting).parse_all();
}

}  // namespace essaim::jinja
