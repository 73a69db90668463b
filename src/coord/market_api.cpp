// The market's endpoints: heartbeats, demand, usage, volunteering and the backbone's expert map.
#include <set>
#include <tuple>

#include "coord/api_parse.h"
#include "coord/coordinator_impl.h"
#include "gguf/model_identity.h"

namespace essaim::coord {

using json = nlohmann::json;

net::HttpReply Coordinator::Impl::coverage(const ApiCall& c) {
  if (c.admin()) return error(403, "a heartbeat needs the node's own token", "forbidden");
  if (c.who.node.role != "worker") return error(403, "a backbone's token holds no experts: heartbeats come from workers", "forbidden");
  Result<CoverageRequest> hb = parse_coverage(c.req.body);
  if (!hb) return error(400, hb.status().message(), "invalid_body");
  if (hb->node_id != c.who.node.node_id) return error(403, "node_id is not the token's node", "forbidden");
  NodeRow f = c.who.node;
  f.address = hb->address;
  f.model_identity = hb->model_identity;
  f.protocol_version = hb->protocol_version;
  f.kernel_abi = hb->kernel_abi;
  f.fingerprint_ok = hb->model_identity == cat.model_identity && hb->protocol_version == cat.protocol_version &&
                     hb->kernel_abi == cat.kernel_abi;
  f.last_heartbeat_ms = c.now_ms;
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

net::HttpReply Coordinator::Impl::demand(const ApiCall& c) {
  Result<Snapshot> s = snapshot(*store);
  if (!s) return store_failed(s.status());
  const std::vector<RangeDemand> d =
      compute_demand(cat, count_holders(cat, s->nodes, s->holdings, c.now_ms, cfg.heartbeat_s),
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
net::HttpReply Coordinator::Impl::usage(const ApiCall& c) {
  // Usage decides which ranges look scarce: a worker reporting it could steer the market towards the ranges
  // it wants (or away from the ones it holds), so only what a backbone's router picked counts.
  if (!c.admin() && c.who.node.role != "backbone") {
    return error(403, "usage is reported by backbones (a node registered with role \"backbone\", or the admin "
                      "token): a worker's token cannot report router picks", "forbidden");
  }
  Result<std::vector<UsageLayer>> u = parse_usage(c.req.body, cat.n_experts);
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
net::HttpReply Coordinator::Impl::volunteer(const ApiCall& c) {
  if (c.admin()) return error(403, "volunteering needs the node's own token", "forbidden");
  if (c.who.node.role != "worker") return error(403, "a backbone's token holds no experts: workers volunteer", "forbidden");
  Result<VolunteerRequest> v = parse_volunteer(c.req.body);
  if (!v) return error(400, v.status().message(), "invalid_body");
  if (v->node_id != c.who.node.node_id) return error(403, "node_id is not the token's node", "forbidden");
  VolunteerChoice choice;
  Status st = store->exclusive([&]() -> Status {
    ESSAIM_ASSIGN_OR_RETURN(Snapshot s, snapshot(*store));
    ESSAIM_ASSIGN_OR_RETURN(std::vector<PendingRow> pending, store->list_pending(c.now_ms));
    std::vector<int64_t> holders = count_holders(cat, s.nodes, s.holdings, c.now_ms, cfg.heartbeat_s);
    std::set<std::tuple<std::string, int64_t, int64_t>> holds;
    for (const HoldingRow& h : s.holdings) holds.emplace(h.node_id, h.layer, h.expert_first);
    // A reservation stands for a download in progress; one of a node that is gone (revoked, dropped, or
    // heartbeating before and silent for 3 heartbeats now) downloads nothing, so it must not hide a scarce range.
    std::set<std::string> gone;
    for (const NodeRow& n : s.nodes) {
      const std::string st = node_status(n, c.now_ms, cfg.heartbeat_s);
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
      reserve.push_back({v->node_id, cat.slices[i].layer, cat.slices[i].expert_first, c.now_ms + kPendingMs});
    }
    return store->set_pending(v->node_id, reserve, c.now_ms);
  });
  if (!st) return store_failed(st);
  json assign = json::array(), drop = json::array();
  for (size_t i : choice.assign) assign.push_back(slice_json(cat.slices[i]));
  for (size_t i : choice.drop) drop.push_back(range_json(cat.slices[i]));
  return json_reply(200, {{"assign", assign}, {"drop", drop}});
}

net::HttpReply Coordinator::Impl::expert_map(const ApiCall& c) {
  Result<Snapshot> s = snapshot(*store);
  if (!s) return store_failed(s.status());
  json workers = json::array();
  for (const MapWorker& w : coord::expert_map(cat, s->nodes, s->holdings, c.now_ms, cfg.heartbeat_s)) {
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

}  // namespace essaim::coord
