// Hostile input to the serve layer: the request parser on malformed, mistyped, oversized and deeply nested
// bodies; the HTTP listener on garbage, truncated and slow requests and absurd lengths. Every case gets an
// error value (an OpenAI error object where there is an answer) and the server keeps serving.
#include <gtest/gtest.h>

#include <boost/asio.hpp>
#include <cstdio>
#include <map>

#include "process_memory.h"
#include "net/http_limits.h"
#include "serve/api_request.h"
#include "net/metrics_text.h"
#include "serve/stop_strings.h"
#include "serve_test_util.h"

namespace essaim::serve::testing {
namespace {

ApiError parse_error(ApiEndpoint e, const std::string& body) {
  ApiParse p = parse_api_request(e, body);
  EXPECT_FALSE(p.request.has_value()) << body;
  return p.error.value_or(ApiError{.status = 0});
}

// /v1/completions' four prompt shapes: a string, strings, token ids, lists of token ids (one choice each).
TEST(ServeRequestParser, AcceptsEveryOpenAiPromptShape) {
  const auto prompts = [](const std::string& body) {
    ApiParse p = parse_api_request(ApiEndpoint::COMPLETION, body);
    EXPECT_TRUE(p.request.has_value()) << body << (p.error ? p.error->message : "");
    return p.request ? p.request->prompts : std::vector<PromptInput>{};
  };
  std::vector<PromptInput> p = prompts(R"({"prompt":"a"})");
  ASSERT_EQ(p.size(), 1u);
  EXPECT_FALSE(p[0].is_tokens);
  EXPECT_EQ(p[0].text, "a");
  p = prompts(R"({"prompt":["a","b",[7,8]]})");
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[1].text, "b");
  EXPECT_TRUE(p[2].is_tokens);
  EXPECT_EQ(p[2].tokens, (std::vector<int32_t>{7, 8}));
  p = prompts(R"({"prompt":[1,2,3]})");
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].tokens, (std::vector<int32_t>{1, 2, 3}));
  p = prompts(R"({"prompt":[[1],[2,3]]})");
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[1].tokens, (std::vector<int32_t>{2, 3}));
  std::string many;  // one prompt more than kMaxPrompts
  for (size_t i = 0; i <= kMaxPrompts; ++i) many += std::string(i ? "," : "") + "\"a\"";
  EXPECT_EQ(parse_error(ApiEndpoint::COMPLETION, "{\"prompt\":[" + many + "]}").param, "prompt");
}

// Tools, an assistant turn's tool calls (arguments sent as JSON text, handed to the template as an object)
// and tool results; required / named tool_choice and json response formats, and what is refused about them.
TEST(ServeRequestParser, ToolsToolCallsAndConstraints) {
  ApiParse p = parse_api_request(ApiEndpoint::CHAT, R"({"messages":[{"role":"user","content":"weather?"},
      {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function",
        "function":{"name":"get_weather","arguments":"{\"city\":\"Paris\",\"days\":2}"}}]},
      {"role":"tool","tool_call_id":"call_1","content":"sunny"}],
      "tools":[{"type":"function","function":{"name":"get_weather","description":"d","parameters":{"type":"object"}}}],
      "tool_choice":"auto","parallel_tool_calls":true,"response_format":{"type":"text"},
      "chat_template_kwargs":{"enable_thinking":true,"custom":1}})");
  ASSERT_TRUE(p.request) << p.error->message;
  const ApiRequest& r = *p.request;
  EXPECT_EQ(r.messages[1]["content"], "");
  EXPECT_EQ(r.messages[1]["tool_calls"][0]["function"]["arguments"], nlohmann::ordered_json::parse(R"({"city":"Paris","days":2})"));
  EXPECT_EQ(r.messages[1]["tool_calls"][0]["function"]["arguments"].begin().key(), "city");  // the client's order
  EXPECT_EQ(r.messages[2]["tool_call_id"], "call_1");
  EXPECT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(r.tool_choice, ToolChoice::AUTO);
  EXPECT_EQ(r.template_kwargs["custom"], 1);
  const std::string user = R"("messages":[{"role":"user","content":"x"}])";
  const std::string tools = R"("tools":[{"type":"function","function":{"name":"f"}}])";
  ApiParse named = parse_api_request(ApiEndpoint::CHAT, "{" + user + "," + tools + R"(,"tool_choice":{"type":"function","function":{"name":"f"}}})");
  ASSERT_TRUE(named.request) << named.error->message;
  EXPECT_EQ(named.request->tool_choice, ToolChoice::FUNCTION);
  EXPECT_EQ(named.request->tool_choice_name, "f");
  ApiParse schema = parse_api_request(ApiEndpoint::CHAT, "{" + user +
      R"(,"response_format":{"type":"json_schema","json_schema":{"name":"n","strict":true,"schema":{"type":"object"}}}})");
  ASSERT_TRUE(schema.request) << schema.error->message;
  EXPECT_EQ(schema.request->response_format, ResponseFormat::JSON_SCHEMA);
  EXPECT_EQ(schema.request->response_schema, nlohmann::ordered_json::parse(R"({"type":"object"})"));
  // What cannot be constrained is refused by name (the schema's own keywords are checked once it compiles).
  const std::pair<std::string, std::string> refused[] = {
      {R"("tool_choice":"required")", "tool_choice"},  // no tools
      {tools + R"(,"tool_choice":{"type":"function","function":{"name":"g"}})", "tool_choice"},
      {tools + R"(,"tool_choice":"required","response_format":{"type":"json_object"})", "response_format"},
      {R"("response_format":{"type":"json_schema","json_schema":{"schema":{}}})", "response_format.json_schema.name"},
      {R"("response_format":{"type":"json_schema","json_schema":{"name":"n","extra":1}})", "response_format.json_schema.extra"},
      {R"("response_format":{"type":"json_schema","json_schema":{"name":"n","schema":[1]}})", "response_format.json_schema.schema"},
  };
  for (const auto& [extra, param] : refused) EXPECT_EQ(parse_error(ApiEndpoint::CHAT, "{" + user + "," + extra + "}").param, param) << extra;
  EXPECT_EQ(parse_error(ApiEndpoint::CHAT, "{" + user + R"(,"tools":[{"type":"function","function":{}}]})").param, "tools[0].function.name");
  EXPECT_EQ(parse_error(ApiEndpoint::CHAT, R"({"messages":[{"role":"assistant","content":"x","tool_calls":[{"function":{"name":"f","arguments":"[1]"}}]}]})").param,
            "messages[0].tool_calls[0].function.arguments");
  EXPECT_EQ(parse_error(ApiEndpoint::CHAT, R"({"messages":[{"role":"user","content":"x","tool_calls":[]}]})").param,
            "messages[0].tool_calls");
}

TEST(ServeRequestParser, AcceptsWhatOpenAiClientsSend) {
  ApiParse p = parse_api_request(ApiEndpoint::CHAT, R"({"model":"x","messages":[{"role":"developer","content":"s"},
      {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}],"name":"me"}],
      "max_completion_tokens":7,"temperature":0.5,"top_p":0.9,"top_k":5,"min_p":0.1,"seed":42,"stop":"\n",
      "stream":true,"stream_options":{"include_usage":true},"n":1,"user":"u","frequency_penalty":0.5,
      "chat_template_kwargs":{"enable_thinking":false}})");
  ASSERT_TRUE(p.request) << p.error->message;
  const ApiRequest& r = *p.request;
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0]["role"], "system");
  EXPECT_EQ(r.messages[1]["content"], "ab");
  EXPECT_EQ(r.messages[1]["name"], "me");
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_EQ(r.sampling.top_k, 5);
  EXPECT_EQ(r.sampling.seed, 42u);
  EXPECT_EQ(r.stop, std::vector<std::string>{"\n"});
  EXPECT_TRUE(r.stream && r.include_usage);
  EXPECT_EQ(r.template_kwargs["enable_thinking"], false);
  ApiParse c = parse_api_request(ApiEndpoint::COMPLETION, R"({"prompt":"p","seed":-1,"max_tokens":null})");
  ASSERT_TRUE(c.request);
  EXPECT_EQ(c.request->sampling.seed, SamplerParams::SEED_RANDOM);
  EXPECT_FALSE(c.request->max_tokens);
}

TEST(ServeRequestParser, RefusesWithAnActionableError) {
  struct Case {
    ApiEndpoint endpoint;
    std::string body;
    std::string code;
    std::string param;
  };
  const std::vector<Case> cases = {
      {ApiEndpoint::CHAT, "", "invalid_json", ""},
      {ApiEndpoint::CHAT, "{\"messages\":", "invalid_json", ""},
      {ApiEndpoint::CHAT, "\"just a string\"", "invalid_type", ""},
      {ApiEndpoint::CHAT, R"({"messages":"hi"})", "invalid_type", "messages"},
      {ApiEndpoint::CHAT, R"({"messages":[{"content":"x"}]})", "missing_required_parameter", "messages[0].role"},
      {ApiEndpoint::CHAT, R"({"messages":[{"role":"user","content":{"a":1}}]})", "invalid_type", "messages[0].content"},
      {ApiEndpoint::CHAT, R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})", "invalid_value", "messages[0].content"},
      {ApiEndpoint::CHAT, R"({"messages":[{"role":"user","content":"x","extra":1}]})", "unknown_parameter", "messages[0].extra"},
      {ApiEndpoint::CHAT, R"({"messages":[{"role":"user","content":"x"}],"prompt":"p"})", "unknown_parameter", "prompt"},
      {ApiEndpoint::COMPLETION, R"({"prompt":[]})", "invalid_type", "prompt"},
      {ApiEndpoint::COMPLETION, R"({"prompt":{"a":1}})", "invalid_type", "prompt"},
      {ApiEndpoint::COMPLETION, R"({"prompt":[1,-2]})", "invalid_type", "prompt"},
      {ApiEndpoint::COMPLETION, R"({"prompt":[1,2.5]})", "invalid_type", "prompt"},
      {ApiEndpoint::COMPLETION, R"({"prompt":[["x"]]})", "invalid_type", "prompt"},
      {ApiEndpoint::COMPLETION, R"({"prompt":["a",[]]})", "invalid_value", "prompt"},
      {ApiEndpoint::COMPLETION, R"({"prompt":["a",3]})", "invalid_type", "prompt"},
      {ApiEndpoint::COMPLETION, R"({"prompt":"p","max_tokens":-5})", "invalid_value", "max_tokens"},
      {ApiEndpoint::COMPLETION, R"({"prompt":"p","max_tokens":1e30})", "invalid_type", "max_tokens"},
      {ApiEndpoint::COMPLETION, R"({"prompt":"p","max_tokens":99999999999999999999})", "invalid_type", "max_tokens"},
      {ApiEndpoint::COMPLETION, R"({"prompt":"p","max_tokens":18446744073709551615})", "invalid_value", "max_tokens"},
      {ApiEndpoint::COMPLETION, R"({"prompt":"p","temperature":-1})", "invalid_value", "temperature"},
      {ApiEndpoint::COMPLETION, R"({"prompt":"p","temperature":true})", "invalid_type", "temperature"},
      {ApiEndpoint::COMPLETION, R"({"prompt":"p","top_k":-1})", "invalid_value", "top_k"},
      {ApiEndpoint::COMPLETION, R"({"prompt":"p","seed":4294967296})", "invalid_value", "seed"},
      {ApiEndpoint::COMPLETION, R"({"prompt":"p","stream":"yes"})", "invalid_type", "stream"},
      {ApiEndpoint::COMPLETION, R"({"prompt":"p","stream_options":{"x":1}})", "unknown_parameter", "stream_options.x"},
      {ApiEndpoint::COMPLETION, R"({"prompt":"p","n":2})", "invalid_value", "n"},
      {ApiEndpoint::COMPLETION, R"({"prompt":"p","logprobs":true})", "invalid_value", "logprobs"},
      {ApiEndpoint::COMPLETION, R"({"prompt":"p","stop":["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"]})", "invalid_value", "stop"},
      {ApiEndpoint::COMPLETION, R"({"prompt":"p","stop":")" + std::string(300, 's') + R"("})", "invalid_value", "stop"},
      {ApiEndpoint::COMPLETION, std::string(100000, '{'), "invalid_value", ""},
      {ApiEndpoint::COMPLETION, "{\"prompt\":\"\xff\xfe\"}", "invalid_json", ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body.substr(0, 120));
    const ApiError e = parse_error(c.endpoint, c.body);
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.code, c.code) << e.message;
    EXPECT_EQ(e.param, c.param) << e.message;
    EXPECT_FALSE(e.message.empty());
    const json j = json::parse(api_error_json(e));
    EXPECT_EQ(j["error"]["message"], e.message);
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  }
}

TEST(ServeRequestParser, NestingDepthIsCountedOutsideStrings) {
  EXPECT_EQ(json_nesting_depth(R"({"a":[1,{"b":"[[[[{{{{"}]})"), 3u);
  EXPECT_EQ(json_nesting_depth(R"("\"[[[")"), 0u);
  EXPECT_EQ(json_nesting_depth("]]]]}}"), 0u);
}

TEST(ServeStopStrings, HoldsBackOnlyWhatCouldStillMatch) {
  StopMatcher m({"END", "\n\n"});
  EXPECT_EQ(m.push("Hello E"), "Hello ");
  EXPECT_EQ(m.push("N"), "");
  EXPECT_EQ(m.push("X and\n"), "ENX and");
  EXPECT_EQ(m.push("\nmore"), "");
  EXPECT_TRUE(m.matched());
  EXPECT_EQ(m.push("anything"), "");
  EXPECT_EQ(m.flush(), "");
  StopMatcher none({});
  EXPECT_EQ(none.push("abc"), "abc");
  StopMatcher tail({"xyz"});
  EXPECT_EQ(tail.push("abxy"), "ab");
  EXPECT_EQ(tail.flush(), "xy");  // generation ended before the stop string completed
}

TEST(ServeMetricsText, ExpositionFormat) {
  net::MetricsText m;
  m.family("a_total", "counter", "Things\nseen");
  m.sample("a_total", {{"k", "q\"u\\o\nte"}}, 3);
  net::Histogram h({1, 4});
  h.observe(0.5);
  h.observe(4);
  h.observe(9);
  m.histogram("rows", "Rows", h);
  EXPECT_EQ(m.text(),
            "# HELP a_total Things seen\n# TYPE a_total counter\na_total{k=\"q\\\"u\\\\o\\nte\"} 3\n"
            "# HELP rows Rows\n# TYPE rows histogram\nrows_bucket{le=\"1\"} 1\nrows_bucket{le=\"4\"} 2\n"
            "rows_bucket{le=\"+Inf\"} 3\nrows_sum 13.5\nrows_count 3\n");
}

TEST(ServeAdmission, ApiKey) {
  EXPECT_TRUE(net::api_key_ok("", ""));
  EXPECT_TRUE(net::api_key_ok("k1", "Bearer k1"));
  EXPECT_FALSE(net::api_key_ok("k1", "Bearer k2"));
  EXPECT_FALSE(net::api_key_ok("k1", "Bearer k1x"));
  EXPECT_FALSE(net::api_key_ok("k1", "Bearer "));
  EXPECT_FALSE(net::api_key_ok("k1", "k1"));
  EXPECT_FALSE(net::api_key_ok("k1", ""));
}

TEST(ServeHostileHttp, GarbageTruncatedSlowAndHugeRequests) {
  auto server = start_server({.parallel = 1, .max_body_bytes = 8192, .read_deadline = std::chrono::milliseconds(300)});
  ASSERT_TRUE(server);
  const uint16_t port = server->port();
  EXPECT_TRUE(raw_exchange(port, "\x16\x03\x01\x02\x00garbage\r\n\r\n").starts_with("HTTP/1.1 400"));
  EXPECT_TRUE(raw_exchange(port, "GET / HTTP/9.9\r\n\r\n").starts_with("HTTP/1.1 400"));
  // A declared length far beyond the limit is refused from the header, before any body is read or allocated.
  const std::string huge = raw_exchange(port, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n{");
  EXPECT_TRUE(huge.starts_with("HTTP/1.1 413")) << huge;
  EXPECT_NE(huge.find("\"request_too_large\""), std::string::npos);
  // Chunked bodies count against the same limit.
  std::string chunked = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 10; ++i) chunked += "400\r\n" + std::string(1024, 'a') + "\r\n";
  EXPECT_TRUE(raw_exchange(port, chunked).starts_with("HTTP/1.1 413"));
  // A client that stops mid-header is dropped once the read deadline passes (no answer, connection closed).
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(raw_exchange(port, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le", 5s), "");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 4s);
  // A truncated body: the same.
  EXPECT_EQ(raw_exchange(port, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{\"pro", 5s), "");
  // "Expect: 100-continue" gets the go-ahead, then the answer; over the limit, the 413 comes instead.
  const std::string body = R"({"prompt":"Hi","max_tokens":1,"temperature":0})";
  const std::string expect = raw_exchange(port, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                                "Expect: 100-continue\r\nContent-Length: " + std::to_string(body.size()) +
                                                "\r\n\r\n" + body);
  EXPECT_TRUE(expect.starts_with("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n")) << expect;
  EXPECT_TRUE(raw_exchange(port, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                                 "Content-Length: 100000\r\n\r\n").starts_with("HTTP/1.1 413"));
  // Still serving.
  EXPECT_EQ(http_call(port, "POST", "/v1/completions", R"({"prompt":"Hi","max_tokens":2})").status, 200);
  EXPECT_EQ(server->api().outcome_count("length") + server->api().outcome_count("stop"), 2u);
}


// The shared admission layer (net::Admission): 120 connections from one address that never send a complete
// request (idle, or dribbling almost-full headers) cannot lock out a real client. Past 16 unauthenticated
// connections of the address (the cap this test sets), the oldest are evicted with a 503; a real request is still answered at once,
// the evictions are counted in /metrics, and the flood costs little memory.
using test_support::rss_kib;

TEST(ServeHostileHttp, AFloodOfUnauthenticatedConnectionsCannotLockOutAClient) {
  // A connection cap below the flood: without eviction the flood alone would fill it.
  auto server = start_server({.parallel = 1, .api_key = "k", .max_connections = 64, .max_unauthenticated_per_address = 16});
  ASSERT_TRUE(server);
  const uint16_t port = server->port();
  const std::map<std::string, std::string> key = {{"Authorization", "Bearer k"}};
  ASSERT_EQ(http_call(port, "POST", "/v1/completions", R"({"prompt":"Hi","max_tokens":1})", key).status, 200);
  const long rss_before = rss_kib();
  boost::asio::io_context io;
  std::vector<std::unique_ptr<boost::asio::ip::tcp::socket>> flood;
  const std::string almost_full_headers =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Pad: " + std::string(15000, 'a');  // under 16 KiB, unfinished
  for (int i = 0; i < 120; ++i) {
    auto sock = std::make_unique<boost::asio::ip::tcp::socket>(io);
    boost::system::error_code ec;
    sock->connect({boost::asio::ip::make_address("127.0.0.1"), port}, ec);
    ASSERT_FALSE(ec) << ec.message();
    if (i % 2 == 1) boost::asio::write(*sock, boost::asio::buffer(almost_full_headers), ec);
    flood.push_back(std::move(sock));
  }
  // A wrong key does not authenticate either: that connection stays evictable like the flood.
  EXPECT_EQ(http_call(port, "GET", "/v1/models", "", {{"Authorization", "Bearer wrong"}}).status, 401);
  const auto t0 = std::chrono::steady_clock::now();
  const HttpResult real = http_call(port, "POST", "/v1/completions", R"({"prompt":"Hi","max_tokens":2})", key);
  EXPECT_EQ(real.status, 200) << real.body;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  // Evicted connections were told why before being closed.
  size_t told = 0;
  for (auto& sock : flood) {
    sock->non_blocking(true);
    char buf[512];
    boost::system::error_code ec;
    const size_t n = sock->read_some(boost::asio::buffer(buf), ec);
    if (n > 0 && std::string(buf, n).starts_with("HTTP/1.1 503")) ++told;
  }
  EXPECT_GE(told, 120u - 16u - 1u);
  const HttpResult metrics = http_call(port, "GET", "/metrics", "", key);
  ASSERT_EQ(metrics.status, 200);
  const std::string sample = "essaim_serve_admission_refused_total{reason=\"evicted_address_full\"} ";
  const size_t at = metrics.body.find(sample);
  ASSERT_NE(at, std::string::npos) << metrics.body;
  EXPECT_GE(std::stoul(metrics.body.substr(at + sample.size())), 120u - 16u - 1u) << metrics.body;
  const long rss_after = rss_kib();
  RecordProperty("rss_before_kib", std::to_string(rss_before));
  RecordProperty("rss_after_kib", std::to_string(rss_after));
  // Bound: at most 16 unauthenticated connections of one address are held, each under 16 KiB of headers,
  // plus their sockets and buffers; 32 MiB leaves room for the sanitizers' allocator.
  EXPECT_LT(rss_after - rss_before, 32 * 1024) << rss_before << " -> " << rss_after << " KiB";
}

}  // namespace
}  // namespace essaim::serve::testing
