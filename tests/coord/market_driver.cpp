#include "market_driver.h"

#include <gtest/gtest.h>

#include <utility>

namespace essaim::coord::testing {

namespace {

const std::string kAdmin = "admin-token-for-market-tests-0123456789";

}  // namespace

Catalogue small_catalogue() {
  Catalogue c{.model_identity = std::string(64, 'a'), .architecture = "qwen35moe", .n_layers = 3, .n_experts = 16,
              .n_expert_used = 4, .protocol_version = 3, .kernel_abi = "1", .slices = {}};
  for (int64_t l = 0; l < c.n_layers; ++l) {
    for (int64_t f = 0; f < c.n_experts; f += 4) {
      c.slices.push_back({.name = "s" + std::to_string(l) + "." + std::to_string(f), .layer = l, .expert_first = f,
                          .expert_count = 4, .bytes = 100 + 10 * ((l + f) % 3),
                          .sha256 = std::string(63, 'b') + "0123456789abcdef"[l * 4 + f / 4]});
    }
  }
  return c;
}

int64_t held_bytes(const Catalogue& cat, const std::vector<size_t>& held) {
  int64_t b = 0;
  for (size_t s : held) b += cat.slices[s].bytes;
  return b;
}

void joined_worker_turn(int64_t held_bytes, int64_t budget, std::mt19937_64& rng,
                        const std::function<bool()>& heartbeat, const std::function<bool()>& volunteer_round) {
  const bool told = heartbeat();
  if (!told && held_bytes + 100 > budget && std::uniform_int_distribution<int>(0, 4)(rng) != 0) return;
  for (int again = 0; again < 4 && volunteer_round(); ++again) heartbeat();
}

MarketDriver::MarketDriver(const Catalogue& cat, std::filesystem::path store_file, const int64_t& now)
    : cat_(cat), file_(std::move(store_file)), now_(now) {
  start();
}

MarketDriver::~MarketDriver() {
  if (coord_) coord_->stop();
}

void MarketDriver::start() {
  auto store = open_store(file_.string());
  ASSERT_TRUE(store) << store.status().message();
  store_ = store->get();
  coord_ = std::make_unique<Coordinator>(
      cat_, std::move(*store),
      CoordinatorConfig{.admin_token = kAdmin, .slices_dir = file_.parent_path().string(), .replicas = 2,
                        .heartbeat_s = 10, .threads = 1, .now_ms = [this] { return now_; }});
}

void MarketDriver::restart() {
  coord_->stop();
  coord_.reset();
  start();
}

void MarketDriver::add_node(const std::string& name) {
  const json r = call("POST", "/api/nodes", {{"name", name}}, kAdmin);
  know(name, r["node_id"], r["token"]);
}

void MarketDriver::know(const std::string& name, const std::string& id, const std::string& token) {
  ids_[name] = id;
  names_[id] = name;
  tokens_[name] = token;
}

void MarketDriver::revoke(const std::string& name) { call("DELETE", "/api/nodes/" + ids_.at(name), json(), kAdmin); }

bool MarketDriver::heartbeat(const std::string& name, const std::vector<size_t>& held, int64_t capacity,
                             bool leaving) {
  json holdings = json::array();
  if (!leaving) {
    for (size_t s : held) holdings.push_back(range(s, true));
  }
  json b = {{"node_id", ids_.at(name)}, {"address", "10.0.0.1:9000"}, {"holdings", holdings},
            {"fingerprint", {{"model_identity", cat_.model_identity}, {"protocol_version", cat_.protocol_version},
                             {"kernel_abi", cat_.kernel_abi}}},
            {"capacity_bytes", capacity}, {"load", 0}};
  if (leaving) b["leaving"] = true;
  return call("POST", "/api/expert-coverage", b, tokens_.at(name))["volunteer"];
}

MarketDriver::json MarketDriver::volunteer(const std::string& name, const std::vector<size_t>& held, int64_t budget) {
  json holding = json::array();
  for (size_t s : held) holding.push_back(range(s, false));
  const json body = {{"node_id", ids_.at(name)}, {"budget_bytes", budget}, {"holding", holding}};
  return call("POST", "/api/expert-volunteer", body, tokens_.at(name));
}

MarketDriver::json MarketDriver::expert_map() {
  json m = call("GET", "/api/expert-map", json(), kAdmin);
  for (json& w : m["workers"]) w["label"] = names_.at(w["label"]);
  m.erase("generation");
  return m;
}

MarketDriver::json MarketDriver::demand() { return call("GET", "/api/expert-demand", json(), kAdmin); }

MarketDriver::json MarketDriver::call(const std::string& method, const std::string& path, const json& body,
                                      const std::string& token) {
  const net::HttpReply r = coord_->answer({.method = method, .target = path, .body = body.is_null() ? "" : body.dump(),
                                           .authorization = "Bearer " + token, .range = ""});
  EXPECT_LT(r.status, 300) << method << " " << path << ": " << r.body;
  return r.body.empty() ? json() : json::parse(r.body);
}

MarketDriver::json MarketDriver::range(size_t slice, bool with_sha) const {
  const CatalogueSlice& c = cat_.slices[slice];
  json j = {{"layer", c.layer}, {"expert_first", c.expert_first}, {"expert_count", c.expert_count}};
  if (with_sha) j["sha256"] = c.sha256;
  return j;
}

}  // namespace essaim::coord::testing
