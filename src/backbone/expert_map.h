// The expert map: which worker endpoints the backbone dispatches to, and which (layer, expert range) each
// may serve. From the command line (`--worker HOST:PORT`, repeatable: holdings are learned at the
// handshake) or from a JSON file (`--expert-map FILE`, docs/dispatch.md), which may also restrict what is
// routed to each worker.
//
//   ESSAIM_ASSIGN_OR_RETURN(ExpertMap map, expert_map_from_addresses({"10.0.0.2:9000", "10.0.0.3:9000"}));
//   ESSAIM_ASSIGN_OR_RETURN(ExpertMap map, expert_map_load("swarm.json"));
//
//   // Per worker, what the dispatcher routes to it: announced ∩ declared ∩ the backbone's replica.
//   std::vector<proto::Holding> r = routable_holdings(hello.holdings, map.workers[0].holdings, replica);
//   holdings_contain(r, /*layer=*/3, /*expert=*/17);
//
// Overlapping holdings are replicas: the dispatcher gives an expert to the first worker, in map order,
// that is healthy and holds it, so the choice is deterministic.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "moe/executor.h"
#include "proto/messages.h"

namespace essaim::backbone {

// Limits on a map file (untrusted input: checked before anything is allocated from it).
inline constexpr size_t kMaxMapFileBytes = 16u << 20;
inline constexpr size_t kMaxMapWorkers = 4096;
inline constexpr size_t kMaxMapHoldings = 1u << 20;  // over all workers

struct WorkerEndpoint {
  std::string address;  // "host:port", or "ws[s]://relay:port/node/NODE_ID" behind a relay; the worker's name in stats
  std::string label;    // optional human name from the map file
  // nullopt: route whatever the worker announces. Otherwise route only experts both declared here and
  // announced by the worker (an operator pinning replicas to experts).
  std::optional<std::vector<proto::Holding>> holdings;
};

struct ExpertMap {
  std::vector<WorkerEndpoint> workers;  // map order = replica preference order
};

// One endpoint per address, holdings learned at the handshake. Refuses malformed addresses.
Result<ExpertMap> expert_map_from_addresses(std::span<const std::string> addresses);
// The JSON form (docs/dispatch.md): {"format": "essaim-expert-map", "version": 1, "workers": [{"address":
// "h:p", "label": "...", "holdings": [{"layer": 3, "expert_first": 0, "expert_count": 32}]}]}.
Result<ExpertMap> expert_map_parse(std::string_view json);
Result<ExpertMap> expert_map_load(const std::string& path);

// What the dispatcher routes to one worker: the announced holdings, restricted to the declared ones when
// the map has any, and to the experts the backbone's replica holds (a worker claiming a layer the model
// lacks is simply never asked for it). Ranges come out in announced order, never empty.
std::vector<proto::Holding> routable_holdings(std::span<const proto::Holding> announced,
                                              const std::optional<std::vector<proto::Holding>>& declared,
                                              const ExpertStore& replica);

bool holdings_contain(std::span<const proto::Holding> holdings, uint32_t layer, uint32_t expert);

// "layer 3 experts 0-31, layer 4 experts 0-31" for logs.
std::string holdings_text(std::span<const proto::Holding> holdings);

}  // namespace essaim::backbone
