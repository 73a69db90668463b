// Internals of Coordinator shared by its .cpp files (the API, the downloads, the dashboard). Not an API.
#pragma once

#include <boost/asio/thread_pool.hpp>
#include <nlohmann/json.hpp>

#include <mutex>

#include "coord/coordinator.h"
#include "coord/dashboard_history.h"
#include "coord/market_view.h"

namespace essaim::coord {

struct Caller {
  enum Kind { NONE, ADMIN, NODE } kind = NONE;
  NodeRow node;  // for NODE
};

// One API request as its handler sees it: the caller is authenticated (or the route is public).
struct ApiCall {
  const net::HttpRequestView& req;
  const std::string& path;  // the target without its query
  Caller who;
  int64_t now_ms = 0;
  bool admin() const { return who.kind == Caller::ADMIN; }
};

// Every node, holding and usage row, read in one go (the pages that list every node: metrics, dashboard).
// Decisions read MarketView's state instead: only what they need.
Result<MarketSnapshot> snapshot(Store& db);

struct Coordinator::Impl {
  const Catalogue& cat;
  std::unique_ptr<Store> store;
  CoordinatorConfig cfg;
  boost::asio::thread_pool pool;
  std::once_flag stopped;
  std::atomic<uint64_t> requests{0}, unauthorized{0}, bytes_served{0}, downloads{0}, store_errors{0};
  DashboardHistory history;
  MarketView market;

  Impl(const Catalogue& c, std::unique_ptr<Store> s, CoordinatorConfig config)
      : cat(c), store(std::move(s)), cfg(std::move(config)), pool(size_t(std::max(1, cfg.threads))),
        market(cat, {.heartbeat_s = cfg.heartbeat_s, .replicas = cfg.replicas}) {}

  int64_t now() const;
  Caller authenticate(const std::string& authorization);
  net::HttpReply route(const net::HttpRequestView& req);
  // What a volunteer holding `held` with this budget is told now (MarketView; reserves nothing).
  Result<VolunteerChoice> decide_volunteer(const std::string& node_id, const std::vector<size_t>& held,
                                           int64_t budget_bytes, int64_t now_ms);
  // One handler per endpoint (the route table in coordinator.cpp lists them).
  net::HttpReply health(const ApiCall& c);
  net::HttpReply dashboard_page(const ApiCall& c);
  net::HttpReply dashboard_api(const ApiCall& c);
  net::HttpReply metrics(const ApiCall& c);
  net::HttpReply register_node(const ApiCall& c);
  net::HttpReply revoke_node(const ApiCall& c);
  net::HttpReply list_nodes(const ApiCall& c);
  net::HttpReply whoami(const ApiCall& c);
  net::HttpReply model(const ApiCall& c);
  net::HttpReply coverage(const ApiCall& c);
  net::HttpReply demand(const ApiCall& c);
  net::HttpReply usage(const ApiCall& c);
  net::HttpReply volunteer(const ApiCall& c);
  net::HttpReply expert_map(const ApiCall& c);
  net::HttpReply work(const ApiCall& c);
  net::HttpReply rewards(const ApiCall& c);
  // GET /slices/NAME: answers through `out` (a stream), from the pool.
  void download(const net::HttpRequestView& req, const std::string& name, std::shared_ptr<net::HttpResponder> out);
  nlohmann::json dashboard_json(bool with_addresses);
  // Records a coverage sample for the dashboard's strip from these holder counts.
  void note_coverage(int64_t now_ms, const std::vector<int64_t>& holders);
};

net::HttpReply json_reply(int status, const nlohmann::json& body);
net::HttpReply error(int status, const std::string& message, const std::string& code);
net::HttpReply store_failed(const Status& st);
nlohmann::json range_json(const CatalogueSlice& s);
nlohmann::json slice_json(const CatalogueSlice& s);
// Whether (method, path) is a page anyone may read (the route table says).
bool public_page(const std::string& method, const std::string& path);
std::string dashboard_html();

}  // namespace essaim::coord
