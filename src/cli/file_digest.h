// SHA-256 of a file on disk, for the `--json` summaries ("files": [{"path", "bytes", "sha256"}]).
//
//   ESSAIM_ASSIGN_OR_RETURN(nlohmann::json f, file_summary_json("/tmp/l.npy"));
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/status.h"
#include "slice/model_identity.h"

namespace essaim::cli {

Result<Sha256Digest> sha256_of_file(const std::string& path);
// {"path": ..., "bytes": ..., "sha256": hex}
nlohmann::json file_json(const std::string& path, uint64_t bytes, const Sha256Digest& sha256);
Result<nlohmann::json> file_summary_json(const std::string& path);

}  // namespace essaim::cli
