// text/jinja.h on small cases whose Jinja2 output is known (each checked by hand against Jinja2 3.1 with
// trim_blocks and lstrip_blocks), its errors (a line number and what went wrong), and its limits: a loop
// bomb, runaway recursion, huge output and deep nesting all end in an error, never a hang or a crash.
#include <gtest/gtest.h>

#include "text/jinja.h"

namespace essaim {
namespace {

using ojson = nlohmann::ordered_json;

std::string render(const std::string& src, const ojson& ctx = ojson::object(), jinja::Limits limits = {}) {
  Result<jinja::Template> t = jinja::Template::parse(src, limits);
  if (!t) return "PARSE ERROR: " + t.status().message();
  Result<std::string> r = t->render(ctx);
  return r ? *r : "ERROR: " + r.status().message();
}

TEST(Jinja, WhitespaceControlTrimAndLstripBlocks) {
  EXPECT_EQ(render("a  {{- 'b' -}}  c"), "abc");
  EXPECT_EQ(render("{% if true %}\nx\n{% endif %}\ny"), "x\ny");  // trim_blocks eats the newline after a tag
  EXPECT_EQ(render("    {% if true %}x{% endif %}"), "x");       // lstrip_blocks: indentation before a tag
  EXPECT_EQ(render("a\n  {% if true %}\n  b\n  {% endif %}\nc"), "a\n  b\nc");
  EXPECT_EQ(render("a {% if true %}b{% endif %}"), "a b");  // not at a line start: kept
  EXPECT_EQ(render("{# a comment #}\nx"), "x");
  EXPECT_EQ(render("  {%+ if true %}x{% endif %}"), "  x");
}

TEST(Jinja, ExpressionsAsPythonEvaluatesThem) {
  const ojson ctx = {{"m", {{"role", "user"}, {"content", "<think>\nr\n</think>\n\nA"}}},
                     {"xs", {1, 2, 3}},
                     {"d", {{"b", 1}, {"a", "x"}}}};
  EXPECT_EQ(render("{{ m.role }}{{ m['role'] }}", ctx), "useruser");
  EXPECT_EQ(render("{{ m.content.split('</think>')[-1].lstrip('\\n') }}", ctx), "A");
  EXPECT_EQ(render("{{ m.content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}", ctx), "r");
  EXPECT_EQ(render("{{ xs[::-1] }} {{ xs|length - 1 }} {{ xs[1:] }} {{ xs[-1] }}", ctx), "[3, 2, 1] 2 [2, 3] 3");
  EXPECT_EQ(render("{{ d|tojson }} {{ 'x' ~ 1 ~ none }}", ctx), "{\"b\": 1, \"a\": \"x\"} x1None");
  EXPECT_EQ(render("{{ 'yes' if 'a' in d else 'no' }} {{ 3 not in xs }} {{ not (1 == 1 and 2 > 3) }}", ctx),
            "yes False True");
  EXPECT_EQ(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ 1 / 2 }} {{ 2 * 3 + 1 }}"), "3 -4 1 0.5 7");
  EXPECT_EQ(render("{{ '  x  '|trim }}|{{ none|string }}|{{ undefined_thing }}|{{ missing|default('d') }}"), "x|None||d");
  EXPECT_EQ(render("{% for k, v in d|items %}{{ k }}={{ v }};{% endfor %}", ctx), "b=1;a=x;");
  EXPECT_EQ(render("{{ m is mapping }} {{ xs is iterable }} {{ m.nope is defined }} {{ m.role is string }} {{ none is none }}", ctx),
            "True True False True True");
  EXPECT_EQ(render("{{ {'a': [1, 'two', none, true, 1.5]}|tojson }}"), "{\"a\": [1, \"two\", null, true, 1.5]}");
  EXPECT_EQ(render("{{ 'é\"\\n'|tojson }}"), "\"é\\\"\\n\"");
}

TEST(Jinja, LoopsScopesNamespacesAndMacros) {
  EXPECT_EQ(render("{% for x in [1,2,3] %}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{% if loop.previtem %}<{{ loop.previtem }}{% endif %} {% endfor %}"),
            "0TrueFalse 1FalseFalse<1 2FalseTrue<2 ");
  // A `set` inside a loop stays in the loop (Jinja2's scoping); a namespace carries values out.
  EXPECT_EQ(render("{% set x = 1 %}{% set ns = namespace(n=0) %}{% for i in [1,2] %}{% set x = 5 %}{% set ns.n = ns.n + i %}{% endfor %}{{ x }} {{ ns.n }}"),
            "1 3");
  EXPECT_EQ(render("{% macro m(a, b='B') %}[{{ a }}{{ b }}]{% endmacro %}{{ m(1) }}{{ m(2, 'c') }}{{ m(3, b='d')|trim }}"),
            "[1B][2c][3d]");
  EXPECT_EQ(render("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% if false %}a{% elif 0 %}b{% elif 'x' %}c{% else %}d{% endif %}"), "c");
}

TEST(Jinja, ErrorsNameTheLineAndTheProblem) {
  EXPECT_NE(render("a\n{% if x %}b").find("line 2"), std::string::npos);
  EXPECT_NE(render("a\n{% if x %}b").find("endif"), std::string::npos);
  EXPECT_NE(render("{{ 1 + }}").find("PARSE ERROR"), std::string::npos);
  EXPECT_NE(render("{% include 'x' %}").find("unsupported statement"), std::string::npos);
  EXPECT_NE(render("{{ x|nosuchfilter }}").find("unknown filter 'nosuchfilter'"), std::string::npos);
  EXPECT_NE(render("\n\n{{ raise_exception('No user query') }}").find("line 3: the template raised: No user query"),
            std::string::npos);
  EXPECT_NE(render("{{ 'a' + 1 }}").find("unsupported operand types for +: str and int"), std::string::npos);
  EXPECT_NE(render("{{ a.b.c }}").find("undefined"), std::string::npos);
  EXPECT_NE(render("{{ 'unterminated }}").find("PARSE ERROR"), std::string::npos);
}

TEST(Jinja, LimitsEndRunawayTemplatesWithAnError) {
  jinja::Limits small;
  small.max_steps = 10'000;
  small.max_output_bytes = 4096;
  EXPECT_NE(render("{% for a in range(1000) %}{% for b in range(1000) %}x{% endfor %}{% endfor %}", ojson::object(), small).find("steps"),
            std::string::npos);
  EXPECT_NE(render("{% for a in range(100) %}{{ 'abcdefghij' * 10 }}{% endfor %}", ojson::object(), small).find("ERROR"), std::string::npos);
  EXPECT_NE(render("{% for a in range(3000) %}xx{% endfor %}", ojson::object(), small).find("4096 bytes"), std::string::npos);
  EXPECT_NE(render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").find("nested deeper than 32"), std::string::npos);
  EXPECT_NE(render("{{ " + std::string(500, '(') + "1" + std::string(500, ')') + " }}").find("nested too deeply"), std::string::npos);
  std::string deep;
  for (int k = 0; k < 100; ++k) deep += "{% if true %}";
  EXPECT_NE(render(deep).find("nested too deeply"), std::string::npos);
  jinja::Limits tiny;
  tiny.max_template_bytes = 16;
  EXPECT_NE(render(std::string(17, 'x'), ojson::object(), tiny).find("at most 16"), std::string::npos);
}

}  // namespace
}  // namespace essaim
