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
#include "gguf/model_identity.h"
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
net::HttpReply store_failed(const Status& st) { return error(503, "the coordinator's store failed: " + st.message(), "store_error"); }
json range_json(const CatalogueSlice& s) {
  return {{"layer", s.layer}, {"expert_first", s.expert_first}, {"expert_count", s.expert_count}};
}
json slice_json(const CatalogueSlice& s) {
  return {{"layer", s.layer}, {"expert_first", s.expert_first}, {"expert_count", s.expert_count}, {"name", s.name},
          {"bytes", s.bytes}, {"sha256", s.sha256}, {"url", "/slices/" + s.name}};
}

// Everything one decision needs, read in one go.
struct Snapshot {
  std::vector<NodeRow> nodes;
  std::vector<HoldingRow> holdings;
  std::vector<UsageRow> usage;
};
Result<Snapshot> snapshot(Store& db) {
  Snapshot s;
  ESSAIM_ASSIGN_OR_RETURN(s.nodes, db.list_nodes());
  ESSAIM_ASSIGN_OR_RETURN(s.holdings, db.list_holdings());
  ESSAIM_ASSIGN_OR_RETURN(s.usage, db.list_usage());
  return s;
}

}  // namespace

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

Result<std::unique_ptr<net::HttpServer>> Coordinator::listen(const std::string& host, uint16_t port, net::HttpLimits limits) {
  return net::HttpServer::listen(
      host, port, std::move(limits),
      [this](const net::HttpRequestView& req, std::shared_ptr<net::HttpResponder> out) { handle(req, std::move(out)); },
      2, [this](const net::HttpRequestHead& head, std::function<void(net::HttpCredentials)> done) {
        authorize(head, std::move(done));
      });
}

namespace {
bool public_page(const std::string& method, const std::string& path) {
  return method == "GET" && (path == "/health" || path == "/" || path == "/api/dashboard" || path == "/metrics");
}
}  // namespace

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

net::HttpReply Coordinator::Impl::route(const net::HttpRequestView& req) {
  const std::string path = req.target.substr(0, req.target.find('?'));
  const std::string& m = req.method;
  // Public pages.
  if (path == "/health" && m == "GET") return json_reply(200, {{"status", "ok"}});
  if (path == "/" && m == "GET") return {.status = 200, .content_type = "text/html; charset=utf-8", .body = dashboard_html(), .headers = {}};
  if (path == "/api/dashboard" && m == "GET") {
    json d = dashboard_json();
    if (d.contains("error")) return json_reply(503, d);
    return json_reply(200, d);
  }
  if (path == "/metrics" && m == "GET") {
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
    if (Result<Snapshot> s = snapshot(*store)) {
      const int64_t now_ms = now();
      std::map<std::string, int64_t> by_status = {{"active", 0}, {"stale", 0}, {"dropped", 0}, {"revoked", 0}};
      for (const NodeRow& n : s->nodes) ++by_status[node_status(n, now_ms, cfg.heartbeat_s)];
      t.family("essaim_coord_nodes", "gauge", "registered nodes by status");
      for (const auto& [k, v] : by_status) t.sample("essaim_coord_nodes", {{"status", k}}, double(v));
      const std::vector<int64_t> h = count_holders(cat, s->nodes, s->holdings, now_ms, cfg.heartbeat_s);
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

  const Caller who = authenticate(req.authorization);
  if (who.kind == Caller::NONE) return unauthorized_reply();
  const bool admin = who.kind == Caller::ADMIN;
  const int64_t now_ms = now();

  // Identity.
  if (path == "/api/nodes" && m == "POST") {
    if (!admin) return error(403, "registering a node needs the admin token", "forbidden");
    Result<RegisterRequest> reg = parse_register(req.body);
    if (!reg) return error(400, reg.status().message(), "invalid_body");
    NodeRow n;
    n.node_id = "n-" + random_hex(8);
    n.name = reg->name;
    n.role = reg->role;
    n.registered_ms = now_ms;
    const std::string token = random_hex(32);
    if (n.node_id.size() != 18 || token.size() != 64) return error(500, "no random bytes for a token", "internal");
    n.token_sha256 = token_hash(token);
    if (Status st = store->add_node(n); !st) return store_failed(st);
    return json_reply(201, {{"node_id", n.node_id}, {"token", token}, {"role", n.role}});
  }
  if (path.rfind("/api/nodes/", 0) == 0 && m == "DELETE") {
    if (!admin) return error(403, "revoking a node needs the admin token", "forbidden");
    const std::string id = path.substr(11);
    if (!node_id_valid(id)) return error(404, "no node '" + id.substr(0, 64) + "'", "not_found");
    Result<bool> found = store->revoke_node(id);
    if (!found) return store_failed(found.status());
    if (!*found) return error(404, "no node '" + id + "'", "not_found");
    return json_reply(200, {{"revoked", true}});
  }
  if (path == "/api/nodes" && m == "GET") {
    if (!admin) return error(403, "listing nodes needs the admin token", "forbidden");
    Result<std::vector<NodeRow>> nodes = store->list_nodes();
    if (!nodes) return store_failed(nodes.status());
    json list = json::array();
    for (const NodeRow& n : *nodes) {
      list.push_back({{"node_id", n.node_id}, {"name", n.name}, {"role", n.role},
                      {"status", node_status(n, now_ms, cfg.heartbeat_s)}, {"revoked", n.revoked},
                      {"last_seen_ms_ago", n.last_heartbeat_ms > 0 ? json(now_ms - n.last_heartbeat_ms) : json(nullptr)}});
    }
    return json_reply(200, {{"nodes", list}});
  }
  if (path == "/api/whoami" && m == "GET") {
    if (admin) return json_reply(200, {{"node_id", nullptr}, {"name", "admin"}, {"admin", true}});
    return json_reply(200, {{"node_id", who.node.node_id}, {"name", who.node.name}, {"role", who.node.role}});
  }

  // Catalogue.
  if (path == "/api/model" && m == "GET") {
    json slices = json::array();
    for (const CatalogueSlice& s : cat.slices) slices.push_back(slice_json(s));
    return json_reply(200, {{"model_identity", cat.model_identity}, {"architecture", cat.architecture},
                            {"n_layers", cat.n_layers}, {"n_experts", cat.n_experts},
                            {"n_expert_used", cat.n_expert_used}, {"protocol_version", cat.protocol_version},
                            {"kernel_abi", cat.kernel_abi}, {"replicas", cfg.replicas},
                            {"heartbeat_s", cfg.heartbeat_s}, {"slices", slices}});
  }

  // Heartbeat.
  if (path == "/api/expert-coverage" && m == "POST") {
    if (admin) return error(403, "a heartbeat needs the node's own token", "forbidden");
    if (who.node.role != "worker") return error(403, "a backbone's token holds no experts: heartbeats come from workers", "forbidden");
    Result<CoverageRequest> hb = parse_coverage(req.body);
    if (!hb) return error(400, hb.status().message(), "invalid_body");
    if (hb->node_id != who.node.node_id) return error(403, "node_id is not the token's node", "forbidden");
    NodeRow f = who.node;
    f.address = hb->address;
    f.model_identity = hb->model_identity;
    f.protocol_version = hb->protocol_version;
    f.kernel_abi = hb->kernel_abi;
    f.fingerprint_ok = hb->model_identity == cat.model_identity && hb->protocol_version == cat.protocol_version &&
                       hb->kernel_abi == cat.kernel_abi;
    f.last_heartbeat_ms = now_ms;
    f.capacity_bytes = hb->capacity_bytes;
    f.load = hb->load;
    std::vector<HoldingRow> accepted;
    json rejected = json::array();
    for (const RangeRef& h : hb->holdings) {
      const std::optional<size_t> s = cat.find(h.layer, h.expert_first, h.expert_count);
      if (!s || cat.slices[*s].sha256 != h.sha256) {
        rejected.push_back({{"layer", h.layer}, {"expert_first", h.expert_first}, {"expert_count", h.expert_count},
                            {"reason", !s ? "not a catalogue range" : "sha256 differs from the catalogue's"}});
        continue;
      }
      accepted.push_back({f.node_id, h.layer, h.expert_first, h.expert_count, h.sha256});
    }
    if (Status st = store->heartbeat(f, accepted); !st) return store_failed(st);
    json body = {{"accepted_holdings", accepted.size()}, {"heartbeat_s", cfg.heartbeat_s},
                 {"fingerprint_ok", f.fingerprint_ok}};
    if (!rejected.empty()) body["rejected_holdings"] = rejected;
    if (!f.fingerprint_ok) {
      body["expected_fingerprint"] = {{"model_identity", cat.model_identity},
                                      {"protocol_version", cat.protocol_version}, {"kernel_abi", cat.kernel_abi}};
    }
    return json_reply(200, body);
  }

  // Demand.
  if (path == "/api/expert-demand" && m == "GET") {
    Result<Snapshot> s = snapshot(*store);
    if (!s) return store_failed(s.status());
    const std::vector<RangeDemand> d =
        compute_demand(cat, count_holders(cat, s->nodes, s->holdings, now_ms, cfg.heartbeat_s),
                       usage_shares(cat, s->usage), cfg.replicas);
    json ranges = json::array();
    for (const RangeDemand& r : d) {
      const CatalogueSlice& c = cat.slices[r.slice];
      ranges.push_back({{"layer", c.layer}, {"expert_first", c.expert_first}, {"expert_count", c.expert_count},
                        {"slice", c.name}, {"bytes", c.bytes}, {"wanted", r.wanted}, {"holders", r.holders},
                        {"usage", r.usage}, {"scarcity", r.scarcity}});
    }
    return json_reply(200, {{"ranges", ranges}});
  }
  if (path == "/api/expert-usage" && m == "POST") {
    // Usage decides which ranges look scarce: a worker reporting it could steer the market towards the ranges
    // it wants (or away from the ones it holds), so only what a backbone's router picked counts.
    if (!admin && who.node.role != "backbone") {
      return error(403, "usage is reported by backbones (a node registered with role \"backbone\", or the admin "
                        "token): a worker's token cannot report router picks", "forbidden");
    }
    Result<std::vector<UsageLayer>> u = parse_usage(req.body, cat.n_experts);
    if (!u) return error(400, u.status().message(), "invalid_body");
    Status st = store->exclusive([&]() -> Status {
      for (const UsageLayer& l : *u) ESSAIM_RETURN_IF_ERROR(store->add_usage(l.layer, l.counts));
      return Status::ok();
    });
    if (!st) return store_failed(st);
    return json_reply(200, json::object());
  }

  // Volunteer: read, decide and reserve in one exclusive transaction, so two volunteers asking at once (on
  // this process or another sharing the database) get different slices.
  if (path == "/api/expert-volunteer" && m == "POST") {
    if (admin) return error(403, "volunteering needs the node's own token", "forbidden");
    if (who.node.role != "worker") return error(403, "a backbone's token holds no experts: workers volunteer", "forbidden");
    Result<VolunteerRequest> v = parse_volunteer(req.body);
    if (!v) return error(400, v.status().message(), "invalid_body");
    if (v->node_id != who.node.node_id) return error(403, "node_id is not the token's node", "forbidden");
    VolunteerChoice choice;
    Status st = store->exclusive([&]() -> Status {
      ESSAIM_ASSIGN_OR_RETURN(Snapshot s, snapshot(*store));
      ESSAIM_ASSIGN_OR_RETURN(std::vector<PendingRow> pending, store->list_pending(now_ms));
      std::vector<int64_t> holders = count_holders(cat, s.nodes, s.holdings, now_ms, cfg.heartbeat_s);
      std::set<std::tuple<std::string, int64_t, int64_t>> holds;
      for (const HoldingRow& h : s.holdings) holds.emplace(h.node_id, h.layer, h.expert_first);
      // A reservation stands for a download in progress; one of a node that is gone (revoked, dropped, or
      // heartbeating before and silent for 3 heartbeats now) downloads nothing, so it must not hide a scarce range.
      std::set<std::string> gone;
      for (const NodeRow& n : s.nodes) {
        const std::string st = node_status(n, now_ms, cfg.heartbeat_s);
        if (st == "revoked" || st == "dropped" || (st == "stale" && n.last_heartbeat_ms > 0)) gone.insert(n.node_id);
      }
      for (const PendingRow& p : pending) {
        if (p.node_id == v->node_id) continue;  // its own earlier assignment is offered again
        if (gone.count(p.node_id)) continue;
        if (holds.count({p.node_id, p.layer, p.expert_first})) continue;  // already counted as a holder
        for (size_t i = 0; i < cat.slices.size(); ++i) {
          if (cat.slices[i].layer == p.layer && cat.slices[i].expert_first == p.expert_first) ++holders[i];
        }
      }
      std::vector<size_t> held;
      if (v->has_holding) {
        for (const RangeRef& r : v->holding) {
          if (std::optional<size_t> i = cat.find(r.layer, r.expert_first, r.expert_count)) held.push_back(*i);
        }
      } else {
        for (const HoldingRow& h : s.holdings) {
          if (h.node_id != v->node_id) continue;
          if (std::optional<size_t> i = cat.find(h.layer, h.expert_first, h.expert_count)) held.push_back(*i);
        }
      }
      choice = choose_volunteer(cat, compute_demand(cat, holders, usage_shares(cat, s.usage), cfg.replicas), held,
                                v->budget_bytes);
      std::vector<PendingRow> reserve;
      for (size_t i : choice.assign) {
        reserve.push_back({v->node_id, cat.slices[i].layer, cat.slices[i].expert_first, now_ms + kPendingMs});
      }
      return store->set_pending(v->node_id, reserve, now_ms);
    });
    if (!st) return store_failed(st);
    json assign = json::array(), drop = json::array();
    for (size_t i : choice.assign) assign.push_back(slice_json(cat.slices[i]));
    for (size_t i : choice.drop) drop.push_back(range_json(cat.slices[i]));
    return json_reply(200, {{"assign", assign}, {"drop", drop}});
  }

  // Map.
  if (path == "/api/expert-map" && m == "GET") {
    Result<Snapshot> s = snapshot(*store);
    if (!s) return store_failed(s.status());
    json workers = json::array();
    for (const MapWorker& w : expert_map(cat, s->nodes, s->holdings, now_ms, cfg.heartbeat_s)) {
      json holdings = json::array();
      for (size_t i : w.slices) holdings.push_back(range_json(cat.slices[i]));
      workers.push_back({{"address", w.address}, {"label", w.node_id}, {"holdings", holdings}});
    }
    // The generation is a digest of the listing itself: it changes exactly when the map does, and every
    // coordinator process sharing the database computes the same number with no counter to share.
    const std::string text = workers.dump();
    const Sha256Digest d = sha256({reinterpret_cast<const uint8_t*>(text.data()), text.size()});
    int64_t generation = 0;
    for (int i = 0; i < 7; ++i) generation = (generation << 8) | d[size_t(i)];
    generation &= (int64_t(1) << 53) - 1;  // exact in a JavaScript number
    return json_reply(200, {{"format", "essaim-expert-map"}, {"version", 1}, {"generation", generation},
                            {"workers", workers}});
  }

  // Work and rewards.
  if (path == "/api/work" && m == "POST") {
    // Credited work comes from a backbone's own dispatch counters, never from a worker's claim: a worker's
    // token could otherwise credit itself or report failed audits against others.
    if (!admin && who.node.role != "backbone") {
      return error(403, "work is reported by backbones (a node registered with role \"backbone\", or the admin token)",
                   "forbidden");
    }
    Result<std::vector<WorkReport>> w = parse_work(req.body);
    if (!w) return error(400, w.status().message(), "invalid_body");
    json unknown = json::array();
    const std::string reporter = admin ? std::string("admin") : who.node.node_id;
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
      }
      return Status::ok();
    });
    if (!st) return store_failed(st);
    json body = json::object();
    if (!unknown.empty()) body["unknown_addresses"] = unknown;
    return json_reply(200, body);
  }
  if (path == "/api/rewards" && m == "GET") {
    Result<std::vector<NodeRow>> nodes = store->list_nodes();
    if (!nodes) return store_failed(nodes.status());
    Result<std::vector<WorkRow>> work = store->list_work();
    if (!work) return store_failed(work.status());
    std::map<std::string, WorkRow> by_node;
    for (const WorkRow& w : *work) by_node[w.node_id] = w;
    json list = json::array();
    for (const NodeRow& n : *nodes) {
      const WorkRow w = by_node.count(n.node_id) ? by_node[n.node_id] : WorkRow{};
      list.push_back({{"node_id", n.node_id}, {"name", n.name}, {"status", node_status(n, now_ms, cfg.heartbeat_s)},
                      {"pairs_credited", w.pairs_credited}, {"audits", w.audits}, {"audits_failed", w.audits_failed},
                      {"withheld", w.withheld}, {"reason", n.reason}});
    }
    return json_reply(200, {{"nodes", list}});
  }

  static const std::set<std::string> kKnown = {"/api/nodes", "/api/whoami", "/api/model", "/api/expert-coverage",
                                                "/api/expert-demand", "/api/expert-usage", "/api/expert-volunteer",
                                                "/api/expert-map", "/api/work", "/api/rewards"};
  if (kKnown.count(path)) return error(405, "method " + m + " is not allowed on " + path, "method_not_allowed");
  return error(404, "no such endpoint", "not_found");
}

}  // namespace essaim::coord
