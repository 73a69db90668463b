// serve/chat_output.h on text: reasoning split from content (opened by the prompt or by the model), Qwen3's
// JSON and Qwen3.5's XML tool-call syntaxes parsed into calls validated against the tool's schema, anything
// malformed kept as content, and the same deltas whatever the chunking of the stream; then the real
// Generation (serve/generation.h) turning token events of such text into OpenAI's streamed chunks, which are
// reassembled here the way the openai client reassembles them.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "../text/json_schema_check.h"
#include "backbone_test_util.h"
#include "gguf/gguf_file.h"
#include "serve/chat_output.h"
#include "serve/generation.h"
#include "serve_test_util.h"
#include "text/json_schema_grammar.h"
#include "text/sampler.h"
#include "text/tokenizer.h"
#include "text/vocab.h"

namespace essaim::serve::testing {
namespace {

using ojson = nlohmann::ordered_json;

const ojson kTools = ojson::parse(R"([
  {"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
    "properties":{"city":{"type":"string"},"days":{"type":"integer"},"unit":{"type":"string","enum":["c","f"]}},
    "required":["city"],"additionalProperties":false}}},
  {"type":"function","function":{"name":"ping"}}])");

struct Split {
  std::string reasoning, content;
  std::vector<ToolCall> calls;
};

Split run(const std::string& text, bool in_reasoning, const ojson* tools, size_t chunk) {
  ChatOutputSplitter s({.in_reasoning = in_reasoning, .tools = tools});
  Split out;
  const auto take = [&](const std::vector<ChatDelta>& ds) {
    for (const ChatDelta& d : ds) {
      if (d.kind == ChatDelta::Kind::REASONING) out.reasoning += d.text;
      else if (d.kind == ChatDelta::Kind::CONTENT) out.content += d.text;
      else out.calls.push_back(d.call);
    }
  };
  for (size_t i = 0; i < text.size(); i += chunk) take(s.push(std::string_view(text).substr(i, chunk)));
  take(s.finish());
  return out;
}

// Every chunking gives the same split as the whole text at once.
Split run_all_chunkings(const std::string& text, bool in_reasoning, const ojson* tools = &kTools) {
  const Split whole = run(text, in_reasoning, tools, text.size() + 1);
  for (size_t chunk : {1, 2, 3, 5, 7}) {
    const Split s = run(text, in_reasoning, tools, chunk);
    EXPECT_EQ(s.reasoning, whole.reasoning) << "chunk " << chunk;
    EXPECT_EQ(s.content, whole.content) << "chunk " << chunk;
    EXPECT_EQ(s.calls.size(), whole.calls.size()) << "chunk " << chunk;
  }
  return whole;
}

TEST(ChatOutput, ReasoningSplitsFromContent) {
  Split s = run_all_chunkings("Let me think.\nStill thinking.\n</think>\n\nThe answer is 4.", true);
  EXPECT_EQ(s.reasoning, "Let me think.\nStill thinking.");
  EXPECT_EQ(s.content, "The answer is 4.");
  s = run_all_chunkings("<think>\nshort\n</think>\n\nhi", false);  // Qwen3: the model opens the block itself
  EXPECT_EQ(s.reasoning, "short");
  EXPECT_EQ(s.content, "hi");
  s = run_all_chunkings("cut off while thinking <", true);  // the length limit inside the reasoning
  EXPECT_EQ(s.reasoning, "cut off while thinking <");
  EXPECT_EQ(s.content, "");
}

TEST(ChatOutput, PlainTextIsContentUnchanged) {
  for (const std::string text : {std::string(" In the beginning <b>God</b>\n\n"), std::string("<thin"),
                                 std::string("a <tool_ b </think> c"), std::string("\n")}) {
    const Split s = run_all_chunkings(text, false);
    EXPECT_EQ(s.content, text);
    EXPECT_EQ(s.reasoning, "");
    EXPECT_TRUE(s.calls.empty());
  }
}

TEST(ChatOutput, Qwen3JsonAndQwen35XmlToolCallsParse) {
  Split s = run_all_chunkings(
      "<think>\nneed weather\n</think>\n\nChecking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"city\": \"Paris\", \"days\": 3}}\n</tool_call>\n<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>",
      false);
  EXPECT_EQ(s.reasoning, "need weather");
  EXPECT_EQ(s.content, "Checking.");
  ASSERT_EQ(s.calls.size(), 2u);
  EXPECT_EQ(s.calls[0].name, "get_weather");
  EXPECT_EQ(ojson::parse(s.calls[0].arguments), ojson::parse(R"({"city":"Paris","days":3})"));
  EXPECT_EQ(s.calls[1].index, 1u);
  EXPECT_EQ(s.calls[1].name, "ping");

  s = run_all_chunkings(
      "reasoning\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
      "<parameter=days>\n2\n</parameter>\n<parameter=unit>\nc\n</parameter>\n</function>\n</tool_call>",
      true);
  EXPECT_EQ(s.content, "");
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(ojson::parse(s.calls[0].arguments), ojson::parse(R"({"city":"New York","days":2,"unit":"c"})"));
  // A value that is not UTF-8 (found by fuzz_chat_output): the call stands, the bad bytes become U+FFFD.
  s = run_all_chunkings("<tool_call>\n<function=get_weather>\n<parameter=city>\nN\xff\xfeY\n</parameter>\n</function>\n</tool_call>", false);
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(ojson::parse(s.calls[0].arguments)["city"], "N\xef\xbf\xbd\xef\xbf\xbdY");
}

TEST(ChatOutput, CallsThatDoNotValidateStayContent) {
  const std::string bad[] = {
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"days\": 3}}\n</tool_call>",            // city required
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": 5}}\n</tool_call>",            // wrong type
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"a\", \"x\": 1}}\n</tool_call>",  // not a parameter
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"a\", \"unit\": \"k\"}}\n</tool_call>",  // enum
      "<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {}}\n</tool_call>",                              // not offered
      "<tool_call>\n{not json}\n</tool_call>",
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nx\n</function>\n</tool_call>",           // unterminated
      "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}",                                           // cut off
  };
  for (const std::string& text : bad) {
    const Split s = run_all_chunkings(text, false);
    EXPECT_TRUE(s.calls.empty()) << text;
    EXPECT_EQ(s.content, text);
  }
  // Without tools offered, the syntax is plain text.
  const std::string call = "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>";
  EXPECT_EQ(run_all_chunkings(call, false, nullptr).content, call);
  EXPECT_EQ(schema_violation(ojson::parse(R"({"a":[1,"x"]})"), ojson::parse(R"({"properties":{"a":{"items":{"type":"integer"}}}})")),
            "arguments.a[1] is not of type \"integer\"");
}

// A recording responder: what the HTTP layer would have written.
struct Recorder final : net::HttpResponder {
  std::string bytes;
  int status = 0;
  void reply(net::HttpReply r) override { status = r.status, bytes = r.body; }
  void stream_begin(net::HttpReply head) override { status = head.status; }
  void stream_write(std::string b) override { bytes += b; }
  void stream_write_then(std::string b, std::function<void()> written) override {
    bytes += b;
    written();
  }
  void stream_end() override {}
  void on_disconnect(std::function<void()>) override {}
};

// Token events of a tool-calling answer (the tiny model's own tokenizer) through Generation: the SSE chunks
// reassemble, by the openai client's rule (tool_calls[index]: id, name, then arguments appended), into the
// calls, and the whole answer says the same with finish_reason "tool_calls".
TEST(ChatOutput, GenerationStreamsToolCallsAsOpenAiDeltas) {
  const backbone::testing::SwarmModel& m = backbone::testing::SwarmModel::get({});
  Result<Vocab> v = vocab_from_gguf(m.model->file());
  ASSERT_TRUE(v);
  Result<Tokenizer> tok = Tokenizer::create(std::move(*v));
  ASSERT_TRUE(tok);
  const std::vector<TokenId> ids = tok->encode(
      "<think>\nok\n</think>\n\nSure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
      /*parse_special=*/true);
  for (bool stream : {true, false}) {
    auto rec = std::make_shared<Recorder>();
    auto logged = std::make_shared<LoggedResponder>(rec, "POST", "/v1/chat/completions", nullptr);
    auto g = std::make_shared<Generation>(GenerationSetup{
        .out = logged, .tokenizer = &*tok, .chat = true, .stream = stream, .include_usage = false, .id = "chatcmpl-7",
        .model = "m", .created = 1, .stop = {}, .n_choices = 1, .in_reasoning = false, .tools = kTools, .reasoning_budget = -1,
        .close_reasoning = {}, .count_outcome = [](const std::string&) {}, .settled = {}});
    g->begin();
    for (size_t i = 0; i < ids.size(); ++i)
      g->on_event(0, {.tokens = {ids[i]}, .done = false, .n_prompt = 5, .n_generated = int32_t(i + 1)});
    g->on_event(0, {.tokens = {}, .done = true, .reason = FinishReason::STOP, .n_prompt = 5, .n_generated = int32_t(ids.size())});
    ASSERT_EQ(rec->status, 200) << rec->bytes;
    ojson message;
    std::string finish;
    if (stream) {
      std::string content, reasoning;
      ojson calls = ojson::array();
      for (const std::string& e : sse_events(rec->bytes)) {
        if (e == "[DONE]") continue;
        const ojson c = ojson::parse(e)["choices"][0];
        if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
        const ojson& d = c["delta"];
        if (d.contains("content")) content += d["content"].get<std::string>();
        if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
        for (const ojson& t : d.value("tool_calls", ojson::array())) {
          const size_t i = t["index"];
          if (calls.size() <= i) calls.push_back({{"id", ""}, {"function", {{"name", ""}, {"arguments", ""}}}});
          if (t.contains("id")) calls[i]["id"] = t["id"];
          if (t.contains("function") && t["function"].contains("name")) calls[i]["function"]["name"] = t["function"]["name"];
          if (t.contains("function") && t["function"].contains("arguments"))
            calls[i]["function"]["arguments"] = calls[i]["function"]["arguments"].get<std::string>() + t["function"]["arguments"].get<std::string>();
        }
      }
      message = {{"content", content}, {"reasoning_content", reasoning}, {"tool_calls", calls}};
    } else {
      const ojson body = ojson::parse(rec->bytes);
      message = body["choices"][0]["message"];
      finish = body["choices"][0]["finish_reason"];
    }
    SCOPED_TRACE(stream ? "streamed" : "whole");
    EXPECT_EQ(finish, "tool_calls");
    EXPECT_EQ(message["content"], "Sure.");
    EXPECT_EQ(message["reasoning_content"], "ok");
    ASSERT_EQ(message["tool_calls"].size(), 1u);
    EXPECT_EQ(message["tool_calls"][0]["id"], "call_7_0");
    EXPECT_EQ(message["tool_calls"][0]["function"]["name"], "get_weather");
    EXPECT_EQ(ojson::parse(message["tool_calls"][0]["function"]["arguments"].get<std::string>()), ojson({{"city", "Paris"}}));
  }
}

}  // namespace
}  // namespace essaim::serve::testing

namespace essaim::serve::testing {
namespace {

// Tool calls decoded under tool_call_grammar (random logits over the trained vocabulary, sampled by the
// serving chain) are always calls the splitter accepts, in both syntaxes, after reasoning or not: nothing
// left in content, every call named, its arguments valid against the tool's schema (tests/text's checker).
TEST(ChatOutput, ConstrainedToolCallsAlwaysParse) {
  auto f = GgufFile::open(std::string(ESSAIM_SOURCE_DIR) + "/models/kjv-moe-q8_0.gguf");
  ASSERT_TRUE(f.is_ok());
  auto v = vocab_from_gguf(*f);
  ASSERT_TRUE(v.is_ok());
  const Tokenizer tok = std::move(Tokenizer::create(std::move(*v))).value();
  const TokenTrie trie(tok);
  std::set<std::string> texts;
  size_t n_calls = 0;
  for (ToolCallSyntax syntax : {ToolCallSyntax::JSON, ToolCallSyntax::XML}) {
    for (int i = 0; i < 60; ++i) {
      const bool in_reasoning = i % 3 == 0;
      const std::string only = i % 4 == 1 ? "ping" : "";
      auto g = tool_call_grammar(kTools, only, syntax, {.in_reasoning = in_reasoning, .limits = {}});
      ASSERT_TRUE(g.is_ok()) << g.status().message();
      GrammarMatcher m(*g);
      Sampler sampler({.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = uint32_t(i)});
      std::mt19937 rng{uint32_t(i)};
      std::normal_distribution<float> noise(0.0f, 2.0f);
      std::vector<float> logits(size_t(tok.n_vocab()));
      std::string text;
      bool ended = false;
      for (int step = 0; step < 3000 && !ended; ++step) {
        if (in_reasoning && step == 20) {  // as --reasoning-budget closes it: random bytes would rarely spell the tag
          ASSERT_TRUE(m.accept_bytes("\n</think>\n\n"));
          text += "\n</think>\n\n";
        }
        const TokenMask& mask = m.allowed(trie, tok.eog_ids());
        ASSERT_GT(mask.count(), 0u) << text;
        for (TokenId id = 0; id < tok.n_vocab(); ++id) {
          const std::string& p = trie.piece(id);
          logits[size_t(id)] = noise(rng) + (step >= 30 && (p.empty() || p.find_first_of("\"}<\n") != std::string::npos) ? 12.0f : 0.0f);
        }
        const TokenId id = sampler.sample(logits, mask.bits);
        ended = tok.is_eog(id);
        if (!ended) ASSERT_TRUE(m.accept_bytes(trie.piece(id)));
        if (!ended) text += trie.piece(id);
      }
      ASSERT_TRUE(ended) << text.substr(text.size() > 300 ? text.size() - 300 : 0);
      const Split s = run(text, in_reasoning, &kTools, 7);
      EXPECT_EQ(s.content, "") << text;
      ASSERT_GE(s.calls.size(), 1u) << text;
      if (!only.empty()) EXPECT_EQ(s.calls.size(), 1u) << text;
      for (const ToolCall& c : s.calls) {
        const ojson* tool = nullptr;
        for (const ojson& t : kTools) tool = t["function"]["name"] == c.name ? &t : tool;
        ASSERT_NE(tool, nullptr) << c.name;
        if (!only.empty()) EXPECT_EQ(c.name, only);
        const ojson args = ojson::parse(c.arguments);
        EXPECT_EQ(test::schema_check(args, tool->at("function").value("parameters", ojson::object())), "") << text;
      }
      n_calls += s.calls.size();
      texts.insert(text);
    }
  }
  EXPECT_GT(texts.size(), 80u);  // seeds gave different calls (a call of "ping" alone is the same text each time)
  EXPECT_GT(n_calls, 120u);       // "required" produced several calls at times
}

}  // namespace
}  // namespace essaim::serve::testing
