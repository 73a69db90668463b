#include "sim/swarm_sim.h"

#include <xbt/log.h>

#include <algorithm>
#include <chrono>

#include "sim/sim_data.h"
#include "sim/sim_world.h"

namespace essaim::sim {

sg4::ExecPtr World::start_compute(sg4::Host* own, double flops) const {
  sg4::ExecPtr e = sg4::this_actor::exec_init(flops);
  if (shared_cpu) e->set_host(shared_cpu);
  else e->set_host(own);
  e->start();
  return e;
}

double World::call_seconds(int32_t layer, const std::vector<std::pair<int32_t, int64_t>>& expert_rows) const {
  double s = 0;
  for (const auto& [e, rows] : expert_rows) s += cost.expert_seconds(rows, shape.down_type[size_t(layer)]);
  return s;
}

namespace {

Status load_model(World& w) {
  if (w.sc.model_file.empty()) {
    w.shape = qwen35_122b();
  } else {
    ESSAIM_ASSIGN_OR_RETURN(w.shape, model_shape_from_gguf(w.sc.model_file));
  }
  w.cat = w.sc.fixed_placement ? range_catalogue(w.shape, w.sc.workers, w.fixed_held)
                               : slice_catalogue(w.shape, w.sc.experts_per_slice);
  ESSAIM_ASSIGN_OR_RETURN(w.cost, CostModel::from_json(w.sc.expert_cost_json.empty() ? expert_cost_json()
                                                                                     : std::string_view(w.sc.expert_cost_json)));
  if (w.sc.uniform_routing) {
    ESSAIM_ASSIGN_OR_RETURN(w.routing, RoutingModel::uniform(w.shape.n_layers, w.shape.n_experts, w.shape.k));
  } else {
    ESSAIM_ASSIGN_OR_RETURN(w.routing, RoutingModel::from_json(router_stats_json(), w.shape.n_layers,
                                                               w.shape.n_experts, w.shape.k, w.sc.seed));
  }
  w.slice_of.assign(size_t(w.shape.n_layers), std::vector<size_t>(size_t(w.shape.n_experts), 0));
  for (size_t i = 0; i < w.cat.slices.size(); ++i) {
    const coord::CatalogueSlice& s = w.cat.slices[i];
    for (int64_t e = s.expert_first; e < s.expert_first + s.expert_count; ++e) w.slice_of[size_t(s.layer)][size_t(e)] = i;
    w.sorted_slice_bytes.push_back(s.bytes);
  }
  std::sort(w.sorted_slice_bytes.begin(), w.sorted_slice_bytes.end());
  w.market = std::make_unique<SimMarket>(w.cat, coord::MarketRules{.heartbeat_s = w.sc.heartbeat_s, .replicas = w.sc.replicas});
  return Status::ok();
}

void sample_coverage(World& w) {
  while (World::now_s() < w.end_s) {
    const std::vector<int64_t> h = w.market->holders(World::now_ms());
    CoveragePoint p{.t_s = World::now_s()};
    for (int64_t x : h) {
      p.covered += x >= 1;
      p.replicated += x >= w.sc.replicas;
    }
    p.covered /= double(h.size());
    p.replicated /= double(h.size());
    for (const WorkerNode& n : w.workers) {
      p.online += n.online;
      p.holding += n.online && !n.held.empty();
    }
    w.report.coverage.push_back(p);
    sg4::this_actor::sleep_for(std::min(w.sc.coverage_every_s, std::max(1e-3, w.end_s - World::now_s())));
    if (World::now_s() >= w.end_s) break;
  }
}

void fill_report(World& w) {
  SimReport& r = w.report;
  r.simulated_s = World::now_s();
  const MarketCounters& c = w.market->counters();
  r.heartbeats = c.heartbeats;
  r.volunteers = c.volunteers;
  r.map_reads = c.map_reads;
  r.decisions = c.decisions;
  r.skipped = c.skipped;
  r.assigned = c.assigned;
  r.swaps = c.swaps;
  r.drops = c.drops;
  for (const WorkerNode& n : w.workers) {
    r.earners.push_back({n.id, w.sc.classes[n.device_class].name, n.budget_bytes, n.pairs_credited});
  }
  r.final_holdings = w.market->holdings();
}

}  // namespace

Result<SimReport> run_swarm(const Scenario& s, int* argc, char** argv) {
  const auto wall0 = std::chrono::steady_clock::now();
  sg4::Engine engine(argc, argv);
  xbt_log_control_set("root.thres:critical");
  // Flow-level TCP without LV08's slow-start corrections: essaim's links are long-lived connections.
  sg4::Engine::set_config("network/model:CM02");
  sg4::Engine::set_config("contexts/stack-size:96");  // KiB: actors keep their data on the heap
  // No guard page per actor stack: 10,000 workers' actors would pass Linux's 65,536 mappings per process.
  sg4::Engine::set_config("contexts/guard-size:0");
  World w(s);
  ESSAIM_RETURN_IF_ERROR(load_model(w));
  std::mt19937_64 rng(s.seed);
  build_platform(w, rng);
  w.end_s = s.hours * 3600;
  w.idle = std::make_unique<IdlePool>(w);
  sg4::Actor::create("idle-pool", w.slice_server, [&w] { w.idle->dispatch(); });
  for (size_t i = 0; i < w.workers.size(); ++i) {
    sg4::Actor::create("life-" + w.workers[i].id, w.workers[i].host,
                       [&w, i] { w.sc.fixed_placement ? fixed_worker_life(w, i) : worker_life(w, i); });
  }
  for (size_t b = 0; b < w.backbones.size(); ++b) {
    sg4::Actor::create("backbone-" + std::to_string(b), w.backbones[b], [&w, b] { backbone_main(w, b); });
  }
  sg4::Actor::create("coverage", w.slice_server, [&w] { sample_coverage(w); });
  engine.run();
  fill_report(w);
  w.report.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return std::move(w.report);
}

}  // namespace essaim::sim
