// The market's endpoints: heartbeats, demand, usage, volunteering and the backbone's expert map.
#include <algorithm>

#include "coord/api_parse.h"
#include "coord/coordinator_impl.h"
#include "slice/model_identity.h"

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
  if (Status stored = market.heartbeat(*store, f, accepted, hb->leaving, c.now_ms); !stored) return store_failed(stored);
  if (history.wants_coverage(c.now_ms)) {
    if (Result<std::shared_ptr<const MarketState>> s = market.current(*store, c.now_ms)) {
      note_coverage(c.now_ms, count_holders(cat, (*s)->snapshot.nodes, (*s)->snapshot.holdings, c.now_ms, cfg.heartbeat_s));
    }
  }
  // Whether volunteering now would change anything for this node (an assignment, a swap, a drop): a node
  // whose budget is full asks only when told, so a hole is healed within a heartbeat of being seen.
  bool volunteer_now = false;
  if (f.fingerprint_ok && !hb->leaving) {
    std::vector<size_t> held;
    for (const HoldingRow& h : accepted) held.push_back(*cat.find(h.layer, h.expert_first, h.expert_count));
    Result<VolunteerChoice> would = decide_volunteer(f.node_id, held, f.capacity_bytes, c.now_ms);
    if (!would) return store_failed(would.status());
    volunteer_now = !would->empty();
  }
  json body = {{"accepted_holdings", accepted.size()}, {"heartbeat_s", cfg.heartbeat_s},
               {"fingerprint_ok", f.fingerprint_ok}, {"volunteer", volunteer_now}};
  if (!rejected.empty()) body["rejected_holdings"] = rejected;
  if (!f.fingerprint_ok) {
    body["expected_fingerprint"] = {{"model_identity", cat.model_identity},
                                    {"protocol_version", cat.protocol_version}, {"kernel_abi", cat.kernel_abi}};
  }
  return json_reply(200, body);
}

net::HttpReply Coordinator::Impl::demand(const ApiCall& c) {
  Result<std::shared_ptr<const MarketState>> state = market.current(*store, c.now_ms);
  if (!state) return store_failed(state.status());
  const MarketSnapshot& s = (*state)->snapshot;
  const std::vector<RangeDemand> d = compute_demand(cat, count_holders(cat, s.nodes, s.holdings, c.now_ms, cfg.heartbeat_s),
                                                    usage_shares(cat, s.usage), cfg.replicas);
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
    ESSAIM_RETURN_IF_ERROR(store->decay_usage(c.now_ms, cfg.usage_half_life_s * 1000));
    for (const UsageLayer& l : *u) ESSAIM_RETURN_IF_ERROR(store->add_usage(l.layer, l.counts));
    return Status::ok();
  });
  if (!st) return store_failed(st);
  // Each token the backbone ran picked n_expert_used experts in every MoE layer: its tokens are the picks of
  // its busiest layer in this report / n_expert_used (the dashboard's tokens/s per backbone).
  int64_t picks = 0;
  for (const UsageLayer& l : *u) {
    int64_t layer_picks = 0;
    for (int64_t n : l.counts) layer_picks += n;
    picks = std::max(picks, layer_picks);
  }
  if (cat.n_expert_used > 0 && picks > 0) {
    history.tokens(c.now_ms, c.admin() ? std::string("admin") : c.who.node.node_id, picks / cat.n_expert_used);
  }
  return json_reply(200, json::object());
}

Result<VolunteerChoice> Coordinator::Impl::decide_volunteer(const std::string& node_id, const std::vector<size_t>& held,
                                                            int64_t budget_bytes, int64_t now_ms) {
  return market.decide(*store, {node_id, held, budget_bytes, now_ms});
}

namespace {
net::HttpReply volunteer_reply(const Catalogue& cat, const VolunteerChoice& choice) {
  json assign = json::array(), drop = json::array(), swap = json::array();
  for (size_t i : choice.assign) assign.push_back(slice_json(cat.slices[i]));
  for (size_t i : choice.drop) drop.push_back(range_json(cat.slices[i]));
  for (const SwapOrder& s : choice.swap) {
    swap.push_back({{"take", slice_json(cat.slices[s.take])}, {"give_up", range_json(cat.slices[s.give_up])}});
  }
  return json_reply(200, {{"assign", assign}, {"drop", drop}, {"swap", swap}});
}
}  // namespace

// Volunteer: read, decide and reserve in one exclusive transaction, so two volunteers asking at once (on
// this process or another sharing the database) get different slices. A swap's new slice is reserved too.
// An asker that would be told nothing without deciding (MarketView) is told so with no transaction: its
// reservations would stay none, so the store would not change.
net::HttpReply Coordinator::Impl::volunteer(const ApiCall& c) {
  if (c.admin()) return error(403, "volunteering needs the node's own token", "forbidden");
  if (c.who.node.role != "worker") return error(403, "a backbone's token holds no experts: workers volunteer", "forbidden");
  Result<VolunteerRequest> v = parse_volunteer(c.req.body);
  if (!v) return error(400, v.status().message(), "invalid_body");
  if (v->node_id != c.who.node.node_id) return error(403, "node_id is not the token's node", "forbidden");
  Result<bool> nothing = market.tells_nothing(*store, v->node_id, c.now_ms);
  if (!nothing) return store_failed(nothing.status());
  if (*nothing) return volunteer_reply(cat, {});
  VolunteerChoice choice;
  Status st = store->exclusive([&]() -> Status {
    std::vector<size_t> held;
    if (v->has_holding) {
      for (const RangeRef& r : v->holding) {
        if (std::optional<size_t> i = cat.find(r.layer, r.expert_first, r.expert_count)) held.push_back(*i);
      }
    } else {
      ESSAIM_ASSIGN_OR_RETURN(std::vector<HoldingRow> holdings, store->holdings_of(v->node_id));
      for (const HoldingRow& h : holdings) {
        if (std::optional<size_t> i = cat.find(h.layer, h.expert_first, h.expert_count)) held.push_back(*i);
      }
    }
    ESSAIM_ASSIGN_OR_RETURN(choice, decide_volunteer(v->node_id, held, v->budget_bytes, c.now_ms));
    return store->set_pending(v->node_id, reservations(cat, v->node_id, choice, c.now_ms), c.now_ms);
  });
  if (!st) return store_failed(st);
  return volunteer_reply(cat, choice);
}

net::HttpReply Coordinator::Impl::expert_map(const ApiCall& c) {
  Result<std::shared_ptr<const MarketState>> state = market.current(*store, c.now_ms);
  if (!state) return store_failed(state.status());
  const MarketSnapshot& s = (*state)->snapshot;
  json workers = json::array();
  for (const MapWorker& w : coord::expert_map(cat, s.nodes, s.holdings, c.now_ms, cfg.heartbeat_s)) {
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
