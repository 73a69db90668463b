// The HTTP API end to end against an in-process server on a port the OS chose: shapes of answers and
// stream chunks, every refusal with its OpenAI error object, the API key, the queue bound, and a client
// leaving mid-stream freeing its slot.
#include <gtest/gtest.h>

#include <future>
#include <sstream>
#include <string>
#include <vector>

#include "../text/json_schema_check.h"
#include "serve_test_util.h"

namespace essaim::serve::testing {
namespace {

const std::string kChat = R"({"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello there"}],"max_tokens":8,"temperature":0})";

class ServeHttp : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = start_server({.parallel = 4}).release(); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  uint16_t port() const { return server_->port(); }
  static Server* server_;
};
Server* ServeHttp::server_ = nullptr;

TEST_F(ServeHttp, HealthAndModels) {
  HttpResult h = http_call(port(), "GET", "/health");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(json::parse(h.body), json({{"status", "ok"}}));
  HttpResult m = http_call(port(), "GET", "/v1/models");
  ASSERT_EQ(m.status, 200) << m.body;
  const json j = json::parse(m.body);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["object"], "model");
  EXPECT_FALSE(j["data"][0]["id"].get<std::string>().empty());
}

TEST_F(ServeHttp, ChatCompletionShapeAndUsage) {
  HttpResult r = http_call(port(), "POST", "/v1/chat/completions", kChat);
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_TRUE(j["id"].get<std::string>().starts_with("chatcmpl-"));
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_TRUE(j["choices"][0]["message"]["content"].is_string());
  const std::string reason = j["choices"][0]["finish_reason"];
  EXPECT_TRUE(reason == "length" || reason == "stop") << reason;
  const json& u = j["usage"];
  EXPECT_GT(u["prompt_tokens"].get<int>(), 5);
  EXPECT_LE(u["completion_tokens"].get<int>(), 8);
  if (reason == "length") {
    EXPECT_EQ(u["completion_tokens"], 8);
  }
  EXPECT_EQ(u["total_tokens"].get<int>(), u["prompt_tokens"].get<int>() + u["completion_tokens"].get<int>());
}

TEST_F(ServeHttp, StreamingChunksMatchTheWholeAnswer) {
  const json whole = json::parse(http_call(port(), "POST", "/v1/chat/completions", kChat).body);
  json req = json::parse(kChat);
  req["stream"] = true;
  req["stream_options"] = {{"include_usage", true}};
  HttpResult r = http_call(port(), "POST", "/v1/chat/completions", req.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.headers["content-type"], "text/event-stream");
  const std::vector<std::string> events = sse_events(r.body);
  ASSERT_GE(events.size(), 4u) << r.body;
  EXPECT_EQ(events.back(), "[DONE]");
  const json first = json::parse(events[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  std::string finish;
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    const json c = json::parse(events[i]);
    EXPECT_EQ(c["id"], first["id"]);
    ASSERT_EQ(c["choices"].size(), 1u);
    if (c["choices"][0]["delta"].contains("content")) text += c["choices"][0]["delta"]["content"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  const json usage_chunk = json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage_chunk["choices"].empty());
  EXPECT_EQ(usage_chunk["usage"], whole["usage"]);
  EXPECT_EQ(text, whole["choices"][0]["message"]["content"]);  // greedy: the same tokens either way
  EXPECT_EQ(finish, whole["choices"][0]["finish_reason"]);
}

TEST_F(ServeHttp, CompletionAndStopString) {
  const std::string body = R"({"prompt":"Once upon a time","max_tokens":12,"temperature":0})";
  HttpResult r = http_call(port(), "POST", "/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "text_completion");
  const std::string text = j["choices"][0]["text"];
  ASSERT_GE(text.size(), 4u);
  // Stop at a piece of the greedy answer: the answer is what came before it, finish_reason "stop".
  const std::string stop = text.substr(2, 2);
  json req = json::parse(body);
  req["stop"] = json::array({stop, "never-appears"});
  const json s = json::parse(http_call(port(), "POST", "/v1/completions", req.dump()).body);
  EXPECT_EQ(s["choices"][0]["text"], text.substr(0, text.find(stop)));
  EXPECT_EQ(s["choices"][0]["finish_reason"], "stop");
  // Streaming gives the same cut.
  req["stream"] = true;
  HttpResult st = http_call(port(), "POST", "/v1/completions", req.dump());
  std::string streamed;
  for (const std::string& e : sse_events(st.body)) {
    if (e == "[DONE]") break;
    streamed += json::parse(e)["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(streamed, text.substr(0, text.find(stop)));
}

// ignore_eos (llama-server's): the answer runs to max_tokens, streamed or whole.
TEST_F(ServeHttp, IgnoreEosRunsToMaxTokens) {
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream);
    const json req = {{"prompt", "Once upon a time"}, {"max_tokens", 9}, {"ignore_eos", true}, {"stream", stream},
                      {"stream_options", {{"include_usage", true}}}, {"cache_prompt", false}};
    const HttpResult r = http_call(port(), "POST", "/v1/completions", req.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    json usage, finish;
    if (!stream) {
      const json j = json::parse(r.body);
      usage = j["usage"], finish = j["choices"][0]["finish_reason"];
    }
    for (const std::string& e : stream ? sse_events(r.body) : std::vector<std::string>{}) {
      if (e == "[DONE]") continue;
      const json c = json::parse(e);
      if (c.contains("usage")) usage = c["usage"];
      if (!c["choices"].empty() && !c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
    }
    EXPECT_EQ(usage["completion_tokens"], 9);
    EXPECT_EQ(finish, "length");
  }
}

// A list of prompts is one choice per prompt, each the answer that prompt gets alone; token ids are the
// same prompt as the text they encode; streamed, the chunks carry each choice's index.
TEST_F(ServeHttp, PromptListsAndTokenArraysAnswerAsSinglePrompts) {
  const auto text_of = [&](const std::string& body) {
    const HttpResult r = http_call(port(), "POST", "/v1/completions", body);
    EXPECT_EQ(r.status, 200) << r.body;
    return r.status == 200 ? json::parse(r.body) : json();
  };
  const json a = text_of(R"({"prompt":"Once upon","max_tokens":6,"temperature":0})");
  const json b = text_of(R"({"prompt":"The end","max_tokens":6,"temperature":0})");
  const json both = text_of(R"({"prompt":["Once upon","The end"],"max_tokens":6,"temperature":0})");
  ASSERT_EQ(both["choices"].size(), 2u);
  EXPECT_EQ(both["choices"][0]["index"], 0);
  EXPECT_EQ(both["choices"][0]["text"], a["choices"][0]["text"]);
  EXPECT_EQ(both["choices"][1]["index"], 1);
  EXPECT_EQ(both["choices"][1]["text"], b["choices"][0]["text"]);
  EXPECT_NE(a["choices"][0]["text"], b["choices"][0]["text"]);
  EXPECT_EQ(both["usage"]["completion_tokens"], 12);
  EXPECT_EQ(both["usage"]["prompt_tokens"], a["usage"]["prompt_tokens"].get<int>() + b["usage"]["prompt_tokens"].get<int>());

  std::string ids;
  for (TokenId t : server_->tokenizer()->encode("Once upon", /*parse_special=*/true))
    ids += (ids.empty() ? "" : ",") + std::to_string(t);
  const json by_ids = text_of(R"({"prompt":[)" + ids + R"(],"max_tokens":6,"temperature":0})");
  EXPECT_EQ(by_ids["choices"][0]["text"], a["choices"][0]["text"]);
  EXPECT_EQ(by_ids["usage"], a["usage"]);

  const HttpResult streamed = http_call(port(), "POST", "/v1/completions",
                                        R"({"prompt":["Once upon","The end"],"max_tokens":6,"temperature":0,"stream":true})");
  ASSERT_EQ(streamed.status, 200);
  std::string texts[2];
  int finishes = 0;
  for (const std::string& e : sse_events(streamed.body)) {
    if (e == "[DONE]") continue;
    const json c = json::parse(e)["choices"][0];
    texts[c["index"].get<int>()] += c["text"].get<std::string>();
    if (!c["finish_reason"].is_null()) ++finishes;
  }
  EXPECT_EQ(finishes, 2);
  EXPECT_EQ(texts[0], a["choices"][0]["text"]);
  EXPECT_EQ(texts[1], b["choices"][0]["text"]);
}

TEST_F(ServeHttp, BadRequestsGet400WithAnErrorObject) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"not json", "invalid_json"},
      {"[1,2]", "invalid_type"},
      {R"({"messages":[{"role":"user","content":"x"}],"bogus":1})", "unknown_parameter"},
      {R"({"messages":[{"role":"user","content":"x"}],"temperature":"hot"})", "invalid_type"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":-1})", "invalid_value"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":2.5})", "invalid_type"},
      {R"({"messages":[{"role":"wizard","content":"x"}]})", "invalid_value"},
      {R"({"messages":[]})", "invalid_value"},
      {R"({"max_tokens":3})", "missing_required_parameter"},
      {R"({"messages":[{"role":"user","content":"x"}],"stop":[1]})", "invalid_type"},
      {R"({"messages":[{"role":"user","content":"x"}],"top_p":1.5})", "invalid_value"},
      {R"({"messages":[{"role":"user","content":"x"}],"ignore_eos":1})", "invalid_type"},
      {std::string(100, '[') + std::string(100, ']'), "invalid_value"},
  };
  for (const auto& [body, code] : cases) {
    SCOPED_TRACE(body);
    expect_error_object(http_call(port(), "POST", "/v1/chat/completions", body), 400, code);
  }
  // A prompt longer than the context (512 tokens here).
  std::string longer;
  for (int i = 0; i < 400; ++i) longer += "lorem ipsum ";
  expect_error_object(http_call(port(), "POST", "/v1/completions", json({{"prompt", longer}}).dump()), 400,
                      "context_length_exceeded");
  expect_error_object(http_call(port(), "GET", "/v1/nothing"), 404, "not_found");
  expect_error_object(http_call(port(), "GET", "/v1/chat/completions"), 405, "method_not_allowed");
  // The server is still fine.
  EXPECT_EQ(http_call(port(), "POST", "/v1/chat/completions", kChat).status, 200);
}

// Structured output over HTTP: a json_schema answer (completion and chat, whole and streamed) is JSON that
// satisfies the schema; a keyword outside the subset is a 400 naming it, in a response_format or in the
// parameters of a tool that tool_choice asks for.
TEST_F(ServeHttp, StructuredOutput) {
  const json schema = json::parse(R"({"type":"object","properties":{"word":{"type":"string","maxLength":6},
      "n":{"type":"integer"},"ok":{"type":"boolean"}},"required":["word","ok"],"additionalProperties":false})");
  const json format = {{"type", "json_schema"}, {"json_schema", {{"name", "t"}, {"schema", schema}}}};
  const auto check = [&](const std::string& text) {
    const nlohmann::ordered_json v = nlohmann::ordered_json::parse(text, nullptr, false);
    ASSERT_FALSE(v.is_discarded()) << text;
    EXPECT_EQ(test::schema_check(v, nlohmann::ordered_json::parse(schema.dump())), "") << text;
  };
  HttpResult c = http_call(port(), "POST", "/v1/completions",
                           json({{"prompt", "Once"}, {"max_tokens", 200}, {"temperature", 0}, {"response_format", format}}).dump());
  ASSERT_EQ(c.status, 200) << c.body;
  EXPECT_EQ(json::parse(c.body)["choices"][0]["finish_reason"], "stop") << c.body;
  check(json::parse(c.body)["choices"][0]["text"]);
  const json chat = {{"messages", {{{"role", "user"}, {"content", "Hello"}}}}, {"max_tokens", 200}, {"temperature", 0.8},
                     {"seed", 3}, {"response_format", format}};
  HttpResult whole = http_call(port(), "POST", "/v1/chat/completions", chat.dump());
  ASSERT_EQ(whole.status, 200) << whole.body;
  const std::string content = json::parse(whole.body)["choices"][0]["message"]["content"];
  check(content);
  json streamed_chat = chat;
  streamed_chat["stream"] = true;
  HttpResult streamed = http_call(port(), "POST", "/v1/chat/completions", streamed_chat.dump());
  ASSERT_EQ(streamed.status, 200);
  std::string joined;
  std::istringstream lines(streamed.body);
  for (std::string line; std::getline(lines, line);) {
    if (!line.starts_with("data: {")) continue;
    const json chunk = json::parse(line.substr(6));
    if (!chunk["choices"].empty() && chunk["choices"][0]["delta"].contains("content")) joined += chunk["choices"][0]["delta"]["content"];
  }
  EXPECT_EQ(joined, content);
  const HttpResult pattern = http_call(port(), "POST", "/v1/chat/completions",
      R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"t",
          "schema":{"type":"object","properties":{"id":{"type":"string","pattern":"^a"}}}}}})");
  expect_error_object(pattern, 400, "unsupported_schema");
  EXPECT_NE(pattern.body.find("unsupported JSON Schema keyword 'pattern' at #/properties/id"), std::string::npos) << pattern.body;
  const HttpResult minimum = http_call(port(), "POST", "/v1/chat/completions",
      R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"required","tools":[{"type":"function","function":{"name":"f",
          "parameters":{"type":"object","properties":{"n":{"type":"integer","minimum":1}}}}}]})");
  expect_error_object(minimum, 400, "unsupported_schema");
  EXPECT_NE(minimum.body.find("'minimum' at tools[0].function.parameters/properties/n"), std::string::npos) << minimum.body;
}

TEST(ServeLimits, ApiKeyBodyLimitAndHeaders) {
  auto server = start_server({.parallel = 1, .api_key = "sesame", .max_body_bytes = 4096});
  ASSERT_TRUE(server);
  const uint16_t port = server->port();
  EXPECT_EQ(http_call(port, "GET", "/health").status, 200);  // no key needed
  expect_error_object(http_call(port, "GET", "/v1/models"), 401, "invalid_api_key");
  expect_error_object(http_call(port, "POST", "/v1/chat/completions", kChat, {{"Authorization", "Bearer wrong"}}), 401);
  expect_error_object(http_call(port, "GET", "/metrics", {}, {{"Authorization", "sesame"}}), 401);
  EXPECT_EQ(http_call(port, "POST", "/v1/chat/completions", kChat, {{"Authorization", "Bearer sesame"}}).status, 200);
  // 413 for a body over the limit, whatever it holds.
  const std::string big = R"({"prompt":")" + std::string(8000, 'a') + R"("})";
  expect_error_object(http_call(port, "POST", "/v1/completions", big, {{"Authorization", "Bearer sesame"}}), 413,
                      "request_too_large");
  // 431 for headers over 16 KiB.
  expect_error_object(http_call(port, "GET", "/health", {}, {{"X-Padding", std::string(20000, 'p')}}), 431,
                      "headers_too_large");
  EXPECT_EQ(http_call(port, "GET", "/health").status, 200);
}

TEST(ServeLimits, ConnectionCap) {
  auto server = start_server({.parallel = 1, .max_connections = 2});
  ASSERT_TRUE(server);
  // Two keep-alive connections (answered 404, then idle) hold both authenticated slots (--max-connections
  // counts authenticated connections): a third request that needs one is answered 503 and closed. A
  // /health probe needs none (its connection stays unauthenticated, evictable) and is still answered.
  OpenStream a(server->port(), "/v1/none", std::string());
  OpenStream b(server->port(), "/v1/none", std::string());
  ASSERT_TRUE(wait_until([&] { return server->api().metrics_text().find("essaim_serve_connections 2") != std::string::npos; }));
  expect_error_object(http_call(server->port(), "GET", "/v1/models"), 503, "too_many_connections");
  EXPECT_EQ(http_call(server->port(), "GET", "/health").status, 200);
}

// parallel 1, queue 1: one sequence in flight and one waiting fill the server; the next request gets 503 with
// Retry-After. Clients that leave free their sequences (active and queued) at the next step.
TEST(ServeScheduling, FullQueueThen503AndCancellationFreesTheSlot) {
  auto server = start_server({.parallel = 1, .queue_capacity = 1, .n_ctx = 4096, .delay_per_layer_call = 2ms});
  ASSERT_TRUE(server);
  const uint16_t port = server->port();
  const std::string long_stream = R"({"prompt":"Tell me a long story","max_tokens":3000,"temperature":0,"stream":true})";
  OpenStream first(port, "/v1/completions", long_stream);
  ASSERT_TRUE(first.read_events(2));
  EXPECT_EQ(first.status(), 200);
  EXPECT_EQ(server->scheduler()->stats().active, 1);
  OpenStream second(port, "/v1/completions", long_stream);
  ASSERT_TRUE(wait_until([&] { return server->scheduler()->stats().queued == 1; }));

  HttpResult refused = http_call(port, "POST", "/v1/completions", R"({"prompt":"Hi","max_tokens":2})");
  expect_error_object(refused, 503, "overloaded");
  EXPECT_EQ(refused.headers["retry-after"], "1");

  first.close();  // its sequence leaves at the next step; the waiting one takes the slot
  ASSERT_TRUE(wait_until([&] {
    const SchedulerStats s = server->scheduler()->stats();
    return s.finished[size_t(FinishReason::CANCELLED)] == 1 && s.active == 1 && s.queued == 0;
  }));
  second.close();
  ASSERT_TRUE(wait_until([&] {
    const SchedulerStats s = server->scheduler()->stats();
    return s.finished[size_t(FinishReason::CANCELLED)] == 2 && s.active == 0;
  }));
  const std::string metrics = server->api().metrics_text();
  EXPECT_NE(metrics.find("essaim_serve_sequences_finished_total{reason=\"cancelled\"} 2"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("essaim_serve_sequences_active 0"), std::string::npos);
  EXPECT_NE(metrics.find("essaim_serve_requests_total{outcome=\"overloaded\"} 1"), std::string::npos) << metrics;
  // The slot serves again.
  EXPECT_EQ(http_call(port, "POST", "/v1/completions", R"({"prompt":"Hi","max_tokens":2,"temperature":0})").status, 200);
}

TEST_F(ServeHttp, MetricsExposition) {
  ASSERT_EQ(http_call(port(), "POST", "/v1/chat/completions", kChat).status, 200);
  HttpResult m = http_call(port(), "GET", "/metrics");
  ASSERT_EQ(m.status, 200);
  EXPECT_TRUE(m.headers["content-type"].starts_with("text/plain"));
  for (const char* name : {"essaim_serve_requests_total{outcome=", "essaim_serve_prompt_tokens_total ",
                           "essaim_serve_generated_tokens_total ", "essaim_serve_generated_tokens_per_second ",
                           "essaim_serve_sequences_active ", "essaim_serve_sequences_queued ",
                           "essaim_serve_batch_rows_bucket{le=\"+Inf\"} ", "# TYPE essaim_serve_batch_rows histogram"}) {
    EXPECT_NE(m.body.find(name), std::string::npos) << name;
  }
  // Every sample line is "name[{labels}] value" with a number.
  std::istringstream lines(m.body);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    ASSERT_NE(space, std::string::npos) << line;
    const std::string value = line.substr(space + 1);
    char* end = nullptr;
    std::strtod(value.c_str(), &end);
    EXPECT_TRUE(*end == '\0' || value == "+Inf") << line;
  }
}

}  // namespace
}  // namespace essaim::serve::testing

namespace essaim::serve::testing {
namespace {

// /health says 503 while the model loads (here: while the executor factory waits for the test), 200 after;
// other endpoints answer 503 "loading" meanwhile.
TEST(ServeLoading, HealthIs503UntilLoaded) {
  auto release = std::make_shared<std::promise<void>>();
  std::shared_future<void> released = release->get_future().share();
  ServerOptions s;
  s.model_path = tiny_model_path();
  s.port = 0;
  s.threads = 1;
  s.executor.make = [released](const Model& m, ThreadPool* pool) -> Result<std::unique_ptr<ExpertExecutor>> {
    released.wait_for(60s);
    return std::unique_ptr<ExpertExecutor>(std::make_unique<LocalExpertExecutor>(m.expert_store(), pool));
  };
  Result<std::unique_ptr<Server>> server = Server::start(std::move(s));
  ASSERT_TRUE(server.is_ok()) << server.status().message();
  const uint16_t port = (*server)->port();
  const HttpResult loading = http_call(port, "GET", "/health");
  expect_error_object(loading, 503, "loading");
  EXPECT_EQ(loading.headers.count("retry-after"), 1u);
  expect_error_object(http_call(port, "POST", "/v1/completions", R"({"prompt":"x"})"), 503, "loading");
  release->set_value();
  ASSERT_TRUE((*server)->wait_ready(60s).is_ok());
  EXPECT_EQ(http_call(port, "GET", "/health").status, 200);
}

// An executor that fails every call: the step fails; the request gets a 500 error object (streaming: an error
// event, then the end of the stream); the server keeps serving.
class FailingExecutor final : public ExpertExecutor {
 public:
  Status compute(const ExpertBatch&, std::span<float>) override { return Status::error("injected: worker exploded"); }
};

TEST(ServeFailures, AFailedStepIsA500NotACrash) {
  ExecutorChoiceFn failing;
  failing.make = [](const Model&, ThreadPool*) -> Result<std::unique_ptr<ExpertExecutor>> {
    return std::unique_ptr<ExpertExecutor>(std::make_unique<FailingExecutor>());
  };
  auto server = start_server({.parallel = 2, .executor = failing});
  ASSERT_TRUE(server);
  const HttpResult r = http_call(server->port(), "POST", "/v1/completions", R"({"prompt":"Hi","max_tokens":4})");
  expect_error_object(r, 500, "generation_failed");
  EXPECT_NE(r.body.find("worker exploded"), std::string::npos) << r.body;
  const HttpResult s = http_call(server->port(), "POST", "/v1/chat/completions",
                                 R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":4,"stream":true})");
  // A stream fails as an error event when its head went out before the step failed, or as a plain 500 when
  // the step failed first (which comes first is up to the threads).
  if (s.status == 500) {
    expect_error_object(s, 500, "generation_failed");
  } else {
    EXPECT_EQ(s.status, 200) << s.body;
    const std::vector<std::string> events = sse_events(s.body);
    ASSERT_FALSE(events.empty()) << s.body;
    const json last = json::parse(events.back(), nullptr, false);
    ASSERT_TRUE(last.is_object() && last.contains("error")) << s.body;
    EXPECT_EQ(last["error"]["code"], "generation_failed");
  }
  EXPECT_EQ(http_call(server->port(), "GET", "/health").status, 200);
  EXPECT_EQ(server->api().outcome_count("error"), 2u);
}

}  // namespace
}  // namespace essaim::serve::testing
