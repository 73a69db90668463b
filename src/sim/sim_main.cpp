// essaim-sim: the swarm at internet scale on SimGrid, running essaim's own policies (docs/scale.md).
//
//   essaim-sim --workers 1000 --backbones 4 --hours 24 --seed 1 --scenario diurnal.json --json
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "sim/scenario.h"
#include "sim/sim_report.h"
#include "sim/swarm_sim.h"

int main(int argc, char** argv) {
  using namespace essaim::sim;
  CLI::App app{"essaim-sim: a swarm of workers, backbones and the coordinator on SimGrid, running essaim's policies"};
  std::string scenario_file;
  int64_t workers = 0, backbones = 0;
  double hours = 0;
  uint64_t seed = 0;
  bool json_out = false, holdings = false;
  app.add_option("--scenario", scenario_file, "Scenario JSON (docs/scale.md lists the fields)")->check(CLI::ExistingFile);
  app.add_option("--workers", workers, "Workers (overrides the scenario)")->check(CLI::Range(int64_t(1), int64_t(1'000'000)));
  app.add_option("--backbones", backbones, "Backbones (overrides the scenario)")->check(CLI::Range(int64_t(1), int64_t(1024)));
  app.add_option("--hours", hours, "Simulated hours (overrides the scenario)")->check(CLI::Range(1e-4, 24.0 * 365));
  app.add_option("--seed", seed, "Seed (overrides the scenario)");
  app.add_flag("--json", json_out, "Print the report as one JSON document (the only output there is)");
  app.add_flag("--holdings", holdings, "Add every worker's final holdings to the report");
  CLI11_PARSE(app, argc, argv);
  std::string text = "{}";
  if (!scenario_file.empty()) {
    std::ifstream in(scenario_file, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    if (!in) {
      std::fprintf(stderr, "essaim-sim: cannot read %s\n", scenario_file.c_str());
      return 1;
    }
    text = ss.str();
  }
  essaim::Result<Scenario> s = parse_scenario(text);
  if (!s) {
    std::fprintf(stderr, "essaim-sim: %s: %s\n", scenario_file.empty() ? "scenario" : scenario_file.c_str(),
                 s.status().message().c_str());
    return 2;
  }
  if (workers) s->workers = workers;
  if (backbones) s->backbones = backbones;
  if (hours > 0) s->hours = hours;
  if (app.count("--seed")) s->seed = seed;
  int engine_argc = 1;
  essaim::Result<SimReport> r = run_swarm(*s, &engine_argc, argv);
  if (!r) {
    std::fprintf(stderr, "essaim-sim: %s\n", r.status().message().c_str());
    return 1;
  }
  std::puts(report_json(*s, *r, holdings).c_str());
  return 0;
}
