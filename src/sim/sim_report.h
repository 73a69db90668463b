// essaim-sim's one JSON document: throughput, token latency, coverage over time, fallback and failed pairs,
// the coordinator's load, rewards (Gini of credited pairs over workers, pairs per GB of budget by class),
// and the scenario that made it.
//
//   std::puts(report_json(scenario, report).c_str());
#pragma once

#include <string>
#include <vector>

#include "sim/scenario.h"
#include "sim/swarm_sim.h"

namespace essaim::sim {

// Gini coefficient of non-negative amounts (0: all equal; 1: one holds everything); 0 for none.
double gini(std::vector<double> amounts);
// The q-quantile (0..1) of `v` by nearest rank; 0 when empty.
double quantile(std::vector<double> v, double q);

std::string report_json(const Scenario& s, const SimReport& r, bool with_holdings = false);

}  // namespace essaim::sim
