// Concurrency exactness over HTTP: 16 concurrent greedy requests each get exactly the answer the same
// request gets alone — monolithic, and with the experts on 3 essaim-worker processes over TCP (the swarm
// gives the monolithic answers); a quarter of them are constrained by a JSON schema.
#include <gtest/gtest.h>

#include <set>
#include <thread>

#include "backbone/expert_map.h"
#include "backbone/remote_executor.h"
#include "backbone_test_util.h"
#include "serve_test_util.h"

namespace essaim::serve::testing {
namespace {

constexpr int kRequests = 16;

std::string request_body(int i) {
  // Different prompts and lengths, so that prefill chunks and decode rows of different sequences share steps.
  std::string prompt = "Request " + std::to_string(i) + ":";
  for (int w = 0; w < i; ++w) prompt += " word" + std::to_string(w * 7 % 5);
  json body = {{"prompt", prompt}, {"max_tokens", 16}, {"temperature", 0}};
  if (i % 4 == 3)  // structured output: the mask comes after the sequence's own logits, so it changes nothing here
    body["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "r"}, {"schema",
        {{"type", "object"}, {"properties", {{"w", {{"type", "string"}}}, {"n", {{"type", "integer"}}}}}, {"required", {"w"}}}}}}};
  return body.dump();
}

std::string answer(const HttpResult& r) {
  EXPECT_EQ(r.status, 200) << r.body << r.error;
  const json j = json::parse(r.body, nullptr, false);
  if (!j.is_object() || !j.contains("choices")) return "<no answer: " + r.body + ">";
  return j["choices"][0]["text"].get<std::string>() + "|" + j["choices"][0]["finish_reason"].get<std::string>() + "|" +
         std::to_string(j["usage"]["completion_tokens"].get<int>());
}

std::vector<std::string> alone(uint16_t port) {
  std::vector<std::string> out;
  for (int i = 0; i < kRequests; ++i) out.push_back(answer(http_call(port, "POST", "/v1/completions", request_body(i))));
  return out;
}

std::vector<std::string> concurrent(uint16_t port) {
  std::vector<std::string> out(kRequests);
  std::vector<std::thread> threads;
  for (int i = 0; i < kRequests; ++i)
    threads.emplace_back([&, i] { out[size_t(i)] = answer(http_call(port, "POST", "/v1/completions", request_body(i))); });
  for (std::thread& t : threads) t.join();
  return out;
}

const std::vector<std::string>& monolithic_alone() {
  static const std::vector<std::string> answers = [] {
    auto server = start_server({.parallel = 1});
    return server ? alone(server->port()) : std::vector<std::string>();
  }();
  return answers;
}

TEST(ServeExact, SixteenConcurrentGreedyRequestsGiveTheirAloneAnswers) {
  const std::vector<std::string>& want = monolithic_alone();
  ASSERT_EQ(want.size(), size_t(kRequests));
  // The requests differ in their answers (equal answers everywhere would prove nothing).
  EXPECT_GT(std::set<std::string>(want.begin(), want.end()).size(), size_t(kRequests / 2));
  for (int i = 3; i < kRequests; i += 4) EXPECT_TRUE(want[size_t(i)].starts_with("{")) << want[size_t(i)];  // constrained
  // 8 in flight, the other 8 queue and join as slots free up; 24-token steps split the prompts into chunks.
  auto server = start_server({.parallel = 8, .batch_tokens = 24});
  ASSERT_TRUE(server);
  const std::vector<std::string> got = concurrent(server->port());
  for (int i = 0; i < kRequests; ++i) EXPECT_EQ(got[size_t(i)], want[size_t(i)]) << "request " << i;
  const SchedulerStats s = server->scheduler()->stats();
  EXPECT_GT(s.batch_sequences.count(), 0u);
  EXPECT_LT(s.steps, uint64_t(kRequests) * 16);  // sequences shared steps
}

TEST(ServeExact, SwarmOfThreeWorkerProcessesGivesTheMonolithicAnswers) {
  const std::vector<std::string>& want = monolithic_alone();
  ASSERT_EQ(want.size(), size_t(kRequests));
  const backbone::testing::SwarmModel& m = backbone::testing::SwarmModel::get({});
  std::vector<std::unique_ptr<backbone::testing::WorkerProcess>> workers;
  std::vector<std::string> addresses;
  for (const std::vector<std::string>& part : m.split_experts(3)) {
    workers.push_back(std::make_unique<backbone::testing::WorkerProcess>(part));
    ASSERT_TRUE(workers.back()->ok());
    addresses.push_back(workers.back()->address());
  }
  ExecutorChoiceFn swarm;
  swarm.make = [addresses](const Model& model, ThreadPool* pool) -> Result<std::unique_ptr<ExpertExecutor>> {
    ESSAIM_ASSIGN_OR_RETURN(backbone::ExpertMap map, backbone::expert_map_from_addresses(addresses));
    ESSAIM_ASSIGN_OR_RETURN(std::unique_ptr<backbone::RemoteExpertExecutor> ex,
                            backbone::remote_executor_for_model(model, map, pool, backbone::testing::patient_options()));
    return std::unique_ptr<ExpertExecutor>(std::move(ex));
  };
  swarm.stats = [](const ExpertExecutor& ex) -> std::optional<backbone::DispatchStats> {
    return static_cast<const backbone::RemoteExpertExecutor&>(ex).stats();
  };
  auto server = start_server({.parallel = 16, .batch_tokens = 64, .executor = swarm});
  ASSERT_TRUE(server);
  const std::vector<std::string> got = concurrent(server->port());
  for (int i = 0; i < kRequests; ++i) EXPECT_EQ(got[size_t(i)], want[size_t(i)]) << "request " << i;
  // The workers did the work: remote pairs, no fallback, and /metrics shows each worker's share.
  const std::string metrics = server->api().metrics_text();
  for (const std::string& a : addresses) {
    const std::string key = "essaim_dispatch_worker_pairs_served_total{worker=\"" + a + "\"} ";
    const size_t at = metrics.find(key);
    ASSERT_NE(at, std::string::npos) << metrics;
    EXPECT_GT(std::stod(metrics.substr(at + key.size())), 0.0) << key;
  }
  EXPECT_NE(metrics.find("essaim_dispatch_pairs_total{where=\"fallback\"} 0"), std::string::npos) << metrics;
}

}  // namespace
}  // namespace essaim::serve::testing
