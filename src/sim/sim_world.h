// The state essaim-sim's actors share (internal to src/sim): the model, the market, the nodes, the report.
// Actors run one at a time (SimGrid's maestro schedules them), so nothing here needs a lock.
#pragma once

#include <simgrid/s4u.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "sim/cost_model.h"
#include "sim/model_shape.h"
#include "sim/routing_model.h"
#include "sim/scenario.h"
#include "sim/sim_market.h"
#include "sim/swarm_sim.h"

namespace essaim::sim {

namespace sg4 = simgrid::s4u;

// The coordinator's clock starts here (ms since the epoch), so a first heartbeat is never at 0.
inline constexpr int64_t kEpochMs = 1'700'000'000'000;
// Simulated flop/s of a calibrating core: a host of speed x computes x * kCoreFlops, and a task of t
// calibrated seconds is t * kCoreFlops flops.
inline constexpr double kCoreFlops = 1e9;

struct WorkerNode {
  std::string id;
  size_t device_class = 0;
  sg4::Host* host = nullptr;
  sg4::Mailbox* inbox = nullptr;  // expert calls
  sg4::ActorPtr server;           // while online
  int64_t budget_bytes = 0;
  double joined_s = 0;            // start of the current online period
  bool online = false;
  std::vector<size_t> held;       // catalogue slices on its disk (kept while offline)
  uint64_t pairs_credited = 0;
};

// One request of a backbone to a worker for one layer, and its answer.
struct ExpertCall {
  uint64_t id = 0;
  int32_t layer = 0;
  size_t backbone = 0;
  std::vector<std::pair<int32_t, int64_t>> expert_rows;  // (expert, rows)
  double sent_s = 0;
};
struct ExpertAnswer {
  uint64_t id = 0;
  size_t worker = 0;
};

// Idle workers (holding and reserving nothing) while nothing is needed: each would heartbeat and volunteer
// every heartbeat and be told nothing. They wait here instead, and the pool wakes the one whose heartbeat
// comes first once something is needed (as the first idle node to heartbeat then is the one assigned);
// the requests they would have made are counted. This is what lets 10,000 mostly idle workers run.
class IdlePool {
 public:
  explicit IdlePool(struct World& w);
  // Blocks worker i, whose next heartbeat is at next_tick (then every heartbeat_s), until the pool wakes it
  // at one of its heartbeats (true) or until `until` (false).
  bool wait(size_t i, double next_tick, double until);
  void dispatch();  // the pool's actor

 private:
  struct World& w_;
  std::set<std::pair<double, size_t>> by_phase_;  // (next tick mod heartbeat, worker)
  std::vector<sg4::SemaphorePtr> wake_;
  std::vector<double> phase_;
  sg4::MutexPtr mu_;
  sg4::ConditionVariablePtr changed_;
};

struct World {
  explicit World(const Scenario& s) : sc(s) {}
  const Scenario& sc;
  ModelShape shape;
  coord::Catalogue cat;
  CostModel cost;
  RoutingModel routing;
  std::unique_ptr<SimMarket> market;
  std::vector<std::vector<size_t>> slice_of;  // [layer][expert] -> catalogue slice
  std::vector<int64_t> sorted_slice_bytes;    // every slice's bytes, ascending
  std::vector<WorkerNode> workers;
  std::map<std::string, size_t> worker_index;
  std::vector<sg4::Host*> backbones;
  std::vector<sg4::Mailbox*> backbone_inbox;  // answers
  sg4::Host* slice_server = nullptr;
  // The one machine every backbone and worker computes on (scenario shared_host_cores), or null.
  sg4::Host* shared_cpu = nullptr;
  std::vector<std::vector<size_t>> fixed_held;  // fixed placement: [worker] -> its catalogue slices
  double end_s = 0;
  SimReport report;
  std::unique_ptr<IdlePool> idle;

  static double now_s() { return sg4::Engine::get_clock(); }
  static int64_t now_ms() { return kEpochMs + int64_t(sg4::Engine::get_clock() * 1000.0); }
  // Calibrated seconds of the experts of one call (rows per expert) on a calibrating core.
  double call_seconds(int32_t layer, const std::vector<std::pair<int32_t, int64_t>>& expert_rows) const;
  // Starts `flops` on the node's own host, or on the shared machine when there is one (its cores are shared
  // by whatever runs at the same time: SimGrid divides a host's speed among its executions).
  sg4::ExecPtr start_compute(sg4::Host* own, double flops) const;
  // Flops of `seconds` of the backbone's stated work (its host runs backbone_speed times a calibrating core;
  // on the shared machine, one core of it).
  double backbone_flops(double seconds) const { return seconds * (shared_cpu ? 1.0 : sc.backbone_speed) * kCoreFlops; }
};

void build_platform(World& w, std::mt19937_64& rng);  // sim_platform.cpp
void worker_life(World& w, size_t i);                  // sim_worker.cpp
void fixed_worker_life(World& w, size_t i);            // sim_worker.cpp
void backbone_main(World& w, size_t b);                // sim_backbone.cpp

}  // namespace essaim::sim
