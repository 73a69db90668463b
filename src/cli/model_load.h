// Loading a model for a subcommand. With --mlock every page is read first, with progress on a terminal
// (mlock itself faults the whole file in silently — minutes for a large model), then the model is loaded
// and pinned from the warm page cache.
//
//   ESSAIM_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, load_model_for_cli(args.model, args.mlock));
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "model/model.h"

namespace essaim::cli {

Result<std::unique_ptr<Model>> load_model_for_cli(const std::string& path, bool mlock);

}  // namespace essaim::cli
