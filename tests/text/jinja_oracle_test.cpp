// text/jinja.h against Jinja2 itself (python3-jinja2, set up as Hugging Face's apply_chat_template sets it up:
// tests/text/jinja_oracle.py): the Qwen3 and Qwen3.5 chat templates (tests/text/data/templates, written from
// the public tokenizer_config.json files) and the trained model's own (read from models/kjv-moe-q4_k_m.gguf)
// render many seeded message lists — system, multi-turn, reasoning in content and in reasoning_content, tool
// definitions, assistant tool calls with object and string arguments, tool results, text-part arrays, and
// lists the templates refuse — and every rendering must equal Jinja2's byte for byte, every refusal be a
// refusal there too. Without python3-jinja2 the test skips, except under CI (tests/support/skip.h).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "gguf/gguf_file.h"
#include "skip.h"
#include "text/jinja.h"
#include "text/vocab.h"
#include "temp_dir.h"

namespace essaim {
namespace {

using ojson = nlohmann::ordered_json;

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

class Gen {
 public:
  explicit Gen(uint32_t seed) : rng_(seed) {}
  int pick(int n) { return int(rng_() % uint32_t(n)); }
  bool chance(int percent) { return pick(100) < percent; }

  std::string text() {
    static const char* kPieces[] = {"Hello", "  padded  ", "line one\nline two", "quote ' and \" and \\ slash",
                                    "unicode é 日本 🐝", "<think>\nsome reasoning\n</think>\n\nthe answer",
                                    "\n\nleading newlines", "trailing newlines\n\n", "{{ not a tag }} {% neither %}",
                                    "<tool_response>\nresult\n</tool_response>", "", "What is 2 + 2?", "\t tabs \t"};
    std::string s = kPieces[pick(std::size(kPieces))];
    if (chance(30)) s += std::string(" ") + kPieces[pick(std::size(kPieces))];
    return s;
  }
  ojson scalar() {
    switch (pick(6)) {
      case 0: return text();
      case 1: return pick(1000) - 500;
      case 2: return chance(50);
      case 3: return nullptr;
      case 4: return 0.5 * pick(20);
      default: return ojson::array({text(), pick(10)});
    }
  }
  ojson arguments() {
    ojson a = ojson::object();
    static const char* kNames[] = {"city", "unit", "query", "count", "options", "path"};
    const int n = pick(4);
    for (int k = 0; k < n; ++k) a[kNames[pick(std::size(kNames))]] = chance(20) ? ojson{{"nested", scalar()}} : scalar();
    return a;
  }
  ojson tool_call() {
    const ojson args = arguments();
    ojson f = {{"name", chance(50) ? "get_weather" : "search"}, {"arguments", chance(30) ? ojson(args.dump()) : args}};
    if (chance(15)) return f;  // a bare function object (both templates unwrap .function when present)
    return {{"id", "call_" + std::to_string(pick(1000))}, {"type", "function"}, {"function", f}};
  }
  ojson content() {
    if (chance(8)) return ojson::array({{{"type", "text"}, {"text", text()}}, {{"type", "text"}, {"text", text()}}});
    return text();
  }
  ojson message(const std::string& role) {
    ojson m = {{"role", role}};
    if (role == "assistant") {
      const bool calls = chance(35);
      m["content"] = calls && chance(40) ? ojson(nullptr) : content();
      if (chance(25)) m["reasoning_content"] = chance(80) ? ojson(text()) : ojson(nullptr);
      if (calls) {
        ojson list = ojson::array();
        for (int k = 0, n = 1 + pick(2); k < n; ++k) list.push_back(tool_call());
        m["tool_calls"] = list;
      }
    } else {
      m["content"] = content();
      if (role == "tool" && chance(70)) m["tool_call_id"] = "call_" + std::to_string(pick(1000));
    }
    return m;
  }
  ojson messages() {
    ojson list = ojson::array();
    if (chance(60)) list.push_back(message("system"));
    const int turns = 1 + pick(4);
    for (int t = 0; t < turns; ++t) {
      list.push_back(message(chance(95) ? "user" : "system"));
      if (t + 1 == turns && chance(40)) break;  // ends on the user's turn: the usual request
      list.push_back(message("assistant"));
      if (list.back().contains("tool_calls")) {
        for (int k = 0, n = 1 + pick(2); k < n; ++k) list.push_back(message("tool"));
        if (chance(70)) list.push_back(message("assistant"));
      }
    }
    if (chance(3)) list = ojson::array();
    return list;
  }
  ojson tools() {
    ojson list = ojson::array();
    for (const char* name : {"get_weather", "search"}) {
      if (!chance(70)) continue;
      list.push_back({{"type", "function"},
                      {"function", {{"name", name},
                                    {"description", text()},
                                    {"parameters", {{"type", "object"},
                                                    {"properties", {{"city", {{"type", "string"}, {"description", "a <city> & \"name\""}}},
                                                                    {"count", {{"type", "integer"}}}}},
                                                    {"required", ojson::array({"city"})}}}}}});
    }
    return list;
  }
  ojson context() {
    ojson c = {{"messages", messages()}};
    if (chance(40)) c["tools"] = tools();
    else if (chance(10)) c["tools"] = nullptr;
    c["add_generation_prompt"] = chance(80);
    const int thinking = pick(3);
    if (thinking < 2) c["enable_thinking"] = thinking == 1;
    return c;
  }

 private:
  std::mt19937 rng_;
};

struct Case {
  std::string name;
  std::string source;
};

std::vector<Case> templates() {
  const std::string dir = std::string(ESSAIM_SOURCE_DIR) + "/tests/text/data/templates/";
  std::vector<Case> out = {{"qwen3", read_file(dir + "qwen3.jinja")}, {"qwen35", read_file(dir + "qwen35.jinja")}};
  Result<GgufFile> f = GgufFile::open(std::string(ESSAIM_SOURCE_DIR) + "/models/kjv-moe-q4_k_m.gguf");
  EXPECT_TRUE(f) << f.status().message();
  if (f) {
    Result<Vocab> v = vocab_from_gguf(*f);
    EXPECT_TRUE(v) << v.status().message();
    if (v) out.push_back({"kjv-moe (from the GGUF)", v->chat_template});
  }
  for (const Case& c : out) EXPECT_GT(c.source.size(), 100u) << c.name;
  return out;
}

bool have_jinja2() { return std::system("/usr/bin/python3 -c 'import jinja2' > /dev/null 2>&1") == 0; }

TEST(JinjaOracle, QwenAndTrainedTemplatesRenderAsJinja2Does) {
  if (!have_jinja2())
    ESSAIM_SKIP_MISSING_DEP(test_support::Dep::PYTHON_JINJA2, "/usr/bin/python3 cannot import jinja2");
  const std::vector<Case> tmpl = templates();
  constexpr int kPerTemplate = 400;
  ojson cases = ojson::array();
  Gen gen(20261206);
  for (const Case& t : tmpl)
    for (int k = 0; k < kPerTemplate; ++k) cases.push_back({{"template", t.source}, {"context", gen.context()}});
  const std::string dir = essaim::testing::make_temp_dir("jinja-oracle");
  std::ofstream(dir + "/cases.json") << cases.dump();
  const std::string cmd = "/usr/bin/python3 '" + std::string(ESSAIM_SOURCE_DIR) + "/tests/text/jinja_oracle.py' '" + dir +
                          "/cases.json' '" + dir + "/out.json' 2> '" + dir + "/err.txt'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(dir + "/err.txt");
  const ojson want = ojson::parse(read_file(dir + "/out.json"));
  ASSERT_EQ(want.size(), cases.size());
  std::filesystem::remove_all(dir);

  std::map<std::string, jinja::Template> parsed;
  for (const Case& t : tmpl) {
    Result<jinja::Template> p = jinja::Template::parse(t.source);
    ASSERT_TRUE(p) << t.name << ": " << p.status().message();
    parsed.emplace(t.source, std::move(*p));
  }
  size_t ok = 0, refused = 0, with_calls = 0;
  std::set<std::string> distinct;
  for (size_t k = 0; k < cases.size(); ++k) {
    const ojson& c = cases[k];
    const Result<std::string> got = parsed.at(c["template"].get<std::string>()).render(c["context"]);
    const std::string what = tmpl[k / kPerTemplate].name + " case " + std::to_string(k % kPerTemplate) + ": " + c["context"].dump();
    if (!want[k]["ok"].get<bool>()) {
      ++refused;
      EXPECT_FALSE(got) << what << "\nJinja2 refused it (" << want[k]["error"] << ") but we rendered:\n" << (got ? *got : "");
      continue;
    }
    ASSERT_TRUE(got) << what << "\n" << got.status().message();
    EXPECT_EQ(*got, want[k]["text"].get<std::string>()) << what;
    ++ok;
    distinct.insert(*got);
    with_calls += got->find("<tool_call>") != std::string::npos;
  }
  // The inputs vary and reach what they are meant to reach.
  EXPECT_GT(ok, cases.size() / 2);
  EXPECT_GT(refused, 10u);
  EXPECT_GT(with_calls, 50u);
  EXPECT_GT(distinct.size(), ok * 9 / 10);
  std::printf("jinja oracle: %zu renderings equal to Jinja2's, %zu refused by both, %zu with tool calls\n", ok, refused,
              with_calls);
}

}  // namespace
}  // namespace essaim
