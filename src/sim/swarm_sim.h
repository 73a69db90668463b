// essaim-sim's run: a SimGrid platform of backbones, workers and the coordinator's slice server, actors
// that run essaim's own decisions (the market: SimMarket over coord/placement; the backbone: ReplicaChooser,
// hedging and the deadline's fallback as RemoteExpertExecutor applies them, AuditPolicy, the hot-expert
// cache's ExpertUsageWindow + choose_hot_set), compute times from the calibrated cost model, wire bytes
// from the protocol's encoder. SimGrid (libsimgrid-dev) moves the bytes (its flow-level network model) and
// keeps the clock; one run per process (SimGrid's engine is a singleton).
//
//   ESSAIM_ASSIGN_OR_RETURN(Scenario s, parse_scenario(text));
//   ESSAIM_ASSIGN_OR_RETURN(SimReport r, run_swarm(s, argc, argv));
//   std::puts(report_json(s, r).c_str());
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "sim/scenario.h"

namespace essaim::sim {

struct CoveragePoint {
  double t_s = 0;
  double covered = 0;      // share of slices with >= 1 live holder (the coordinator's count)
  double replicated = 0;   // share with >= replicas live holders
  int64_t online = 0;      // workers online
  int64_t holding = 0;     // workers holding at least one slice
};

struct SimReport {
  double simulated_s = 0, wall_s = 0;
  uint64_t tokens = 0;
  double step_seconds = 0;                 // summed over backbones
  std::vector<double> token_latency_s;     // one per step per backbone (every sequence's token of that step)
  uint64_t pairs_remote = 0, pairs_hot = 0, pairs_fallback = 0, pairs_failed = 0, pairs_hedged = 0;
  uint64_t calls = 0, calls_timed_out = 0, audits = 0;
  uint64_t bytes_up = 0, bytes_down = 0;    // backbone -> workers, workers -> backbone
  uint64_t slice_downloads = 0, slice_bytes = 0;
  uint64_t joins = 0, kills = 0, leaves = 0;
  std::vector<CoveragePoint> coverage;
  // Market.
  uint64_t heartbeats = 0, volunteers = 0, map_reads = 0, decisions = 0, skipped = 0, assigned = 0, swaps = 0,
           drops = 0;
  // Rewards: pairs credited per node (accepted remote answers), the node's class and budget.
  struct Earner {
    std::string node_id, device_class;
    int64_t budget_bytes = 0;
    uint64_t pairs = 0;
  };
  std::vector<Earner> earners;
  std::map<std::string, std::vector<size_t>> final_holdings;  // node id -> slices, as the market saw them last
};

Result<SimReport> run_swarm(const Scenario& s, int* argc, char** argv);

}  // namespace essaim::sim
