// The slice catalogue of one model: read from the slices directory's manifest.json, or — when the
// directory has none — cut there first (the `essaim slice --plan N` code), then checked against the model.
//
//   ESSAIM_ASSIGN_OR_RETURN(Catalogue cat, load_catalogue({.model = "m.gguf", .slices_dir = "slices/"}));
#pragma once

#include <cstdint>
#include <string>

#include "coord/placement.h"

namespace essaim::coord {

struct CatalogueOptions {
  std::string model;             // the full GGUF
  std::string slices_dir;
  uint32_t slice_experts = 32;   // experts per slice when the plan is cut here
  int64_t protocol_version = 0;  // the build's, which nodes must match
  std::string kernel_abi;
  bool quiet = false;            // no progress lines while cutting
};

// Errors name what to fix: a manifest of another model, a missing or resized slice file, a multi-layer slice.
// Slice files are checked by size here (hashing a whole model at every start would take minutes); a node
// verifies every byte it downloads against the SHA-256 served with it.
Result<Catalogue> load_catalogue(const CatalogueOptions& opt);

}  // namespace essaim::coord
