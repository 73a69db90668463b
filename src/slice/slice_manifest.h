// The manifest of a sliced model (manifest.json, schema in docs/slicing.md): which files hold which
// (layers, experts), their byte sizes and SHA-256, and the identity of the model they were cut from.
// A worker or the coordinator checks every file against it before use (docs/invariants.md invariant 3).
//
//   ESSAIM_ASSIGN_OR_RETURN(SliceManifest m, SliceManifest::load("out/manifest.json"));
//   ESSAIM_RETURN_IF_ERROR(verify_manifest(m, "out"));     // every size and hash, or a list of failures
//
// Manifests travel over the network, so parse() treats its input as hostile: every field is type-checked,
// file names must be plain names inside the manifest's directory, ranges must lie inside the source model.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/progress.h"
#include "core/status.h"
#include "slice/model_identity.h"

namespace essaim {

inline constexpr std::string_view kManifestFormat = "essaim-slice-manifest";
inline constexpr uint32_t kManifestVersion = 1;
inline constexpr uint64_t kManifestMaxBytes = uint64_t(64) << 20;  // load() refuses larger files
inline constexpr size_t kManifestMaxSlices = size_t(1) << 20;

struct ManifestSlice {
  std::string file;  // plain file name, in the manifest's directory
  uint32_t layer_first = 0;
  uint32_t layer_count = 0;
  uint32_t expert_first = 0;
  uint32_t expert_count = 0;
  uint64_t bytes = 0;
  Sha256Digest sha256{};
};

struct ManifestBackbone {
  std::string file;
  uint64_t bytes = 0;
  Sha256Digest sha256{};
};

struct SliceManifest {
  ModelIdentity source_model{};
  std::string source_file;  // the source's file name, informative only
  std::string source_architecture;
  uint32_t source_block_count = 0;
  uint32_t source_expert_count = 0;
  std::vector<ManifestSlice> slices;
  std::optional<ManifestBackbone> backbone;

  std::string to_json() const;  // stable key order, one slice per line
  static Result<SliceManifest> parse(std::string_view json);
  static Result<SliceManifest> load(const std::string& path);
  Status save(const std::string& path) const;  // written to path.part, then renamed
};

// True for a name that stays inside its directory: non-empty, at most 255 bytes, no '/', '\\' or NUL,
// not "." or "..".
bool manifest_file_name_is_plain(std::string_view name);

// Checks every listed file in `dir`: present, of the listed size, with the listed SHA-256. Sizes are checked
// before hashing, so a truncated download is reported without reading it. The error lists every failure.
// `progress` (may be null) advances by each listed file's bytes as it is checked.
Status verify_manifest(const SliceManifest& manifest, const std::string& dir, Progress* progress = nullptr);

}  // namespace essaim
