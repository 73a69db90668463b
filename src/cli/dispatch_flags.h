// The swarm flags of `essaim run`, `eval`, `perplexity` and `serve`, into the backbone's SwarmSetup (the
// executor it selects: backbone/swarm_setup.h).
//
//   backbone::SwarmSetup swarm;
//   add_dispatch_flags(*cmd, swarm);        // --worker, --expert-map, --coordinator, --worker-timeout-ms, ...
//   ESSAIM_ASSIGN_OR_RETURN(backbone::ExecutorChoice ex, backbone::make_expert_executor(*model, &pool, swarm, "essaim run"));
#pragma once

#include <CLI/CLI.hpp>

#include "backbone/swarm_setup.h"

namespace essaim::cli {

void add_dispatch_flags(CLI::App& cmd, backbone::SwarmSetup& setup);

}  // namespace essaim::cli
