// The market's decisions as pure functions of the state (no HTTP, no database, no clock): who counts as a
// holder, how scarce each range is, what a volunteer is assigned, what the backbone's expert map lists.
// Same inputs, same outputs, so two coordinator processes on one database decide alike.
//
//   std::vector<int64_t> h = count_holders(cat, nodes, holdings, now_ms, heartbeat_s);
//   std::vector<RangeDemand> d = compute_demand(cat, h, usage, replicas);       // scarcest first
//   VolunteerChoice c = choose_volunteer(cat, d, held, budget_bytes);
//
// Scarcity of a range = max(0, wanted - holders) x usage, where usage is the range's share of the router's
// picks in its layer (expert_count / n_experts before any usage report). It is 0 once a range has its
// replicas, grows with the missing replicas and with how often the backbone needs those experts.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "coord/store.h"

namespace essaim::coord {

struct CatalogueSlice {
  std::string name;  // file name in the slices directory
  int64_t layer = 0, expert_first = 0, expert_count = 0;
  int64_t bytes = 0;
  std::string sha256;  // 64 hex
};

struct Catalogue {
  std::string model_identity;  // 64 hex
  std::string architecture;
  int64_t n_layers = 0, n_experts = 0, n_expert_used = 0;
  int64_t protocol_version = 0;
  std::string kernel_abi;
  std::vector<CatalogueSlice> slices;  // sorted by (layer, expert_first)

  // Index of the slice that is exactly this range, or nullopt.
  std::optional<size_t> find(int64_t layer, int64_t expert_first, int64_t expert_count) const;
  std::optional<size_t> find_name(const std::string& name) const;
};

// Fresh heartbeat (within 3 x heartbeat_s), fingerprint ok, not revoked, not dropped.
bool node_is_holder(const NodeRow& n, int64_t now_ms, int64_t heartbeat_s);
// "active" (a fresh holder or a node that never heartbeated yet... see docs/market.md), "stale", "dropped", "revoked".
std::string node_status(const NodeRow& n, int64_t now_ms, int64_t heartbeat_s);

// Per catalogue slice: how many healthy nodes hold it with the catalogue's SHA-256.
std::vector<int64_t> count_holders(const Catalogue& cat, const std::vector<NodeRow>& nodes,
                                   const std::vector<HoldingRow>& holdings, int64_t now_ms, int64_t heartbeat_s);

// Per catalogue slice: its share of the router's picks within its layer, in [0, 1].
std::vector<double> usage_shares(const Catalogue& cat, const std::vector<UsageRow>& usage);

struct RangeDemand {
  size_t slice = 0;  // index into cat.slices
  int64_t wanted = 0, holders = 0;
  double usage = 0, scarcity = 0;
};

// Every slice, sorted by scarcity descending, then (layer, expert_first).
std::vector<RangeDemand> compute_demand(const Catalogue& cat, const std::vector<int64_t>& holders,
                                        const std::vector<double>& usage, int64_t replicas);

struct VolunteerChoice {
  std::vector<size_t> assign;  // slice indices, scarcest first
  std::vector<size_t> drop;    // held slices with more than `wanted` holders, when something scarce did not fit
};

// `demand` should count other volunteers' pending assignments as holders. Already-held slices count against
// the budget and are never assigned again; the scarce slices that fit what is left are taken greedily in
// demand order (a slice that does not fit is skipped, a smaller later one may still fit).
VolunteerChoice choose_volunteer(const Catalogue& cat, const std::vector<RangeDemand>& demand,
                                 const std::vector<size_t>& held, int64_t budget_bytes);

struct MapWorker {
  std::string node_id, address;
  std::vector<size_t> slices;
};
// Healthy holders in registration order (nodes as list_nodes returns them), each with its valid holdings.
std::vector<MapWorker> expert_map(const Catalogue& cat, const std::vector<NodeRow>& nodes,
                                  const std::vector<HoldingRow>& holdings, int64_t now_ms, int64_t heartbeat_s);

}  // namespace essaim::coord
