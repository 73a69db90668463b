// Which slice files of a `slice --plan` folder a worker serves: `essaim worker --slices DIR --experts A-B
// [--layers A-B]` reads DIR/manifest.json and takes every slice whose experts (and layers) lie inside the
// ranges asked — one flag instead of one --slice per layer.
//
//   ESSAIM_ASSIGN_OR_RETURN(std::vector<std::string> files, select_slices("slices/", {{0, 32}}, std::nullopt));
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace essaim::cli {

using IndexRange = std::pair<uint32_t, uint32_t>;  // (first, count)

// Paths (DIR/file) of the slices inside `experts` x `layers` (nullopt = all), in manifest order. Errors: no
// manifest, no slice inside the ranges, or a slice straddling a range's edge (only part of it was asked for;
// the message names it and the slice boundaries to use instead).
Result<std::vector<std::string>> select_slices(const std::string& dir, std::optional<IndexRange> experts,
                                               std::optional<IndexRange> layers);

}  // namespace essaim::cli
