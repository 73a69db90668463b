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
const std::string kAgentAlias = "agent-model";

bool skip_npm() {
  const char* skip = std::getenv("ESSAIM_SKIP_NPM");
  return skip != nullptr && std::string(skip) == "1";
}

using backbone::testing::ListeningProcess;  // `essaim serve` and `essaim-worker` as child processes

// Where the client tests run: a synth model; the trained model (models/kjv-moe-q4_k_m.gguf, a 4,096-token
// vocabulary); and the same model from its backbone file (no experts) with its experts on 2 essaim-worker
// processes, whose answers must be the monolithic server's.
enum class ServedModel { SYNTH, TRAINED, TRAINED_OVER_WORKERS };

void PrintTo(ServedModel m, std::ostream* os) {
  *os << (m == ServedModel::SYNTH ? "synth" : m == ServedModel::TRAINED ? "trained" : "trained over workers");
}

std::string served_model_name(const ::testing::TestParamInfo<ServedModel>& info) {
  switch (info.param) {
    case ServedModel::SYNTH: return "Synth";
    case ServedModel::TRAINED: return "Trained";
    case ServedModel::TRAINED_OVER_WORKERS: return "TrainedOverWorkers";
  }
  return "unknown";
}

// How one test starts its servers: which synth file, the trained model's template (empty: its own, ChatML), and
// the flags after the model's.
struct ServerSetup {
  std::string synth_model;
  std::string trained_template_file;
  std::vector<std::string> flags;
};

// The servers of one case: `served` is the one the JS client talks to; `reference` answers the C++ side's
// expected JSON (the same process, but over workers the monolithic server of the same model).
struct Servers {
  std::unique_ptr<backbone::testing::WorkerSwarm> swarm;
  std::unique_ptr<ListeningProcess> reference;
  std::unique_ptr<ListeningProcess> served;
  bool over_workers() const { return swarm != nullptr; }
  uint16_t reference_port() const { return (reference ? reference : served)->port(); }
  uint16_t served_port() const { return served->port(); }
};

std::unique_ptr<ListeningProcess> start_serve(std::vector<std::string> model_args, const ServerSetup& setup) {
  std::vector<std::string> args = {ESSAIM_CLI, "serve"};
  args.insert(args.end(), model_args.begin(), model_args.end());
  args.insert(args.end(), {"--host", "127.0.0.1", "--port", "0"});
  args.insert(args.end(), setup.flags.begin(), setup.flags.end());
  return std::make_unique<ListeningProcess>(args);
}

Servers start_servers(ServedModel which, const ServerSetup& setup) {
  Servers s;
  if (which == ServedModel::SYNTH) {
    s.served = start_serve({"-m", setup.synth_model}, setup);
    return s;
  }
  const backbone::testing::SwarmModel& m =
      backbone::testing::SwarmModel::get({.file = std::string(ESSAIM_SOURCE_DIR) + "/models/kjv-moe-q4_k_m.gguf"});
  std::vector<std::string> template_args;
  if (!setup.trained_template_file.empty()) template_args = {"--chat-template-file", setup.trained_template_file};
  std::vector<std::string> model_args = {"-m", m.path};
  model_args.insert(model_args.end(), template_args.begin(), template_args.end());
  s.served = start_serve(model_args, setup);
  if (which == ServedModel::TRAINED) return s;
  s.reference = std::move(s.served);
  s.swarm = std::make_unique<backbone::testing::WorkerSwarm>(backbone::testing::start_worker_swarm(m, 2));
  model_args = {"--backbone-file", backbone::testing::backbone_file_path(m), "--worker-timeout-ms", "60000"};
  for (const auto& w : s.swarm->processes) model_args.insert(model_args.end(), {"--worker", w->address()});
  model_args.insert(model_args.end(), template_args.begin(), template_args.end());
  s.served = start_serve(model_args, setup);
  return s;
}

// Every server of the case listening and /health 200 (over workers: once both workers are connected).
::testing::AssertionResult servers_ready(const Servers& s) {
  if (s.swarm && !s.swarm->ok()) return ::testing::AssertionFailure() << "a worker did not start";
  for (const ListeningProcess* p : {s.reference.get(), s.served.get()}) {
    if (p == nullptr) continue;
    if (!p->ok()) return ::testing::AssertionFailure() << "essaim serve did not listen";
    if (!wait_until([&] { return http_call(p->port(), "GET", "/health").status == 200; }, 60s))
      return ::testing::AssertionFailure() << "essaim serve on port " << p->port() << " never became healthy";
  }
  return ::testing::AssertionSuccess();
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

// POSTs a JSON body, expects 200, returns the parsed answer (null otherwise).
json post_ok(uint16_t port, const std::string& path, const std::string& body,
             const std::map<std::string, std::string>& headers = {}) {
  const HttpResult r = http_call(port, "POST", path, body, headers);
  EXPECT_EQ(r.status, 200) << r.body;
  return r.status == 200 ? json::parse(r.body) : json();
}

// What openai_client.mjs must see (chat, streamed chat, completion), asked of the server on `port`.
json openai_client_expected(uint16_t port, const std::string& alias) {
  const std::map<std::string, std::string> auth = {{"Authorization", "Bearer " + kApiKey}};
  const json c = post_ok(port, "/v1/chat/completions",
                         R"({"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello there"}],"max_tokens":8,"temperature":0})",
                         auth);
  const json p = post_ok(port, "/v1/completions", R"({"prompt":"Once upon a time","max_tokens":6,"temperature":0})", auth);
  if (c.is_null() || p.is_null()) return json();
  return {{"api_key", kApiKey},
          {"model", alias},
          {"chat_content", c["choices"][0]["message"]["content"]},
          {"chat_finish_reason", c["choices"][0]["finish_reason"]},
          {"chat_completion_tokens", c["usage"]["completion_tokens"]},
          {"completion_text", p["choices"][0]["text"]}};
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
json expected_answers(const Servers& s, const std::string& alias, json (*ask)(uint16_t, const std::string&)) {
  const json expected = ask(s.reference_port(), alias);
  if (s.over_workers()) {
    EXPECT_EQ(ask(s.served_port(), alias), expected) << "the swarm's answers differ from the monolithic ones";
  }
  return expected;
}

class OpenAiClient : public ::testing::TestWithParam<ServedModel> {};
class AgentClients : public ::testing::TestWithParam<ServedModel> {};

// Chat, streamed chat, completion, models.list(), 400 and 401 through the openai client; on the trained model
// with its own template (ChatML).
TEST_P(OpenAiClient, ChatStreamCompletionModelsAndErrors) {
  if (skip_npm()) {
    ESSAIM_SKIP_MISSING_DEP(essaim::test_support::Dep::NODE_NPM, "ESSAIM_SKIP_NPM=1 asks to skip this test");
  }
  const Servers s = start_servers(GetParam(), {.synth_model = tiny_model_path(), .trained_template_file = "",
      .flags = {"-np", "2", "-c", "512", "-t", "1", "--api-key", kApiKey, "--alias", "tiny-swarm"}});
  ASSERT_TRUE(servers_ready(s));
  const json expected = expected_answers(s, "tiny-swarm", openai_client_expected);
  ASSERT_FALSE(HasFailure()) << expected.dump();
  int rc = -1;
  const std::string out = run_js("openai_client.mjs", "http://127.0.0.1:" + std::to_string(s.served_port()) + "/v1", expected, rc);
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0)
      << "the openai client test failed (exit " << (WIFEXITED(rc) ? WEXITSTATUS(rc) : -1)
      << "); set ESSAIM_SKIP_NPM=1 to skip this test deliberately. Output:\n" << out;
  EXPECT_NE(out.find("openai client: 6 checks passed"), std::string::npos) << out;
}

// The agent-API servers: -np 2, --reasoning-budget 3 (every answer thinks, then answers), a context of 2,048 (the
// Qwen3.5 template's tool preamble is 666 tokens in the trained model's vocabulary); the qwen35moe synth model
// (its own template opens <think>), the trained model with the real Qwen3.5 template from a file (its own is
// ChatML).
Servers start_agent_servers(ServedModel which) {
  const std::string synth =
      which == ServedModel::SYNTH ? backbone::testing::SwarmModel::get({.arch = SynthArch::QWEN35MOE}).path : "";
  return start_servers(which, {.synth_model = synth,
      .trained_template_file = std::string(ESSAIM_SOURCE_DIR) + "/tests/text/data/templates/qwen35.jinja",
      .flags = {"-np", "2", "-c", "2048", "-t", "1", "--reasoning-budget", "3", "--alias", kAgentAlias}});
}

// Reasoning split, enable_thinking through the template, a tool round trip, and constrained decoding (tool_choice
// named and "required", json_schema and json_object, a refused keyword), with the openai client and
// --reasoning-budget 3.
TEST_P(AgentClients, OpenAiReasoningAndToolRoundTrip) {
  if (skip_npm()) {
    ESSAIM_SKIP_MISSING_DEP(essaim::test_support::Dep::NODE_NPM, "ESSAIM_SKIP_NPM=1 asks to skip this test");
  }
  const Servers s = start_agent_servers(GetParam());
  ASSERT_TRUE(servers_ready(s));
  const json expected = expected_answers(s, kAgentAlias, openai_agents_expected);
  ASSERT_FALSE(HasFailure()) << expected.dump();
  int rc = -1;
  const std::string out = run_js("openai_agents.mjs", "http://127.0.0.1:" + std::to_string(s.served_port()) + "/v1", expected, rc);
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << "exit " << (WIFEXITED(rc) ? WEXITSTATUS(rc) : -1) << ":\n" << out;
  EXPECT_NE(out.find("openai agents: 7 checks passed"), std::string::npos) << out;
}

// The official @anthropic-ai/sdk client on POST /v1/messages (tests/serve/js/anthropic_client.mjs): thinking and
// text blocks, streaming, thinking disabled, a tool round trip, errors.
TEST_P(AgentClients, AnthropicMessagesStreamingThinkingAndToolUse) {
  if (skip_npm()) {
    ESSAIM_SKIP_MISSING_DEP(essaim::test_support::Dep::NODE_NPM, "ESSAIM_SKIP_NPM=1 asks to skip this test");
  }
  const Servers s = start_agent_servers(GetParam());
  ASSERT_TRUE(servers_ready(s));
  const json expected = expected_answers(s, kAgentAlias, anthropic_expected);
  ASSERT_FALSE(HasFailure()) << expected.dump();
  int rc = -1;
  const std::string out = run_js("anthropic_client.mjs", "http://127.0.0.1:" + std::to_string(s.served_port()), expected, rc);
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << "exit " << (WIFEXITED(rc) ? WEXITSTATUS(rc) : -1) << ":\n" << out;
  EXPECT_NE(out.find("anthropic client: 6 checks passed"), std::string::npos) << out;
}

const auto kServedModels = ::testing::Values(ServedModel::SYNTH, ServedModel::TRAINED, ServedModel::TRAINED_OVER_WORKERS);
INSTANTIATE_TEST_SUITE_P(Models, OpenAiClient, kServedModels, served_model_name);
INSTANTIATE_TEST_SUITE_P(Models, AgentClients, kServedModels, served_model_name);

}  // namespace
}  // namespace essaim::serve::testing
