// The market client's parsing of untrusted answers, and its calls against a real HTTP server (URLs: tests/net/http_client_test.cpp).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "node/market_client.h"
#include "net/http_server.h"

namespace essaim::node {
namespace {

const std::string kHex(64, 'a');

TEST(MarketParse, CatalogueFieldsAreValidated) {
  nlohmann::json good = {{"model_identity", kHex}, {"architecture", "qwen3moe"}, {"n_layers", 2}, {"n_experts", 8},
                         {"n_expert_used", 2}, {"protocol_version", 2}, {"kernel_abi", "7"},
                         {"slices", {{{"name", "m.L00.E000-003.gguf"}, {"layer", 0}, {"expert_first", 0},
                                      {"expert_count", 4}, {"bytes", 10}, {"sha256", kHex},
                                      {"url", "/slices/m.L00.E000-003.gguf"}}}}};
  Result<Catalogue> c = parse_catalogue(good.dump());
  ASSERT_TRUE(c) << c.status().message();
  EXPECT_EQ(c->slices.size(), 1u);
  EXPECT_EQ(c->slices[0].range, (RangeRef{0, 0, 4}));

  auto broken = [&](auto mutate) {
    nlohmann::json j = good;
    mutate(j);
    return parse_catalogue(j.dump());
  };
  EXPECT_FALSE(broken([](nlohmann::json& j) { j["model_identity"] = "abc"; }));
  EXPECT_FALSE(broken([](nlohmann::json& j) { j["n_layers"] = -1; }));
  EXPECT_FALSE(broken([](nlohmann::json& j) { j["slices"][0]["name"] = "../x"; }));
  EXPECT_FALSE(broken([](nlohmann::json& j) { j["slices"][0]["name"] = "a/b"; }));
  EXPECT_FALSE(broken([](nlohmann::json& j) { j["slices"][0]["url"] = "http://evil/x"; }));
  EXPECT_FALSE(broken([](nlohmann::json& j) { j["slices"][0]["expert_count"] = 0; }));
  EXPECT_FALSE(broken([](nlohmann::json& j) { j["slices"][0]["bytes"] = "10"; }));
  EXPECT_FALSE(broken([](nlohmann::json& j) { j["slices"] = 3; }));
  EXPECT_FALSE(parse_catalogue("[1,2"));
  EXPECT_FALSE(parse_catalogue("[]"));
}

TEST(MarketParse, VolunteerAndCoverageAnswers) {
  Result<VolunteerAnswer> v = parse_volunteer_answer(
      R"({"assign":[{"layer":1,"expert_first":4,"expert_count":4,"name":"a.gguf","bytes":5,"sha256":")" + kHex +
      R"(","url":"/slices/a.gguf"}],"drop":[{"layer":0,"expert_first":0,"expert_count":4}]})");
  ASSERT_TRUE(v) << v.status().message();
  EXPECT_EQ(v->assign.size(), 1u);
  EXPECT_EQ(v->drop.size(), 1u);
  EXPECT_FALSE(parse_volunteer_answer(R"({"drop":[]})"));
  EXPECT_FALSE(parse_volunteer_answer(R"({"assign":[{"layer":1}]})"));
  Result<CoverageAnswer> c = parse_coverage_answer(R"({"accepted_holdings":2,"heartbeat_s":1.5,"fingerprint_ok":true})");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->accepted_holdings, 2u);
  EXPECT_DOUBLE_EQ(c->heartbeat_s, 1.5);
  EXPECT_FALSE(parse_coverage_answer(R"({"accepted_holdings":2,"heartbeat_s":0,"fingerprint_ok":true})"));
  EXPECT_FALSE(parse_coverage_answer(R"({"accepted_holdings":2,"heartbeat_s":1e999,"fingerprint_ok":true})"));
  EXPECT_FALSE(parse_coverage_answer(R"({"accepted_holdings":2,"heartbeat_s":1})"));
}

TEST(MarketClientCalls, SendsTokenBodyAndReportsErrors) {
  std::string last_body, last_auth, last_target;
  std::mutex mu;
  auto server = net::HttpServer::listen("127.0.0.1", 0, {}, [&](const net::HttpRequestView& req,
                                                                std::shared_ptr<net::HttpResponder> out) {
    {
      std::lock_guard lock(mu);
      last_body = req.body;
      last_auth = req.authorization;
      last_target = req.target;
    }
    if (req.target == "/api/work") return out->reply({.status = 401, .content_type = "application/json", .body = R"({"error":{"message":"revoked","code":"x"}})", .headers = {}});
    if (req.target == "/api/expert-map") return out->reply({.status = 200, .content_type = "application/json", .body = std::string(9u << 20, ' '), .headers = {}});
    out->reply({.status = 200, .content_type = "application/json", .body = R"({"accepted_holdings":1,"heartbeat_s":2,"fingerprint_ok":false})", .headers = {}});
  });
  ASSERT_TRUE(server);
  Result<MarketClient> c = MarketClient::connect("http://127.0.0.1:" + std::to_string((*server)->port()), "tok");
  ASSERT_TRUE(c);
  Heartbeat beat{.node_id = "n-1", .address = "127.0.0.1:9", .fingerprint = {kHex, 2, "7"},
                 .holdings = {{{3, 0, 4}, kHex}}, .capacity_bytes = 100, .load = 0.5};
  Result<CoverageAnswer> a = c->heartbeat(beat);
  ASSERT_TRUE(a) << a.status().message();
  EXPECT_FALSE(a->fingerprint_ok);
  {
    std::lock_guard lock(mu);
    EXPECT_EQ(last_auth, "Bearer tok");
    EXPECT_EQ(last_target, "/api/expert-coverage");
    nlohmann::json sent = nlohmann::json::parse(last_body);
    EXPECT_EQ(sent["holdings"][0]["sha256"], kHex);
    EXPECT_EQ(sent["fingerprint"]["protocol_version"], 2);
  }
  Status w = c->report_work({{"127.0.0.1:9", 10, 1, 0}});
  ASSERT_FALSE(w);
  EXPECT_NE(w.message().find("401"), std::string::npos);
  EXPECT_NE(w.message().find("revoked"), std::string::npos);
  Result<std::string> big = c->expert_map();  // 9 MiB: over the 8 MiB bound
  EXPECT_FALSE(big) << big->size();
  EXPECT_FALSE(MarketClient::connect("http://127.0.0.1:1", ""));
}

TEST(MarketClientCalls, DeadlineOnASilentServer) {
  std::vector<std::shared_ptr<net::HttpResponder>> held;
  std::mutex mu;
  auto server = net::HttpServer::listen("127.0.0.1", 0, {}, [&](const net::HttpRequestView&,
                                                                std::shared_ptr<net::HttpResponder> out) {
    std::lock_guard lock(mu);
    held.push_back(std::move(out));  // never answers
  });
  ASSERT_TRUE(server);
  Result<MarketClient> c = MarketClient::connect("http://127.0.0.1:" + std::to_string((*server)->port()), "tok", {},
                                                 std::chrono::milliseconds(300));
  ASSERT_TRUE(c);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(c->model());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  (*server)->stop();
  std::lock_guard lock(mu);
  held.clear();  // the responders hold their sessions: release them before the server goes
}

}  // namespace
}  // namespace essaim::node
