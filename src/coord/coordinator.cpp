#include "coord/coordinator.h"

#include <boost/asio/post.hpp>
#include <openssl/crypto.h>
#include <openssl/rand.h>

#include <chrono>
#include <map>
#include <set>
#include <tuple>

#include "coord/api_parse.h"
#include "coord/coordinator_impl.h"
#include "coord/validate.h"
#include "slice/model_identity.h"
#include "net/metrics_text.h"

namespace essaim::coord {

using json = nlohmann::json;

net::HttpReply json_reply(int status, const json& body) {
  return {.status = status, .content_type = "application/json",
          .body = body.dump(-1, ' ', false, json::error_handler_t::replace), .headers = {}};
}
net::HttpReply error(int status, const std::string& message, const std::string& code) {
  return json_reply(status, {{"error", {{"message", message}, {"code", code}}}});
}

namespace {

std::string random_hex(size_t bytes) {
  std::vector<uint8_t> b(bytes);
  if (RAND_bytes(b.data(), int(b.size())) != 1) return {};
  return digest_hex(b);
}
std::string token_hash(std::string_view token) {
  return digest_hex(sha256({reinterpret_cast<const uint8_t*>(token.data()), token.size()}));
}
net::HttpReply unauthorized_reply() { return error(401, "a valid token is needed (Authorization: Bearer <token>)", "unauthorized"); }

}  // namespace

net::HttpReply store_failed(const Status& st) { return error(503, "the coordinator's store failed: " + st.message(), "store_error"); }
json range_json(const CatalogueSlice& s) {
  return {{"layer", s.layer}, {"expert_first", s.expert_first}, {"expert_count", s.expert_count}};
}
json slice_json(const CatalogueSlice& s) {
  return {{"layer", s.layer}, {"expert_first", s.expert_first}, {"expert_count", s.expert_count}, {"name", s.name},
          {"bytes", s.bytes}, {"sha256", s.sha256}, {"url", "/slices/" + s.name}};
}

Result<MarketSnapshot> snapshot(Store& db) {
  MarketSnapshot s;
  ESSAIM_ASSIGN_OR_RETURN(s.nodes, db.list_nodes());
  ESSAIM_ASSIGN_OR_RETURN(s.holdings, db.list_holdings());
  ESSAIM_ASSIGN_OR_RETURN(s.usage, db.list_usage());
  return s;
}

int64_t Coordinator::Impl::now() const {
  if (cfg.now_ms) return cfg.now_ms();
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

Caller Coordinator::Impl::authenticate(const std::string& authorization) {
  Caller c;
  if (!cfg.admin_token.empty() && net::api_key_ok(cfg.admin_token, authorization)) {
    c.kind = Caller::ADMIN;
    return c;
  }
  constexpr std::string_view kBearer = "Bearer ";
  if (authorization.size() != kBearer.size() + 64 || authorization.compare(0, kBearer.size(), kBearer) != 0) return c;
  const std::string token = authorization.substr(kBearer.size());
  if (!is_hex(token, 64)) return c;
  const std::string hash = token_hash(token);
  Result<std::optional<NodeRow>> row = store->node_by_token_sha256(hash);
  if (!row) {
    ++store_errors;
    return c;
  }
  if (!*row || (*row)->revoked || (*row)->token_sha256.size() != hash.size() ||
      CRYPTO_memcmp((*row)->token_sha256.data(), hash.data(), hash.size()) != 0) {
    return c;
  }
  c.kind = Caller::NODE;
  c.node = std::move(**row);
  return c;
}

Coordinator::Coordinator(Catalogue catalogue, std::unique_ptr<Store> store, CoordinatorConfig config)
    : cat_(std::move(catalogue)), impl_(std::make_unique<Impl>(cat_, std::move(store), std::move(config))) {}

Coordinator::~Coordinator() { stop(); }

void Coordinator::stop() { std::call_once(impl_->stopped, [this] { impl_->pool.join(); }); }

net::HttpLimits Coordinator::http_limits() const {
  net::HttpLimits l;
  l.max_body_bytes = 1 << 20;
  // Downloads of hundreds of MB go to slow links: each write may take a while, the whole body much longer.
  l.write_deadline = std::chrono::milliseconds(120'000);
  return l;
}

Result<std::unique_ptr<net::HttpServer>> Coordinator::listen(const std::string& host, uint16_t port, net::HttpLimits limits,
                                                              std::optional<net::ServerTls> tls) {
  return net::HttpServer::listen(
      host, port, std::move(limits),
      [this](const net::HttpRequestView& req, std::shared_ptr<net::HttpResponder> out) { handle(req, std::move(out)); },
      2,
      [this](const net::HttpRequestHead& head, std::function<void(net::HttpCredentials)> done) {
        authorize(head, std::move(done));
      },
      std::move(tls));
}

void Coordinator::authorize(const net::HttpRequestHead& head, std::function<void(net::HttpCredentials)> done) {
  const std::string path = head.target.substr(0, head.target.find('?'));
  if (public_page(head.method, path)) return done({.kind = net::HttpCredentials::Kind::PUBLIC, .refusal = {}});
  boost::asio::post(impl_->pool, [this, authorization = head.authorization, done = std::move(done)] {
    net::HttpCredentials c{.kind = net::HttpCredentials::Kind::VALID, .refusal = {}};
    try {
      if (impl_->authenticate(authorization).kind == Caller::NONE) {
        ++impl_->requests;
        ++impl_->unauthorized;
        c = {.kind = net::HttpCredentials::Kind::REFUSED, .refusal = unauthorized_reply()};
      }
    } catch (const std::exception& e) {
      c = {.kind = net::HttpCredentials::Kind::REFUSED, .refusal = error(500, std::string("internal error: ") + e.what(), "internal")};
    }
    done(std::move(c));
  });
}

void Coordinator::handle(const net::HttpRequestView& req, std::shared_ptr<net::HttpResponder> out) {
  boost::asio::post(impl_->pool, [this, req, out] {
    // On the pool an exception would end the process: it ends only this request (500).
    try {
      const std::string path = req.target.substr(0, req.target.find('?'));
      if (path.rfind("/slices/", 0) == 0 && req.method == "GET") {
        return impl_->download(req, path.substr(8), out);
      }
      out->reply(answer(req));
    } catch (const std::exception& e) {
      out->reply(error(500, std::string("internal error: ") + e.what(), "internal"));
    }
  });
}

net::HttpReply Coordinator::answer(const net::HttpRequestView& req) {
  ++impl_->requests;
  net::HttpReply r = impl_->route(req);
  if (r.status == 401) ++impl_->unauthorized;
  return r;
}

namespace {

using Handler = net::HttpReply (Coordinator::Impl::*)(const ApiCall&);
enum class Access { PUBLIC, TOKEN };
struct Route {
  const char* method;
  const char* path;
  bool prefix;  // the path is a prefix followed by an id (DELETE /api/nodes/ID)
  Access access;
  Handler handle;
};

using I = Coordinator::Impl;
// Every endpoint but the slice downloads (answered as a stream by Coordinator::handle). docs/market.md lists them.
constexpr Route kRoutes[] = {
    {"GET", "/health", false, Access::PUBLIC, &I::health},
    {"GET", "/", false, Access::PUBLIC, &I::dashboard_page},
    {"GET", "/api/dashboard", false, Access::PUBLIC, &I::dashboard_api},
    {"GET", "/metrics", false, Access::PUBLIC, &I::metrics},
    {"POST", "/api/nodes", false, Access::TOKEN, &I::register_node},
    {"DELETE", "/api/nodes/", true, Access::TOKEN, &I::revoke_node},
    {"GET", "/api/nodes", false, Access::TOKEN, &I::list_nodes},
    {"GET", "/api/whoami", false, Access::TOKEN, &I::whoami},
    {"GET", "/api/model", false, Access::TOKEN, &I::model},
    {"POST", "/api/expert-coverage", false, Access::TOKEN, &I::coverage},
    {"GET", "/api/expert-demand", false, Access::TOKEN, &I::demand},
    {"POST", "/api/expert-usage", false, Access::TOKEN, &I::usage},
    {"POST", "/api/expert-volunteer", false, Access::TOKEN, &I::volunteer},
    {"GET", "/api/expert-map", false, Access::TOKEN, &I::expert_map},
    {"POST", "/api/work", false, Access::TOKEN, &I::work},
    {"GET", "/api/rewards", false, Access::TOKEN, &I::rewards},
};

bool path_matches(const Route& r, const std::string& path) {
  return r.prefix ? path.rfind(r.path, 0) == 0 : path == r.path;
}
const Route* find_route(const std::string& method, const std::string& path) {
  for (const Route& r : kRoutes) {
    if (method == r.method && path_matches(r, path)) return &r;
  }
  return nullptr;
}
// A path some token route serves with another method: 405 rather than 404.
bool known_path(const std::string& path) {
  for (const Route& r : kRoutes) {
    if (r.access == Access::TOKEN && !r.prefix && path == r.path) return true;
  }
  return false;
}

}  // namespace

bool public_page(const std::string& method, const std::string& path) {
  const Route* r = find_route(method, path);
  return r && r->access == Access::PUBLIC;
}

net::HttpReply Coordinator::Impl::route(const net::HttpRequestView& req) {
  const std::string path = req.target.substr(0, req.target.find('?'));
  const Route* r = find_route(req.method, path);
  if (r && r->access == Access::PUBLIC) return (this->*r->handle)(ApiCall{req, path, Caller{}, now()});
  ApiCall call{req, path, authenticate(req.authorization), now()};
  if (call.who.kind == Caller::NONE) return unauthorized_reply();
  if (r) return (this->*r->handle)(call);
  if (known_path(path)) return error(405, "method " + req.method + " is not allowed on " + path, "method_not_allowed");
  return error(404, "no such endpoint", "not_found");
}

// Public pages.
net::HttpReply Coordinator::Impl::health(const ApiCall&) { return json_reply(200, {{"status", "ok"}}); }

net::HttpReply Coordinator::Impl::dashboard_page(const ApiCall&) {
  return {.status = 200, .content_type = "text/html; charset=utf-8", .body = dashboard_html(), .headers = {}};
}

net::HttpReply Coordinator::Impl::dashboard_api(const ApiCall& c) {
  // Public; an admin token (sent by the page when its URL fragment carries one) adds the nodes' addresses.
  const bool admin = !c.req.authorization.empty() && authenticate(c.req.authorization).kind == Caller::ADMIN;
  json d = dashboard_json(admin);
  if (d.contains("error")) return json_reply(503, d);
  return json_reply(200, d);
}

net::HttpReply Coordinator::Impl::metrics(const ApiCall& c) {
  net::MetricsText t;
  t.family("essaim_coord_requests_total", "counter", "API requests answered");
  t.sample("essaim_coord_requests_total", {}, double(requests.load()));
  t.family("essaim_coord_unauthorized_total", "counter", "requests refused with 401");
  t.sample("essaim_coord_unauthorized_total", {}, double(unauthorized.load()));
  t.family("essaim_coord_download_bytes_total", "counter", "slice bytes sent");
  t.sample("essaim_coord_download_bytes_total", {}, double(bytes_served.load()));
  t.family("essaim_coord_downloads_total", "counter", "slice downloads started");
  t.sample("essaim_coord_downloads_total", {}, double(downloads.load()));
  t.family("essaim_coord_store_errors_total", "counter", "store calls that failed");
  t.sample("essaim_coord_store_errors_total", {}, double(store_errors.load()));
  t.family("essaim_coord_store_invalid_rows_total", "counter", "rows read back that failed validation");
  t.sample("essaim_coord_store_invalid_rows_total", {}, double(store->invalid_rows()));
  const StoreWrites w = store->writes();
  t.family("essaim_coord_store_write_transactions_total", "counter", "committed store transactions that changed a row");
  t.sample("essaim_coord_store_write_transactions_total", {}, double(w.transactions));
  t.family("essaim_coord_store_rows_written_total", "counter", "store rows inserted, updated or deleted");
  t.sample("essaim_coord_store_rows_written_total", {}, double(w.rows));
  const MarketViewCounters m = market.counters();
  t.family("essaim_coord_market_rereads_total", "counter", "rereads of the market's rows from the store");
  t.sample("essaim_coord_market_rereads_total", {}, double(m.reloads));
  t.family("essaim_coord_volunteer_answers_total", "counter",
           "volunteer answers and heartbeat volunteer flags: decided, or nothing without deciding");
  t.sample("essaim_coord_volunteer_answers_total", {{"how", "decided"}}, double(m.decisions));
  t.sample("essaim_coord_volunteer_answers_total", {{"how", "nothing_needed"}}, double(m.skipped));
  if (Result<MarketSnapshot> s = snapshot(*store)) {
    std::map<std::string, int64_t> by_status = {{"active", 0}, {"stale", 0}, {"dropped", 0}, {"revoked", 0}};
    for (const NodeRow& n : s->nodes) ++by_status[node_status(n, c.now_ms, cfg.heartbeat_s)];
    t.family("essaim_coord_nodes", "gauge", "registered nodes by status");
    for (const auto& [k, v] : by_status) t.sample("essaim_coord_nodes", {{"status", k}}, double(v));
    const std::vector<int64_t> h = count_holders(cat, s->nodes, s->holdings, c.now_ms, cfg.heartbeat_s);
    int64_t under = 0, uncovered = 0;
    for (int64_t x : h) {
      under += x < cfg.replicas;
      uncovered += x == 0;
    }
    t.family("essaim_coord_slices", "gauge", "catalogue slices, all / below the wanted replicas / with no holder");
    t.sample("essaim_coord_slices", {{"state", "all"}}, double(h.size()));
    t.sample("essaim_coord_slices", {{"state", "under_replicated"}}, double(under));
    t.sample("essaim_coord_slices", {{"state", "uncovered"}}, double(uncovered));
  }
  return {.status = 200, .content_type = "text/plain; version=0.0.4", .body = t.text(), .headers = {}};
}

// Identity.
net::HttpReply Coordinator::Impl::register_node(const ApiCall& c) {
  if (!c.admin()) return error(403, "registering a node needs the admin token", "forbidden");
  Result<RegisterRequest> reg = parse_register(c.req.body);
  if (!reg) return error(400, reg.status().message(), "invalid_body");
  NodeRow n;
  n.node_id = "n-" + random_hex(8);
  n.name = reg->name;
  n.role = reg->role;
  n.registered_ms = c.now_ms;
  const std::string token = random_hex(32);
  if (n.node_id.size() != 18 || token.size() != 64) return error(500, "no random bytes for a token", "internal");
  n.token_sha256 = token_hash(token);
  if (Status st = store->add_node(n); !st) return store_failed(st);
  return json_reply(201, {{"node_id", n.node_id}, {"token", token}, {"role", n.role}});
}

net::HttpReply Coordinator::Impl::revoke_node(const ApiCall& c) {
  if (!c.admin()) return error(403, "revoking a node needs the admin token", "forbidden");
  const std::string id = c.path.substr(11);
  if (!node_id_valid(id)) return error(404, "no node '" + id.substr(0, 64) + "'", "not_found");
  Result<bool> found = store->revoke_node(id);
  if (!found) return store_failed(found.status());
  if (!*found) return error(404, "no node '" + id + "'", "not_found");
  return json_reply(200, {{"revoked", true}});
}

net::HttpReply Coordinator::Impl::list_nodes(const ApiCall& c) {
  if (!c.admin()) return error(403, "listing nodes needs the admin token", "forbidden");
  Result<std::vector<NodeRow>> nodes = store->list_nodes();
  if (!nodes) return store_failed(nodes.status());
  json list = json::array();
  for (const NodeRow& n : *nodes) {
    list.push_back({{"node_id", n.node_id}, {"name", n.name}, {"role", n.role},
                    {"status", node_status(n, c.now_ms, cfg.heartbeat_s)}, {"revoked", n.revoked},
                    {"last_seen_ms_ago", n.last_heartbeat_ms > 0 ? json(c.now_ms - n.last_heartbeat_ms) : json(nullptr)}});
  }
  return json_reply(200, {{"nodes", list}});
}

net::HttpReply Coordinator::Impl::whoami(const ApiCall& c) {
  if (c.admin()) return json_reply(200, {{"node_id", nullptr}, {"name", "admin"}, {"admin", true}});
  return json_reply(200, {{"node_id", c.who.node.node_id}, {"name", c.who.node.name}, {"role", c.who.node.role}});
}

// Catalogue.
net::HttpReply Coordinator::Impl::model(const ApiCall&) {
  json slices = json::array();
  for (const CatalogueSlice& s : cat.slices) slices.push_back(slice_json(s));
  return json_reply(200, {{"model_identity", cat.model_identity}, {"architecture", cat.architecture},
                          {"n_layers", cat.n_layers}, {"n_experts", cat.n_experts},
                          {"n_expert_used", cat.n_expert_used}, {"protocol_version", cat.protocol_version},
                          {"kernel_abi", cat.kernel_abi}, {"replicas", cfg.replicas},
                          {"heartbeat_s", cfg.heartbeat_s}, {"slices", slices}});
}

// Work and rewards.
net::HttpReply Coordinator::Impl::work(const ApiCall& c) {
  // Credited work comes from a backbone's own dispatch counters, never from a worker's claim: a worker's
  // token could otherwise credit itself or report failed audits against others.
  if (!c.admin() && c.who.node.role != "backbone") {
    return error(403, "work is reported by backbones (a node registered with role \"backbone\", or the admin token)",
                 "forbidden");
  }
  Result<std::vector<WorkReport>> w = parse_work(c.req.body);
  if (!w) return error(400, w.status().message(), "invalid_body");
  json unknown = json::array();
  std::vector<std::pair<std::string, int64_t>> credited;  // (node, pairs) for the dashboard's rates
  const std::string reporter = c.admin() ? std::string("admin") : c.who.node.node_id;
  Status st = store->exclusive([&]() -> Status {
    ESSAIM_ASSIGN_OR_RETURN(std::vector<NodeRow> nodes, store->list_nodes());
    for (const WorkReport& r : *w) {
      const NodeRow* best = nullptr;  // the node whose latest heartbeat gave this address
      for (const NodeRow& n : nodes) {
        if (!n.revoked && n.address == r.address && (!best || n.last_heartbeat_ms > best->last_heartbeat_ms)) best = &n;
      }
      if (!best) {
        unknown.push_back(r.address);
        continue;
      }
      const std::string reason = r.audits_failed > 0 ? "failed " + std::to_string(r.audits_failed) + " of " +
                                                           std::to_string(r.audits) + " audits (reported by " +
                                                           reporter + ")"
                                                     : std::string();
      ESSAIM_RETURN_IF_ERROR(store->add_work(best->node_id, {r.pairs_accepted, r.audits, r.audits_failed}, reason));
      credited.emplace_back(best->node_id, r.pairs_accepted);
    }
    return Status::ok();
  });
  if (!st) return store_failed(st);
  for (const auto& [node, pairs] : credited) history.pairs(c.now_ms, node, pairs);
  json body = json::object();
  if (!unknown.empty()) body["unknown_addresses"] = unknown;
  return json_reply(200, body);
}

net::HttpReply Coordinator::Impl::rewards(const ApiCall& c) {
  Result<std::vector<NodeRow>> nodes = store->list_nodes();
  if (!nodes) return store_failed(nodes.status());
  Result<std::vector<WorkRow>> work = store->list_work();
  if (!work) return store_failed(work.status());
  std::map<std::string, WorkRow> by_node;
  for (const WorkRow& w : *work) by_node[w.node_id] = w;
  json list = json::array();
  for (const NodeRow& n : *nodes) {
    const WorkRow w = by_node.count(n.node_id) ? by_node[n.node_id] : WorkRow{};
    list.push_back({{"node_id", n.node_id}, {"name", n.name}, {"status", node_status(n, c.now_ms, cfg.heartbeat_s)},
                    {"pairs_credited", w.pairs_credited}, {"audits", w.audits}, {"audits_failed", w.audits_failed},
                    {"withheld", w.withheld}, {"reason", n.reason}});
  }
  return json_reply(200, {{"nodes", list}});
}

}  // namespace essaim::coord
