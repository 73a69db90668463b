// The market's decisions as pure functions of the state (no HTTP, no database, no clock): who counts as a
// holder, how scarce each range is, what a volunteer is assigned, what the backbone's expert map lists.
// Same inputs, same outputs, so two coordinator processes on one database decide alike.
//
//   std::vector<int64_t> h = count_holders(cat, nodes, holdings, now_ms, heartbeat_s);
//   std::vector<RangeDemand> d = compute_demand(cat, h, usage, replicas);       // scarcest first
//   VolunteerChoice c = choose_volunteer(cat, d, held, budget_bytes, swarm_room(...));
//   VolunteerChoice v = decide_volunteer(cat, snapshot, pending, {node_id, held, budget, now_ms}, rules);  // all of it
//
// Scarcity of a range = max(0, wanted - holders) x usage, where usage is the range's share of the router's
// picks in its layer (expert_count / n_experts before any usage report). It is 0 once a range has its
// replicas, grows with the missing replicas and with how often the backbone needs those experts.
//
// Coverage comes before redundancy: a range with no holder is assigned before any second replica, and a
// node with no room for a needed range is asked to swap one of its ranges that keeps enough other holders
// for it (take the new one, verify it, then give up the old: coverage never dips while it moves).
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

struct SwapOrder {
  size_t take = 0;     // download and verify this slice first...
  size_t give_up = 0;  // ...then stop serving this one
  bool operator==(const SwapOrder&) const = default;
};

struct VolunteerChoice {
  std::vector<size_t> assign;  // slice indices, holes first, then scarcest first
  std::vector<size_t> drop;    // held slices with more than `wanted` holders, when something scarce did not fit
  std::vector<SwapOrder> swap;  // at most one: a node holds at most one slice over its budget while it swaps
  bool empty() const { return assign.empty() && drop.empty() && swap.empty(); }
};

// What the rest of the swarm can do, per catalogue slice, as the asking node sees it (swarm_room computes it).
struct SwarmRoom {
  std::vector<int64_t> takers;   // other live nodes that lack the slice and have free budget for it
  std::vector<int64_t> serving;  // holders serving it now and not giving it up (the asker included)
};

// `demand` should count holders as they will be once other nodes' pending assignments land: their takes
// (a swap's too) added, their swaps' give-ups taken away (future_holders). Already-held slices count against
// the budget and are never assigned again; the needed slices (fewer holders than wanted) that fit what is
// left are taken greedily, holes first, then in demand order (a slice that does not fit is skipped, a
// smaller later one may still fit). When a needed slice R did not fit, one held slice X is offered in swap
// for it (X least used first) if X's holders h_X satisfy h_X - 1 >= h_R + 1, or
// h_X - 1 == h_R and some taker has room for X (it will then take X back): every swap makes the holder
// counts more even, or lets a node with free room add a replica, so swaps never cycle. And X must keep a
// holder that serves it now: `serving` (holders now, less other swaps' give-ups, not counting downloads
// in progress) is at least 2 (when `room` has no `serving`, the demand's holders stand for it).
VolunteerChoice choose_volunteer(const Catalogue& cat, const std::vector<RangeDemand>& demand,
                                 const std::vector<size_t>& held, int64_t budget_bytes, const SwarmRoom& room = {});

// A live node as the healing decisions see it: what it will hold once its pending assignments land (its
// holdings, plus takes, minus give-ups), what it serves now and is not giving up, and its budget.
struct NodeHoldings {
  std::string node_id;
  std::vector<size_t> slices;
  std::vector<size_t> serving;
  int64_t budget_bytes = 0;
};
// SwarmRoom for `asker`, which holds `held`, from every live node (the asker's own holdings count in
// `serving` only). Takers are counted for `held` only (the only slices a swap may give up): O(nodes x held).
SwarmRoom swarm_room(const Catalogue& cat, const std::vector<NodeHoldings>& nodes, const std::string& asker,
                     const std::vector<size_t>& held);

// The store's rows one decision reads, at one moment.
struct MarketSnapshot {
  std::vector<NodeRow> nodes;  // registration order
  std::vector<HoldingRow> holdings;
  std::vector<UsageRow> usage;
};

struct VolunteerAsk {
  std::string node_id;
  std::vector<size_t> held;  // catalogue slices the node says it holds
  int64_t budget_bytes = 0;
  int64_t now_ms = 0;
};
struct MarketRules {
  int64_t heartbeat_s = 10;
  int64_t replicas = 2;  // wanted holders per range
};

// What a volunteer is told, from the state and the unexpired pending reservations (Store::list_pending):
// holders count as they will be once the other live nodes' moves land (their takes added, their swaps'
// give-ups taken away; reservations of gone nodes ignored), the asker's own moves are offered again, and
// the swarm's room is seen from every healthy node's future holdings. The coordinator's heartbeat and
// volunteer endpoints decide through this function; it indexes the state (MarketIndex, placement_index.h)
// and decides from the index, which essaim-sim keeps up to date node by node instead. Every slice at
// `wanted` or more future holders (MarketIndex::future_holders) means an empty choice for any asker without
// a reservation of its own: nothing is needed, so nothing is assigned, swapped or dropped.
VolunteerChoice decide_volunteer(const Catalogue& cat, const MarketSnapshot& s, const std::vector<PendingRow>& pending,
                                 const VolunteerAsk& ask, const MarketRules& rules);
inline constexpr int64_t kPendingMs = 10 * 60 * 1000;  // a volunteer's assignment is reserved this long
// The pending rows a volunteer's choice reserves (Store::set_pending): its takes (a swap's too), until
// now + kPendingMs, and a swap's give-up.
std::vector<PendingRow> reservations(const Catalogue& cat, const std::string& node_id, const VolunteerChoice& choice,
                                     int64_t now_ms);

// Usage counts decay with a half-life: the factor to multiply counts by after `elapsed_ms` (1 when the
// half-life is 0, i.e. no decay).
double usage_decay_factor(int64_t elapsed_ms, int64_t half_life_ms);

struct MapWorker {
  std::string node_id, address;
  std::vector<size_t> slices;
};
// Healthy holders in registration order (nodes as list_nodes returns them), each with its valid holdings.
std::vector<MapWorker> expert_map(const Catalogue& cat, const std::vector<NodeRow>& nodes,
                                  const std::vector<HoldingRow>& holdings, int64_t now_ms, int64_t heartbeat_s);

}  // namespace essaim::coord
