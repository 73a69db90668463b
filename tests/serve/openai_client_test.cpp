// The official `openai` npm client (pinned in tests/serve/js/package-lock.json, installed into the build
// directory by tests/serve/js/run.sh with `npm ci`) against an `essaim serve` process on a synth model and a
// port the OS chose. This test first asks the same server with its own HTTP client, then the JS client must
// see the same answers (greedy) in the shapes the OpenAI API defines. Without node/npm or the registry the test
// fails with the reason, unless ESSAIM_SKIP_NPM=1 asks to skip it.

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "backbone_test_util.h"
#include "serve_test_util.h"
#include "skip.h"
#include "temp_dir.h"

namespace essaim::serve::testing {
namespace {

const std::string kApiKey = "test-key";

bool skip_npm() {
  const char* skip = std::getenv("ESSAIM_SKIP_NPM");
  return skip != nullptr && std::string(skip) == "1";
}

using backbone::testing::ListeningProcess;  // `essaim serve` as a child process

TEST(OpenAiClient, ChatStreamCompletionModelsAndErrors) {
  if (skip_npm()) ESSAIM_SKIP_MISSING_DEP(essaim::test_support::Dep::NODE_NPM, "ESSAIM_SKIP_NPM=1 asks to skip this test");
  ListeningProcess serve({ESSAIM_CLI, "serve", "-m", tiny_model_path(), "--host", "127.0.0.1", "--port", "0", "-np", "2",
                      "-c", "512", "-t", "1", "--api-key", kApiKey, "--alias", "tiny-swarm"});
  ASSERT_NE(serve.port(), 0);
  ASSERT_TRUE(wait_until([&] { return http_call(serve.port(), "GET", "/health").status == 200; }, 60s));
  const std::map<std::string, std::string> auth = {{"Authorization", "Bearer " + kApiKey}};
  const HttpResult chat = http_call(serve.port(), "POST", "/v1/chat/completions",
                                    R"({"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello there"}],"max_tokens":8,"temperature":0})",
                                    auth);
  ASSERT_EQ(chat.status, 200) << chat.body;
  const HttpResult completion = http_call(serve.port(), "POST", "/v1/completions",
                                          R"({"prompt":"Once upon a time","max_tokens":6,"temperature":0})", auth);
  ASSERT_EQ(completion.status, 200) << completion.body;
  const json c = json::parse(chat.body), p = json::parse(completion.body);
  const json expected = {{"api_key", kApiKey},
                         {"model", "tiny-swarm"},
                         {"chat_content", c["choices"][0]["message"]["content"]},
                         {"chat_finish_reason", c["choices"][0]["finish_reason"]},
                         {"chat_completion_tokens", c["usage"]["completion_tokens"]},
                         {"completion_text", p["choices"][0]["text"]}};
  const std::string dir = std::string(ESSAIM_BINARY_DIR) + "/serve-js";
  std::filesystem::create_directories(dir);
  const std::string expected_path = essaim::testing::make_temp_file_beside(dir + "/expected.json");
  std::ofstream(expected_path) << expected.dump();
  const std::string log = essaim::testing::make_temp_file_beside(dir + "/run.log");
  const std::string cmd = "bash '" + std::string(ESSAIM_SOURCE_DIR) + "/tests/serve/js/run.sh' '" + dir +
                          "' 'http://127.0.0.1:" + std::to_string(serve.port()) + "/v1' '" + expected_path + "' > '" +
                          log + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  std::stringstream out;
  out << std::ifstream(log).rdbuf();
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0)
      << "the openai client test failed (exit " << (WIFEXITED(rc) ? WEXITSTATUS(rc) : -1)
      << "); set ESSAIM_SKIP_NPM=1 to skip this test deliberately. Output:\n" << out.str();
  EXPECT_NE(out.str().find("6 checks passed"), std::string::npos) << out.str();
  std::filesystem::remove(expected_path);
  std::filesystem::remove(log);
}

// Runs one of tests/serve/js/*.mjs against BASE_URL with the expected answers; returns its output.
std::string run_js(const std::string& script, const std::string& base_url, const json& expected, int& rc) {
  const std::string dir = std::string(ESSAIM_BINARY_DIR) + "/serve-js";
  std::filesystem::create_directories(dir);
  const std::string expected_path = essaim::testing::make_temp_file_beside(dir + "/expected.json");
  std::ofstream(expected_path) << expected.dump();
  const std::string log = essaim::testing::make_temp_file_beside(dir + "/run.log");
  const std::string cmd = "bash '" + std::string(ESSAIM_SOURCE_DIR) + "/tests/serve/js/run.sh' '" + dir + "' '" + base_url +
                          "' '" + expected_path + "' '" + script + "' > '" + log + "' 2>&1";
  rc = std::system(cmd.c_str());
  std::stringstream out;
  out << std::ifstream(log).rdbuf();
  std::filesystem::remove(expected_path);
  std::filesystem::remove(log);
  return out.str();
}

// The server both agent-API tests drive: a qwen35moe synth model (its template opens <think>),
// --reasoning-budget 3.
ListeningProcess start_agents_server() {
  const std::string model = backbone::testing::SwarmModel::get({.arch = SynthArch::QWEN35MOE}).path;
  return ListeningProcess({ESSAIM_CLI, "serve", "-m", model, "--host", "127.0.0.1", "--port", "0", "-np", "2", "-c", "512",
                           "-t", "1", "--reasoning-budget", "3", "--alias", "tiny35"});
}

// POSTs a JSON body, expects 200, returns the parsed answer (null otherwise).
json post_ok(uint16_t port, const std::string& path, const std::string& body) {
  const HttpResult r = http_call(port, "POST", path, body);
  EXPECT_EQ(r.status, 200) << r.body;
  return r.status == 200 ? json::parse(r.body) : json();
}

// Reasoning split, enable_thinking through the template, a tool round trip, and constrained decoding (tool_choice
// named and "required", json_schema and json_object, a refused keyword), with the
// openai client against a qwen35moe synth model (its template opens <think>) and --reasoning-budget 3.
TEST(OpenAiClient, ReasoningAndToolRoundTrip) {
  if (skip_npm()) ESSAIM_SKIP_MISSING_DEP(essaim::test_support::Dep::NODE_NPM, "ESSAIM_SKIP_NPM=1 asks to skip this test");
  ListeningProcess serve = start_agents_server();
  ASSERT_NE(serve.port(), 0);
  ASSERT_TRUE(wait_until([&] { return http_call(serve.port(), "GET", "/health").status == 200; }, 60s));
  const auto chat = [&](const std::string& body) { return post_ok(serve.port(), "/v1/chat/completions", body); };
  const json thinking = chat(R"({"messages":[{"role":"user","content":"Why is the sky blue?"}],"max_tokens":12,"temperature":0})");
  const json plain = chat(R"({"messages":[{"role":"user","content":"Why is the sky blue?"}],"max_tokens":12,"temperature":0,
      "chat_template_kwargs":{"enable_thinking":false}})");
  const json tool = chat(R"({"messages":[{"role":"user","content":"Weather in Paris?"},
      {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
      {"role":"tool","tool_call_id":"call_1","content":"sunny, 21 C"}],
      "tools":[{"type":"function","function":{"name":"get_weather","description":"Weather in a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}],
      "max_tokens":10,"temperature":0})");
  const json& m = thinking["choices"][0]["message"];
  ASSERT_TRUE(m.contains("reasoning_content")) << thinking.dump();
  const json expected = {{"model", "tiny35"},
                         {"reasoning", m["reasoning_content"]},
                         {"content", m["content"]},
                         {"no_thinking_content", plain["choices"][0]["message"]["content"]},
                         {"tool_answer_content", tool["choices"][0]["message"]["content"]},
                         {"tool_answer_reasoning", tool["choices"][0]["message"].value("reasoning_content", json())},
                         {"tool_answer_prompt_tokens", tool["usage"]["prompt_tokens"]}};
  EXPECT_FALSE(plain["choices"][0]["message"].contains("reasoning_content")) << plain.dump();
  int rc = -1;
  const std::string out = run_js("openai_agents.mjs", "http://127.0.0.1:" + std::to_string(serve.port()) + "/v1", expected, rc);
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << "exit " << (WIFEXITED(rc) ? WEXITSTATUS(rc) : -1) << ":\n" << out;
  EXPECT_NE(out.find("openai agents: 7 checks passed"), std::string::npos) << out;
}

// The official @anthropic-ai/sdk client on POST /v1/messages (tests/serve/js/anthropic_client.mjs), against the
// same kind of server: thinking and text blocks, streaming, thinking disabled, a tool round trip, errors.
TEST(AnthropicClient, MessagesStreamingThinkingAndToolUse) {
  if (skip_npm()) ESSAIM_SKIP_MISSING_DEP(essaim::test_support::Dep::NODE_NPM, "ESSAIM_SKIP_NPM=1 asks to skip this test");
  ListeningProcess serve = start_agents_server();
  ASSERT_NE(serve.port(), 0);
  ASSERT_TRUE(wait_until([&] { return http_call(serve.port(), "GET", "/health").status == 200; }, 60s));
  const auto messages = [&](const std::string& body) { return post_ok(serve.port(), "/v1/messages", body); };
  const std::string ask = R"("model":"tiny35","max_tokens":12,"temperature":0,"system":"Be brief.",
      "messages":[{"role":"user","content":"Why is the sky blue?"}])";
  const json m = messages("{" + ask + "}");
  const json plain = messages("{" + ask + R"(,"thinking":{"type":"disabled"}})");
  const json tool = messages(R"({"model":"tiny35","max_tokens":10,"temperature":0,
      "tools":[{"name":"get_weather","description":"Weather in a city","input_schema":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}],
      "messages":[{"role":"user","content":"Weather in Paris?"},
        {"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris"}}]},
        {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"sunny, 21 C"}]}]})");
  ASSERT_EQ(m["content"].size(), 2u) << m.dump();
  std::string tool_answer;
  for (const json& b : tool["content"]) tool_answer += (tool_answer.empty() ? "" : "|") + b.value(b["type"] == "text" ? "text" : "thinking", "");
  const json expected = {{"model", "tiny35"},
                         {"thinking", m["content"][0]["thinking"]},
                         {"text", m["content"][1]["text"]},
                         {"stop_reason", m["stop_reason"]},
                         {"input_tokens", m["usage"]["input_tokens"]},
                         {"no_thinking_text", plain["content"][0]["text"]},
                         {"tool_answer", tool_answer},
                         {"tool_input_tokens", tool["usage"]["input_tokens"]}};
  EXPECT_EQ(plain["content"].size(), 1u) << plain.dump();
  int rc = -1;
  const std::string out = run_js("anthropic_client.mjs", "http://127.0.0.1:" + std::to_string(serve.port()), expected, rc);
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << "exit " << (WIFEXITED(rc) ? WEXITSTATUS(rc) : -1) << ":\n" << out;
  EXPECT_NE(out.find("anthropic client: 6 checks passed"), std::string::npos) << out;
}

}  // namespace
}  // namespace essaim::serve::testing
