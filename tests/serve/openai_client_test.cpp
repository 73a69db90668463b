// The official `openai` and `@anthropic-ai/sdk` npm clients (pinned in tests/serve/js/package-lock.json, installed
// into the build directory by tests/serve/js/run.sh with `npm ci`) against `essaim serve` processes on ports the
// OS chose. Each test first asks a server with its own HTTP client, then the JS client must see the same answers
// (greedy) in the shapes the APIs define. The agent-API tests run on a qwen35moe synth model, on the trained model
// with the Qwen3.5 template, and on the trained model's backbone file over 2 essaim-worker processes, where the
// expected answers come from the monolithic server (equal texts: the swarm computes the same bits). Without
// node/npm or the registry the tests fail with the reason, unless ESSAIM_SKIP_NPM=1 asks to skip them.

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

// Where the agent-API tests run: the qwen35moe synth model (its own template opens <think>); the trained model
// (models/kjv-moe-q4_k_m.gguf, a 4,096-token vocabulary) with the real Qwen3.5 template from a file, since its own
// is plain ChatML; and the same model from its backbone file with its experts on 2 essaim-worker processes.
enum class AgentModel { SYNTH_QWEN35, TRAINED, TRAINED_OVER_WORKERS };

void PrintTo(AgentModel m, std::ostream* os) {
  *os << (m == AgentModel::SYNTH_QWEN35 ? "synth qwen35moe" : m == AgentModel::TRAINED ? "trained" : "trained over workers");
}

std::string agent_model_name(const ::testing::TestParamInfo<AgentModel>& info) {
  switch (info.param) {
    case AgentModel::SYNTH_QWEN35: return "SynthQwen35";
    case AgentModel::TRAINED: return "Trained";
    case AgentModel::TRAINED_OVER_WORKERS: return "TrainedOverWorkers";
  }
  return "unknown";
}

const backbone::testing::SwarmModel& trained_model() {
  return backbone::testing::SwarmModel::get({.file = std::string(ESSAIM_SOURCE_DIR) + "/models/kjv-moe-q4_k_m.gguf"});
}

// The flags every agent server shares: -np 2, --reasoning-budget 3 (every answer thinks, then answers), a context
// of 2,048 (the Qwen3.5 template's tool preamble is 666 tokens in the trained model's 4,096-token vocabulary).
std::vector<std::string> agent_serve_args(const std::vector<std::string>& model_args, const std::string& alias) {
  std::vector<std::string> args = {ESSAIM_CLI, "serve"};
  args.insert(args.end(), model_args.begin(), model_args.end());
  args.insert(args.end(), {"--host", "127.0.0.1", "--port", "0", "-np", "2", "-c", "2048", "-t", "1",
                           "--reasoning-budget", "3", "--alias", alias});
  return args;
}

// The servers of one case: `served` is the one the JS client talks to; `reference` answers the C++ side's
// expected JSON (the same process but over workers, where it is the monolithic server of the same model).
struct AgentServers {
  std::string alias;
  std::unique_ptr<backbone::testing::WorkerSwarm> swarm;
  std::unique_ptr<ListeningProcess> reference;
  std::unique_ptr<ListeningProcess> served;
  bool over_workers() const { return swarm != nullptr; }
};

AgentServers start_agent_servers(AgentModel which) {
  AgentServers s;
  if (which == AgentModel::SYNTH_QWEN35) {
    s.alias = "tiny35";
    const std::string model = backbone::testing::SwarmModel::get({.arch = SynthArch::QWEN35MOE}).path;
    s.served = std::make_unique<ListeningProcess>(agent_serve_args({"-m", model}, s.alias));
    return s;
  }
  s.alias = "kjv35";
  const std::string template_file = std::string(ESSAIM_SOURCE_DIR) + "/tests/text/data/templates/qwen35.jinja";
  const backbone::testing::SwarmModel& m = trained_model();
  s.served = std::make_unique<ListeningProcess>(
      agent_serve_args({"-m", m.path, "--chat-template-file", template_file}, s.alias));
  if (which == AgentModel::TRAINED) return s;
  s.reference = std::move(s.served);
  s.swarm = std::make_unique<backbone::testing::WorkerSwarm>(backbone::testing::start_worker_swarm(m, 2));
  std::vector<std::string> model_args = {"--backbone-file", backbone::testing::backbone_file_path(m),
                                         "--chat-template-file", template_file, "--worker-timeout-ms", "60000"};
  for (const auto& w : s.swarm->processes) model_args.insert(model_args.end(), {"--worker", w->address()});
  s.served = std::make_unique<ListeningProcess>(agent_serve_args(model_args, s.alias));
  return s;
}

// Every server of the case listening and /health 200 (over workers: once both workers are connected).
::testing::AssertionResult agent_servers_ready(const AgentServers& s) {
  if (s.swarm && !s.swarm->ok()) return ::testing::AssertionFailure() << "a worker did not start";
  for (const ListeningProcess* p : {s.reference.get(), s.served.get()}) {
    if (p == nullptr) continue;
    if (!p->ok()) return ::testing::AssertionFailure() << "essaim serve did not listen";
    if (!wait_until([&] { return http_call(p->port(), "GET", "/health").status == 200; }, 60s))
      return ::testing::AssertionFailure() << "essaim serve on port " << p->port() << " never became healthy";
  }
  return ::testing::AssertionSuccess();
}

uint16_t reference_port(const AgentServers& s) { return (s.reference ? s.reference : s.served)->port(); }

// POSTs a JSON body, expects 200, returns the parsed answer (null otherwise).
json post_ok(uint16_t port, const std::string& path, const std::string& body) {
  const HttpResult r = http_call(port, "POST", path, body);
  EXPECT_EQ(r.status, 200) << r.body;
  return r.status == 200 ? json::parse(r.body) : json();
}

// What openai_agents.mjs must see, asked of the server on `port` with the C++ HTTP client (greedy).
json openai_agents_expected(uint16_t port, const std::string& alias) {
  const auto chat = [&](const std::string& body) { return post_ok(port, "/v1/chat/completions", body); };
  const json thinking = chat(R"({"messages":[{"role":"user","content":"Why is the sky blue?"}],"max_tokens":12,"temperature":0})");
  const json plain = chat(R"({"messages":[{"role":"user","content":"Why is the sky blue?"}],"max_tokens":12,"temperature":0,
      "chat_template_kwargs":{"enable_thinking":false}})");
  const json tool = chat(R"({"messages":[{"role":"user","content":"Weather in Paris?"},
      {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
      {"role":"tool","tool_call_id":"call_1","content":"sunny, 21 C"}],
      "tools":[{"type":"function","function":{"name":"get_weather","description":"Weather in a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}],
      "max_tokens":10,"temperature":0})");
  if (thinking.is_null() || plain.is_null() || tool.is_null()) return json();
  const json& m = thinking["choices"][0]["message"];
  EXPECT_TRUE(m.contains("reasoning_content")) << thinking.dump();
  EXPECT_FALSE(plain["choices"][0]["message"].contains("reasoning_content")) << plain.dump();
  return {{"model", alias},
          {"reasoning", m.value("reasoning_content", json())},
          {"content", m["content"]},
          {"no_thinking_content", plain["choices"][0]["message"]["content"]},
          {"tool_answer_content", tool["choices"][0]["message"]["content"]},
          {"tool_answer_reasoning", tool["choices"][0]["message"].value("reasoning_content", json())},
          {"tool_answer_prompt_tokens", tool["usage"]["prompt_tokens"]}};
}

// What anthropic_client.mjs must see, asked of the server on `port` with the C++ HTTP client (greedy).
json anthropic_expected(uint16_t port, const std::string& alias) {
  const auto messages = [&](const std::string& body) { return post_ok(port, "/v1/messages", body); };
  const std::string ask = R"("model":")" + alias + R"(","max_tokens":12,"temperature":0,"system":"Be brief.",
      "messages":[{"role":"user","content":"Why is the sky blue?"}])";
  const json m = messages("{" + ask + "}");
  const json plain = messages("{" + ask + R"(,"thinking":{"type":"disabled"}})");
  const json tool = messages(R"({"model":")" + alias + R"(","max_tokens":10,"temperature":0,
      "tools":[{"name":"get_weather","description":"Weather in a city","input_schema":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}],
      "messages":[{"role":"user","content":"Weather in Paris?"},
        {"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris"}}]},
        {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"sunny, 21 C"}]}]})");
  if (m.is_null() || plain.is_null() || tool.is_null()) return json();
  EXPECT_EQ(m["content"].size(), 2u) << m.dump();
  EXPECT_EQ(plain["content"].size(), 1u) << plain.dump();
  if (m["content"].size() != 2u || plain["content"].empty()) return json();
  std::string tool_answer;
  for (const json& b : tool["content"]) tool_answer += (tool_answer.empty() ? "" : "|") + b.value(b["type"] == "text" ? "text" : "thinking", "");
  return {{"model", alias},
          {"thinking", m["content"][0]["thinking"]},
          {"text", m["content"][1]["text"]},
          {"stop_reason", m["stop_reason"]},
          {"input_tokens", m["usage"]["input_tokens"]},
          {"no_thinking_text", plain["content"][0]["text"]},
          {"tool_answer", tool_answer},
          {"tool_input_tokens", tool["usage"]["input_tokens"]}};
}

// The expected answers from the reference server; over workers, the swarm's own answers must be those bits.
json expected_answers(const AgentServers& s, json (*ask)(uint16_t, const std::string&)) {
  const json expected = ask(reference_port(s), s.alias);
  if (s.over_workers()) EXPECT_EQ(ask(s.served->port(), s.alias), expected) << "the swarm's answers differ from the monolithic ones";
  return expected;
}

class AgentClients : public ::testing::TestWithParam<AgentModel> {};

// Reasoning split, enable_thinking through the template, a tool round trip, and constrained decoding (tool_choice
// named and "required", json_schema and json_object, a refused keyword), with the openai client and
// --reasoning-budget 3.
TEST_P(AgentClients, OpenAiReasoningAndToolRoundTrip) {
  if (skip_npm()) {
    ESSAIM_SKIP_MISSING_DEP(essaim::test_support::Dep::NODE_NPM, "ESSAIM_SKIP_NPM=1 asks to skip this test");
  }
  const AgentServers s = start_agent_servers(GetParam());
  ASSERT_TRUE(agent_servers_ready(s));
  const json expected = expected_answers(s, openai_agents_expected);
  ASSERT_FALSE(HasFailure()) << expected.dump();
  int rc = -1;
  const std::string out = run_js("openai_agents.mjs", "http://127.0.0.1:" + std::to_string(s.served->port()) + "/v1", expected, rc);
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << "exit " << (WIFEXITED(rc) ? WEXITSTATUS(rc) : -1) << ":\n" << out;
  EXPECT_NE(out.find("openai agents: 7 checks passed"), std::string::npos) << out;
}

// The official @anthropic-ai/sdk client on POST /v1/messages (tests/serve/js/anthropic_client.mjs): thinking and
// text blocks, streaming, thinking disabled, a tool round trip, errors.
TEST_P(AgentClients, AnthropicMessagesStreamingThinkingAndToolUse) {
  if (skip_npm()) {
    ESSAIM_SKIP_MISSING_DEP(essaim::test_support::Dep::NODE_NPM, "ESSAIM_SKIP_NPM=1 asks to skip this test");
  }
  const AgentServers s = start_agent_servers(GetParam());
  ASSERT_TRUE(agent_servers_ready(s));
  const json expected = expected_answers(s, anthropic_expected);
  ASSERT_FALSE(HasFailure()) << expected.dump();
  int rc = -1;
  const std::string out = run_js("anthropic_client.mjs", "http://127.0.0.1:" + std::to_string(s.served->port()), expected, rc);
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << "exit " << (WIFEXITED(rc) ? WEXITSTATUS(rc) : -1) << ":\n" << out;
  EXPECT_NE(out.find("anthropic client: 6 checks passed"), std::string::npos) << out;
}

INSTANTIATE_TEST_SUITE_P(Models, AgentClients,
                         ::testing::Values(AgentModel::SYNTH_QWEN35, AgentModel::TRAINED, AgentModel::TRAINED_OVER_WORKERS),
                         agent_model_name);

}  // namespace
}  // namespace essaim::serve::testing
