// The coordinator's HTTP API over real loopback HTTP: an in-process Coordinator on a SQLite store, a
// hand-built catalogue of slice files filled with seeded random bytes. Identity and tokens, heartbeats and
// expiry, demand, volunteering, the map, work and rewards, downloads with Range; hostile clients (bad JSON,
// oversized bodies, wrong and revoked tokens, path traversal, bad Range headers) get the right status.
#include <gtest/gtest.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "coord/coordinator.h"
#include "http_client.h"
#include "raw_http_client.h"
#include "slice/model_identity.h"
#include "temp_dir.h"

namespace essaim::coord {
namespace {

using json = nlohmann::json;
using testing::request;
using testing::Reply;
using namespace std::chrono_literals;

const std::string kAdmin = "admin-token-for-tests-0123456789";

class ApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = essaim::testing::make_temp_dir(std::string("essaim-api-") +
                                          ::testing::UnitTest::GetInstance()->current_test_info()->name());
    Catalogue cat;
    cat.model_identity = std::string(64, 'a');
    cat.architecture = "qwen3moe";
    cat.n_layers = 2;
    cat.n_experts = 8;
    cat.n_expert_used = 2;
    cat.protocol_version = 2;
    cat.kernel_abi = "1";
    std::mt19937 rng(7);
    for (int64_t l : {0, 1}) {
      for (int64_t f : {0, 4}) {
        const std::string name = "m.L0" + std::to_string(l) + ".E00" + std::to_string(f) + ".gguf";
        const size_t n = (l == 1 && f == 4) ? size_t(6 << 20) + 123 : 1000 + size_t(l * 100 + f);
        std::string bytes(n, '\0');
        for (char& c : bytes) c = char(rng());
        std::ofstream(dir_ / name, std::ios::binary) << bytes;
        cat.slices.push_back({name, l, f, 4, int64_t(n),
                              digest_hex(sha256({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}))});
        contents_[name] = bytes;
      }
    }
    auto store = open_store((dir_ / "coord.sqlite").string());
    ASSERT_TRUE(store) << store.status().message();
    coord_ = std::make_unique<Coordinator>(std::move(cat), std::move(*store),
                                           CoordinatorConfig{.admin_token = kAdmin, .slices_dir = dir_.string(),
                                                             .replicas = 1, .heartbeat_s = 10, .threads = 4,
                                                             .now_ms = [this] { return now_.load(); }});
    auto server = coord_->listen("127.0.0.1", 0);
    ASSERT_TRUE(server) << server.status().message();
    server_ = std::move(*server);
    port_ = server_->port();
  }
  void TearDown() override {
    if (server_) server_->stop();
    if (coord_) coord_->stop();
    server_.reset();
    coord_.reset();
    std::filesystem::remove_all(dir_);
  }
  std::pair<std::string, std::string> add_node(const std::string& name) {
    Reply r = request(port_, "POST", "/api/nodes", json{{"name", name}}.dump(), kAdmin);
    EXPECT_EQ(r.status, 201) << r.body;
    return {r.j()["node_id"], r.j()["token"]};
  }
  json holding(size_t i) {
    const CatalogueSlice& s = coord_->catalogue().slices[i];
    return {{"layer", s.layer}, {"expert_first", s.expert_first}, {"expert_count", s.expert_count}, {"sha256", s.sha256}};
  }
  Reply heartbeat(const std::string& id, const std::string& token, const json& holdings, int port = 9000,
                  int64_t capacity = 1 << 30, bool leaving = false) {
    json b = {{"node_id", id}, {"address", "127.0.0.1:" + std::to_string(port)},
              {"fingerprint", {{"model_identity", std::string(64, 'a')}, {"protocol_version", 2}, {"kernel_abi", "1"}}},
              {"holdings", holdings}, {"capacity_bytes", capacity}, {"load", 0.5}};
    if (leaving) b["leaving"] = true;
    return request(port_, "POST", "/api/expert-coverage", b.dump(), token);
  }

  std::filesystem::path dir_;
  std::map<std::string, std::string> contents_;
  std::atomic<int64_t> now_{1'700'000'000'000};
  std::unique_ptr<Coordinator> coord_;
  std::unique_ptr<net::HttpServer> server_;
  uint16_t port_ = 0;
};

TEST_F(ApiTest, IdentityAndTokens) {
  auto [id, token] = add_node("phone-7");
  EXPECT_EQ(id.size(), 18u);
  EXPECT_EQ(token.size(), 64u);
  Reply who = request(port_, "GET", "/api/whoami", "", token);
  ASSERT_EQ(who.status, 200);
  EXPECT_EQ(who.j()["node_id"], id);
  EXPECT_EQ(who.j()["name"], "phone-7");
  std::string wrong = token;
  wrong[0] = wrong[0] == 'a' ? 'b' : 'a';
  for (const std::string& t : {std::string(), wrong, std::string("x"), kAdmin + "x"}) {
    EXPECT_EQ(request(port_, "GET", "/api/whoami", "", t).status, 401) << t;
  }
  EXPECT_EQ(request(port_, "POST", "/api/nodes", R"({"name": "x"})", token).status, 403);  // a node is not admin
  ASSERT_EQ(request(port_, "DELETE", "/api/nodes/" + id, "", kAdmin).status, 200);
  EXPECT_EQ(request(port_, "GET", "/api/whoami", "", token).status, 401);
  EXPECT_EQ(request(port_, "GET", "/slices/m.L00.E000.gguf", "", token).status, 401);
  EXPECT_EQ(request(port_, "DELETE", "/api/nodes/n-ffffffffffffffff", "", kAdmin).status, 404);
  Reply nodes = request(port_, "GET", "/api/nodes", "", kAdmin);
  ASSERT_EQ(nodes.status, 200);
  EXPECT_EQ(nodes.j()["nodes"][0]["revoked"], true);
  EXPECT_EQ(request(port_, "GET", "/health").status, 200);
  EXPECT_EQ(request(port_, "GET", "/api/model").status, 401);
}

TEST_F(ApiTest, HeartbeatDemandVolunteerMapAndExpiry) {
  auto [a, ta] = add_node("a");
  auto [b, tb] = add_node("b");
  json bad_sha = holding(1);
  bad_sha["sha256"] = std::string(64, '0');
  Reply hb = heartbeat(a, ta, {holding(0), bad_sha});
  ASSERT_EQ(hb.status, 200) << hb.body;
  EXPECT_EQ(hb.j()["accepted_holdings"], 1);
  EXPECT_EQ(hb.j()["fingerprint_ok"], true);
  EXPECT_EQ(hb.j()["rejected_holdings"].size(), 1u);
  EXPECT_EQ(heartbeat(a, tb, json::array()).status, 403);  // b's token for a's id
  Reply demand = request(port_, "GET", "/api/expert-demand", "", tb);
  ASSERT_EQ(demand.status, 200);
  const json ranges = demand.j()["ranges"];
  ASSERT_EQ(ranges.size(), 4u);
  EXPECT_EQ(ranges[3]["holders"], 1);  // slice 0, covered, sorts last
  EXPECT_EQ(ranges[3]["scarcity"], 0.0);
  // Two volunteers with room for one small slice each get different ones.
  Reply v1 = request(port_, "POST", "/api/expert-volunteer", json{{"node_id", b}, {"budget_bytes", 1200}}.dump(), tb);
  auto [c, tc] = add_node("c");
  Reply v2 = request(port_, "POST", "/api/expert-volunteer", json{{"node_id", c}, {"budget_bytes", 1200}}.dump(), tc);
  ASSERT_EQ(v1.status, 200) << v1.body;
  ASSERT_EQ(v1.j()["assign"].size(), 1u);
  ASSERT_EQ(v2.j()["assign"].size(), 1u);
  EXPECT_EQ(v1.j()["assign"][0]["name"], "m.L00.E004.gguf");
  EXPECT_EQ(v2.j()["assign"][0]["name"], "m.L01.E000.gguf");
  // Asking again: the same answer (its own reservation is offered again).
  Reply v1b = request(port_, "POST", "/api/expert-volunteer", json{{"node_id", b}, {"budget_bytes", 1200}}.dump(), tb);
  EXPECT_EQ(v1b.j()["assign"], v1.j()["assign"]);
  Reply map = request(port_, "GET", "/api/expert-map", "", tb);
  ASSERT_EQ(map.status, 200);
  EXPECT_EQ(map.j()["format"], "essaim-expert-map");
  ASSERT_EQ(map.j()["workers"].size(), 1u);
  EXPECT_EQ(map.j()["workers"][0]["label"], a);
  const json gen0 = map.j()["generation"];
  ASSERT_EQ(heartbeat(b, tb, json::array({holding(1)}), 9001).status, 200);
  Reply map2 = request(port_, "GET", "/api/expert-map", "", tb);
  EXPECT_EQ(map2.j()["workers"].size(), 2u);
  EXPECT_NE(map2.j()["generation"], gen0);
  // a goes silent for more than 3 heartbeats; b keeps beating.
  now_ += 31'000;
  ASSERT_EQ(heartbeat(b, tb, json::array({holding(1)}), 9001).status, 200);
  Reply map3 = request(port_, "GET", "/api/expert-map", "", tb);
  ASSERT_EQ(map3.j()["workers"].size(), 1u);
  EXPECT_EQ(map3.j()["workers"][0]["label"], b);
  Reply d2 = request(port_, "GET", "/api/expert-demand", "", tb);
  EXPECT_EQ(d2.j()["ranges"][0]["slice"], "m.L00.E000.gguf");  // a's slice is scarce again
  // A fingerprint of another build is stored but never a holder.
  auto [d, td] = add_node("d");
  json other = {{"node_id", d}, {"address", "127.0.0.1:9003"},
                {"fingerprint", {{"model_identity", std::string(64, 'a')}, {"protocol_version", 2}, {"kernel_abi", "2"}}},
                {"holdings", json::array({holding(2)})}, {"capacity_bytes", 1}, {"load", 0}};
  Reply hd = request(port_, "POST", "/api/expert-coverage", other.dump(), td);
  EXPECT_EQ(hd.j()["fingerprint_ok"], false);
  EXPECT_EQ(request(port_, "GET", "/api/expert-map", "", tb).j()["workers"].size(), 1u);
}

TEST_F(ApiTest, AReservationOfANodeThatWentSilentStopsCounting) {
  auto volunteer = [&](const std::string& id, const std::string& token) {
    return request(port_, "POST", "/api/expert-volunteer", json{{"node_id", id}, {"budget_bytes", 1200}}.dump(), token);
  };
  auto [e, te] = add_node("e");
  ASSERT_EQ(heartbeat(e, te, json::array()).status, 200);
  Reply ve = volunteer(e, te);
  ASSERT_EQ(ve.j()["assign"].size(), 1u) << ve.body;
  const json taken = ve.j()["assign"][0]["name"];
  // While e is alive its reservation counts as a holder: another volunteer gets another slice.
  auto [f, tf] = add_node("f");
  Reply vf = volunteer(f, tf);
  ASSERT_EQ(vf.j()["assign"].size(), 1u);
  EXPECT_NE(vf.j()["assign"][0]["name"], taken);
  // e is killed mid-download (silent for more than 3 heartbeats): its slice is offered to the next volunteer.
  now_ += 31'000;
  auto [g, tg] = add_node("g");
  Reply vg = volunteer(g, tg);
  ASSERT_EQ(vg.j()["assign"].size(), 1u);
  EXPECT_EQ(vg.j()["assign"][0]["name"], taken);
}

TEST_F(ApiTest, UsageWorkRewardsAndDrop) {
  auto [a, ta] = add_node("a");
  ASSERT_EQ(heartbeat(a, ta, {holding(0), holding(2)}).status, 200);
  Reply u = request(port_, "POST", "/api/expert-usage",
                    R"({"layers": [{"layer": 1, "counts": [0, 0, 0, 0, 9, 9, 9, 9]}]})", kAdmin);
  ASSERT_EQ(u.status, 200) << u.body;
  Reply demand = request(port_, "GET", "/api/expert-demand", "", ta);
  EXPECT_EQ(demand.j()["ranges"][0]["slice"], "m.L01.E004.gguf");  // all picks of layer 1 go there
  EXPECT_EQ(demand.j()["ranges"][0]["usage"], 1.0);
  Reply w = request(port_, "POST", "/api/work",
                    R"({"reports": [{"address": "127.0.0.1:9000", "pairs_accepted": 1234, "audits": 10, "audits_failed": 0},
                                    {"address": "10.9.9.9:1", "pairs_accepted": 1, "audits": 0, "audits_failed": 0}]})", kAdmin);
  ASSERT_EQ(w.status, 200) << w.body;
  EXPECT_EQ(w.j()["unknown_addresses"][0], "10.9.9.9:1");
  Reply r = request(port_, "GET", "/api/rewards", "", ta);
  EXPECT_EQ(r.j()["nodes"][0]["pairs_credited"], 1234);
  EXPECT_EQ(r.j()["nodes"][0]["status"], "active");
  ASSERT_EQ(request(port_, "POST", "/api/work",
                    R"({"reports": [{"address": "127.0.0.1:9000", "pairs_accepted": 6, "audits": 2, "audits_failed": 1}]})",
                    kAdmin).status, 200);
  r = request(port_, "GET", "/api/rewards", "", ta);
  EXPECT_EQ(r.j()["nodes"][0]["status"], "dropped");
  EXPECT_EQ(r.j()["nodes"][0]["withheld"], 1240);
  EXPECT_EQ(r.j()["nodes"][0]["pairs_credited"], 0);
  EXPECT_NE(r.j()["nodes"][0]["reason"].get<std::string>().find("failed 1 of 2"), std::string::npos);
  EXPECT_TRUE(request(port_, "GET", "/api/expert-map", "", ta).j()["workers"].empty());
  Reply dash = request(port_, "GET", "/api/dashboard");
  ASSERT_EQ(dash.status, 200);
  EXPECT_EQ(dash.j()["nodes"][0]["status"], "dropped");
  EXPECT_EQ(dash.body.find("127.0.0.1"), std::string::npos);  // the public page shows no addresses
  Reply metrics = request(port_, "GET", "/metrics");
  EXPECT_NE(metrics.body.find("essaim_coord_nodes{status=\"dropped\"} 1"), std::string::npos) << metrics.body;
}

// Issue 41 over HTTP (1 replica wanted): a full node is told by its heartbeat to volunteer and is offered a
// swap of a range that keeps another holder for a hole; the other holder is not offered the same give-up;
// a leaving heartbeat empties a node's holdings at once; usage decays with its half-life (1 day here).
TEST_F(ApiTest, TheMarketHealsByASwapALeaveAndDecayingUsage) {
  auto [a, ta] = add_node("a");
  auto [b, tb] = add_node("b");
  const int64_t s0 = 1000, s1 = 1004;  // slice bytes (slice 2: 1,100; slice 3 is 6 MiB: fits no one)
  ASSERT_EQ(heartbeat(b, tb, json::array({holding(1)}), 9001, s1).status, 200);
  Reply hb = heartbeat(a, ta, json::array({holding(0), holding(1)}), 9000, s0 + s1 + 100);
  ASSERT_EQ(hb.status, 200);
  EXPECT_EQ(hb.j()["volunteer"], true) << "full, yet it can move slice 1 (held twice) to the hole at slice 2";
  const auto volunteer = [&](const std::string& id, const std::string& token, int64_t budget, json held) {
    return request(port_, "POST", "/api/expert-volunteer",
                   json{{"node_id", id}, {"budget_bytes", budget}, {"holding", held}}.dump(), token);
  };
  Reply v = volunteer(a, ta, s0 + s1 + 100, json::array({holding(0), holding(1)}));
  ASSERT_EQ(v.status, 200) << v.body;
  EXPECT_TRUE(v.j()["assign"].empty()) << v.body;
  ASSERT_EQ(v.j()["swap"].size(), 1u) << v.body;
  EXPECT_EQ(v.j()["swap"][0]["take"]["name"], coord_->catalogue().slices[2].name);
  EXPECT_EQ(v.j()["swap"][0]["give_up"]["expert_first"], coord_->catalogue().slices[1].expert_first);
  EXPECT_EQ(v.j()["swap"][0]["give_up"]["layer"], coord_->catalogue().slices[1].layer);
  // b holds slice 1 too, but a is giving it up: b must keep it (and is not told to volunteer).
  Reply vb = volunteer(b, tb, s1, json::array({holding(1)}));
  ASSERT_EQ(vb.status, 200);
  EXPECT_TRUE(vb.j()["swap"].empty()) << vb.body;
  EXPECT_EQ(heartbeat(b, tb, json::array({holding(1)}), 9001, s1).j()["volunteer"], false);
  // a takes slice 2 first, then gives slice 1 up: slice 1 keeps b meanwhile.
  ASSERT_EQ(heartbeat(a, ta, json::array({holding(0), holding(1), holding(2)}), 9000, s0 + s1 + 100).status, 200);
  ASSERT_EQ(heartbeat(a, ta, json::array({holding(0), holding(2)}), 9000, s0 + s1 + 100).status, 200);
  json demand = request(port_, "GET", "/api/expert-demand", "", ta).j();
  std::map<std::string, int64_t> holders;
  for (const json& r : demand["ranges"]) holders[r["slice"]] = r["holders"];
  EXPECT_EQ(holders[coord_->catalogue().slices[1].name], 1);
  EXPECT_EQ(holders[coord_->catalogue().slices[2].name], 1);

  // b leaves (SIGTERM): its range has no holder at once, without 3 missed heartbeats.
  Reply bad = heartbeat(b, tb, json::array({holding(1)}), 9001, s1, /*leaving=*/true);
  EXPECT_EQ(bad.status, 400) << "a leaving node holds nothing";
  ASSERT_EQ(heartbeat(b, tb, json::array(), 9001, s1, /*leaving=*/true).status, 200);
  demand = request(port_, "GET", "/api/expert-demand", "", ta).j();
  for (const json& r : demand["ranges"]) {
    if (r["slice"] == coord_->catalogue().slices[1].name) {
      EXPECT_EQ(r["holders"], 0) << r.dump();
    }
  }

  // The dashboard: public, without addresses; with the admin token, with them.
  EXPECT_EQ(request(port_, "GET", "/api/dashboard").body.find("127.0.0.1"), std::string::npos);
  json dash = request(port_, "GET", "/api/dashboard", "", kAdmin).j();
  std::map<std::string, json> by_name;  // the dashboard orders nodes by id, which is random
  for (const json& n : dash["nodes"]) by_name[n["name"]] = n;
  ASSERT_EQ(by_name.size(), 2u) << dash.dump();
  EXPECT_EQ(by_name["a"]["address"], "127.0.0.1:9000") << dash.dump();
  EXPECT_EQ(by_name["b"]["address"], "127.0.0.1:9001") << dash.dump();
  EXPECT_EQ(by_name["a"]["role"], "worker");
  EXPECT_FALSE(dash["coverage_history"].empty());

  // Usage: experts 0-3 picked 300 times each, then a day (one half-life) later experts 4-7 as often: the
  // first report counts half, so range 4-7 has 2/3 of the layer's picks, not 1/2.
  const auto report = [&](int64_t first) {
    json counts = json::array();
    for (int e = 0; e < 8; ++e) counts.push_back(e >= first && e < first + 4 ? 300 : 0);
    return request(port_, "POST", "/api/expert-usage", json{{"layers", {{{"layer", 0}, {"counts", counts}}}}}.dump(),
                   kAdmin).status;
  };
  ASSERT_EQ(report(0), 200);
  now_ += 86400 * 1000;
  ASSERT_EQ(report(4), 200);
  demand = request(port_, "GET", "/api/expert-demand", "", kAdmin).j();
  for (const json& r : demand["ranges"]) {
    if (r["layer"] == 0 && r["expert_first"] == 4) {
      EXPECT_NEAR(r["usage"].get<double>(), 2.0 / 3.0, 1e-3) << r.dump();
    }
  }
}

TEST_F(ApiTest, WorkIsReportedByBackbonesOnly) {
  auto [a, ta] = add_node("a");
  ASSERT_EQ(heartbeat(a, ta, json::array({holding(0)})).status, 200);
  const std::string report =
      R"({"reports": [{"address": "127.0.0.1:9000", "pairs_accepted": 5, "audits": 1, "audits_failed": 0}]})";
  // A worker's token credits nothing, not even itself, and cannot blame another.
  EXPECT_EQ(request(port_, "POST", "/api/work", report, ta).status, 403);
  Reply reg = request(port_, "POST", "/api/nodes", R"({"name": "bb", "role": "backbone"})", kAdmin);
  ASSERT_EQ(reg.status, 201) << reg.body;
  EXPECT_EQ(reg.j()["role"], "backbone");
  const std::string bb = reg.j()["node_id"], tbb = reg.j()["token"];
  EXPECT_EQ(request(port_, "GET", "/api/whoami", "", tbb).j()["role"], "backbone");
  ASSERT_EQ(request(port_, "POST", "/api/work", report, tbb).status, 200);
  int64_t credited = -1;
  const json rewards = request(port_, "GET", "/api/rewards", "", ta).j();
  for (const json& n : rewards["nodes"])
    if (n["node_id"] == a) credited = n["pairs_credited"];
  EXPECT_EQ(credited, 5);
  // A backbone holds no experts: it neither heartbeats holdings nor volunteers.
  EXPECT_EQ(heartbeat(bb, tbb, json::array({holding(1)})).status, 403);
  EXPECT_EQ(request(port_, "POST", "/api/expert-volunteer", json{{"node_id", bb}, {"budget_bytes", 1200}}.dump(), tbb).status,
            403);
  EXPECT_EQ(request(port_, "POST", "/api/nodes", R"({"name": "x", "role": "king"})", kAdmin).status, 400);
}

// Usage steers demand (which ranges look scarce), so only a backbone reports it: a worker's token is refused
// with 403 and a message saying who may, and the refused report changes nothing.
TEST_F(ApiTest, UsageIsReportedByBackbonesOnly) {
  auto [a, ta] = add_node("a");
  ASSERT_EQ(heartbeat(a, ta, json::array({holding(0)})).status, 200);
  const std::string layer1_hot = R"({"layers": [{"layer": 1, "counts": [0, 0, 0, 0, 9, 9, 9, 9]}]})";
  const std::string layer1_cold = R"({"layers": [{"layer": 1, "counts": [9, 9, 9, 9, 0, 0, 0, 0]}]})";
  Reply refused = request(port_, "POST", "/api/expert-usage", layer1_hot, ta);
  EXPECT_EQ(refused.status, 403) << refused.body;
  EXPECT_NE(refused.body.find("usage is reported by backbones"), std::string::npos) << refused.body;
  EXPECT_EQ(refused.j()["error"]["code"], "forbidden") << refused.body;
  Reply demand = request(port_, "GET", "/api/expert-demand", "", ta);
  const json before = demand.j();  // a named document: ranging over a temporary's member would dangle
  for (const json& r : before["ranges"])
    if (r["layer"] == 1) {
      EXPECT_EQ(r["usage"], 0.5) << "a refused report changed the demand: " << demand.body;
    }

  Reply reg = request(port_, "POST", "/api/nodes", R"({"name": "bb", "role": "backbone"})", kAdmin);
  ASSERT_EQ(reg.status, 201) << reg.body;
  Reply accepted = request(port_, "POST", "/api/expert-usage", layer1_cold, reg.j()["token"]);
  EXPECT_EQ(accepted.status, 200) << accepted.body;
  EXPECT_EQ(request(port_, "POST", "/api/expert-usage", layer1_cold, kAdmin).status, 200);
  demand = request(port_, "GET", "/api/expert-demand", "", ta);
  const json after = demand.j();
  for (const json& r : after["ranges"])
    if (r["layer"] == 1) {
      EXPECT_EQ(r["usage"], r["expert_first"] == 0 ? 1.0 : 0.0) << demand.body;
    }
}

// A heartbeat (and a volunteer's `holding`) listing one range more than once is refused with 400 naming the
// repeat; the node's holdings stay what its last valid heartbeat said. Counting it once would do too, but
// the answer would then report fewer holdings than were sent: a client that repeats is broken and is told.
TEST_F(ApiTest, AHeartbeatRepeatingAHoldingIsRefused) {
  auto [a, ta] = add_node("a");
  ASSERT_EQ(heartbeat(a, ta, json::array({holding(0), holding(1)})).j()["accepted_holdings"], 2);
  json repeated = json::array();
  for (int i = 0; i < 8000; ++i) repeated.push_back(holding(2));
  Reply r = heartbeat(a, ta, repeated);
  EXPECT_EQ(r.status, 400) << r.body.substr(0, 300);
  EXPECT_NE(r.body.find("holdings[1] repeats holdings[0] (layer 1, experts 0-3)"), std::string::npos) << r.body;
  Reply twice = heartbeat(a, ta, json::array({holding(3), holding(1), holding(3)}));
  EXPECT_EQ(twice.status, 400) << twice.body;
  EXPECT_NE(twice.body.find("holdings[2] repeats holdings[0]"), std::string::npos) << twice.body;
  // Still the holdings of the last valid heartbeat.
  const json map = request(port_, "GET", "/api/expert-map", "", ta).j();
  ASSERT_EQ(map["workers"].size(), 1u) << map.dump();
  EXPECT_EQ(map["workers"][0]["holdings"].size(), 2u) << map.dump();
  EXPECT_EQ(map["workers"][0]["holdings"][0]["layer"], 0) << map.dump();
  json holding_twice = {{"node_id", a}, {"budget_bytes", 1200},
                        {"holding", json::array({{{"layer", 0}, {"expert_first", 0}, {"expert_count", 4}},
                                                 {{"layer", 0}, {"expert_first", 0}, {"expert_count", 4}}})}};
  Reply v = request(port_, "POST", "/api/expert-volunteer", holding_twice.dump(), ta);
  EXPECT_EQ(v.status, 400) << v.body;
  EXPECT_NE(v.body.find("holding[1] repeats holding[0]"), std::string::npos) << v.body;
}

TEST_F(ApiTest, DownloadsWithRange) {
  auto [a, ta] = add_node("a");
  const std::string big = "m.L01.E004.gguf";
  const std::string& bytes = contents_[big];
  const auto t0 = std::chrono::steady_clock::now();
  Reply whole = request(port_, "GET", "/slices/" + big, "", ta);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(whole.status, 200);
  EXPECT_TRUE(whole.body == bytes) << "the body differs from the file (" << whole.body.size() << " bytes)";
  EXPECT_EQ(whole.headers["Content-Length"], std::to_string(bytes.size()));
  EXPECT_EQ(whole.headers["Accept-Ranges"], "bytes");
  EXPECT_EQ(whole.headers["X-Essaim-Sha256"], coord_->catalogue().slices[3].sha256);
  std::printf("download of %zu bytes over loopback: %.0f MB/s\n", bytes.size(), double(bytes.size()) / s / 1e6);
  Reply part = request(port_, "GET", "/slices/" + big, "", ta, {{"Range", "bytes=1048570-1048580"}});
  ASSERT_EQ(part.status, 206);
  EXPECT_EQ(part.body, bytes.substr(1048570, 11));
  EXPECT_EQ(part.headers["Content-Range"], "bytes 1048570-1048580/" + std::to_string(bytes.size()));
  Reply tail = request(port_, "GET", "/slices/" + big, "", ta, {{"Range", "bytes=6291000-"}});
  ASSERT_EQ(tail.status, 206);
  EXPECT_EQ(tail.body, bytes.substr(6291000));
  Reply past = request(port_, "GET", "/slices/" + big, "", ta, {{"Range", "bytes=99999999-"}});
  EXPECT_EQ(past.status, 416);
  EXPECT_EQ(past.headers["Content-Range"], "bytes */" + std::to_string(bytes.size()));
  for (const char* bad : {"bytes=9-1", "bytes=x-", "chunks=0-1", "bytes=0-1,4-5"}) {
    EXPECT_EQ(request(port_, "GET", "/slices/" + big, "", ta, {{"Range", bad}}).status, 400) << bad;
  }
  EXPECT_EQ(request(port_, "GET", "/slices/" + big, "", kAdmin).status, 200);  // the admin token too
  EXPECT_EQ(request(port_, "GET", "/slices/" + big).status, 401);
  for (const char* name : {"../coord.sqlite", "..%2fcoord.sqlite", "coord.sqlite", "", "m.L01.E004.gguf/",
                          "./m.L00.E000.gguf", "%2e%2e/x"}) {
    EXPECT_EQ(request(port_, "GET", std::string("/slices/") + name, "", ta).status, 404) << name;
  }
}

// Two coordinators on one database (as two processes would share it): a node registered on one is known to
// the other, and volunteers asking both at the same time are all given different slices.
TEST_F(ApiTest, TwoCoordinatorsShareOneDatabase) {
  auto store2 = open_store((dir_ / "coord.sqlite").string());
  ASSERT_TRUE(store2) << store2.status().message();
  Coordinator second(coord_->catalogue(), std::move(*store2),
                     CoordinatorConfig{.admin_token = kAdmin, .slices_dir = dir_.string(), .replicas = 1,
                                       .heartbeat_s = 10, .threads = 4, .now_ms = [this] { return now_.load(); }});
  auto server2 = second.listen("127.0.0.1", 0);
  ASSERT_TRUE(server2);
  const uint16_t port2 = (*server2)->port();
  std::vector<std::pair<std::string, std::string>> nodes;
  for (int i = 0; i < 6; ++i) nodes.push_back(add_node("v" + std::to_string(i)));
  EXPECT_EQ(request(port2, "GET", "/api/whoami", "", nodes[0].second).status, 200);
  std::vector<std::string> got(nodes.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < nodes.size(); ++i) {
    threads.emplace_back([&, i] {
      Reply r = request(i % 2 ? port2 : port_, "POST", "/api/expert-volunteer",
                        json{{"node_id", nodes[i].first}, {"budget_bytes", 1 << 30}}.dump(), nodes[i].second);
      if (r.status == 200 && r.j()["assign"].size() == 4) got[i] = "all";  // the first asker may take them all
      else if (r.status == 200) got[i] = std::to_string(r.j()["assign"].size());
    });
  }
  for (std::thread& t : threads) t.join();
  // Budgets fit everything: whoever asks first is given all 4 (each reserved once); every later asker
  // sees them reserved and gets nothing.
  EXPECT_EQ(std::count(got.begin(), got.end(), "all"), 1) << ::testing::PrintToString(got);
  EXPECT_EQ(std::count(got.begin(), got.end(), "0"), 5) << ::testing::PrintToString(got);
  (*server2)->stop();
  second.stop();
}

TEST_F(ApiTest, HostileBodies) {
  auto [a, ta] = add_node("a");
  for (const std::string& body : {std::string("{"), std::string("[1,2]"), std::string("\xff\xfe"), std::string("{\"node_id\": 5}"),
                                  std::string(R"({"node_id": "n-0000000000000000", "budget_bytes": "lots"})")}) {
    EXPECT_EQ(request(port_, "POST", "/api/expert-volunteer", body, ta).status, 400) << body;
    EXPECT_EQ(request(port_, "POST", "/api/expert-coverage", body, ta).status, 400) << body;
    EXPECT_EQ(request(port_, "POST", "/api/work", body, kAdmin).status, 400) << body;
    EXPECT_EQ(request(port_, "POST", "/api/nodes", body, kAdmin).status, 400) << body;
  }
  EXPECT_EQ(request(port_, "POST", "/api/expert-usage", std::string((1 << 20) + 10, ' '), ta).status, 413);
  EXPECT_EQ(request(port_, "POST", "/api/expert-usage", R"({"layers": [{"layer": 0, "counts": [1]}]})", kAdmin).status, 400);
  EXPECT_EQ(request(port_, "PUT", "/api/expert-map", "", ta).status, 405);
  EXPECT_EQ(request(port_, "GET", "/api/nothing", "", ta).status, 404);
  // Still healthy afterwards.
  EXPECT_EQ(request(port_, "GET", "/api/whoami", "", ta).status, 200);
}

// The listener's hostile cases, on the coordinator (net/http_server.h; tests/net/http_server_test.cpp has
// the rest). Before: the trailer killed the process (SIGABRT), with no token checked.
TEST_F(ApiTest, AnOversizedTrailerFieldIsRefusedAndTheCoordinatorLives) {
  net::testing::RawClient c(port_);
  c.send("POST /api/expert-coverage HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\nX-Big: " +
         std::string(70000, 'a') + "\r\n\r\n");
  const std::string r = c.read_response(5s);
  EXPECT_TRUE(r.starts_with("HTTP/1.1 4")) << r.substr(0, 200);
  EXPECT_EQ(request(port_, "GET", "/health", "").status, 200);
}

// Before: the listener read the whole body (here never sent: until the 30 s read deadline) before the
// coordinator looked at the token.
TEST_F(ApiTest, AWrongTokenIsRefusedFromTheHead) {
  const auto t0 = std::chrono::steady_clock::now();
  net::testing::RawClient c(port_);
  c.send("POST /api/expert-coverage HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + std::string(64, 'f') +
         "\r\nContent-Length: 500000\r\n\r\n");
  const std::string r = c.read_response(5s);
  EXPECT_TRUE(r.starts_with("HTTP/1.1 401")) << r.substr(0, 200);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
}

// Before: any complete request — a 401, a health probe — made its connection count as authenticated, so
// 300 idle keep-alive connections held every slot and the admin's own request got 503 until they left.
TEST_F(ApiTest, RefusedAndPublicKeepAliveConnectionsCannotLockOutTheAdmin) {
  std::vector<std::unique_ptr<net::testing::RawClient>> idle;
  for (int i = 0; i < 300; ++i) {
    auto c = std::make_unique<net::testing::RawClient>(port_);
    c->send(i % 2 == 0 ? "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
                       : "GET /api/whoami HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n\r\n");
    c->read_response(5s);
    idle.push_back(std::move(c));
  }
  const auto t0 = std::chrono::steady_clock::now();
  Reply admin = request(port_, "GET", "/api/nodes", "", kAdmin);
  EXPECT_EQ(admin.status, 200) << admin.body;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
}

}  // namespace
}  // namespace essaim::coord
