// The measurements essaim-sim is calibrated with, compiled in from src/sim/data/ (each file says which
// command made it): the expert FFN's time (bench/expert_bench) and the trained model's router picks.
#pragma once

#include <string_view>

namespace essaim::sim {

std::string_view expert_cost_json();   // data/expert_cost.json
std::string_view router_stats_json();  // data/kjv_moe_router.json

}  // namespace essaim::sim
