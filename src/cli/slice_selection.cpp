#include "cli/slice_selection.h"

#include <filesystem>

#include "slice/slice_manifest.h"

namespace essaim::cli {
namespace {

enum class Overlap { NONE, INSIDE, PARTIAL };

Overlap overlap(uint32_t first, uint32_t count, const std::optional<IndexRange>& asked) {
  if (!asked) return Overlap::INSIDE;
  const uint64_t a0 = asked->first, a1 = uint64_t(asked->first) + asked->second;  // [a0, a1)
  const uint64_t s0 = first, s1 = uint64_t(first) + count;
  if (s1 <= a0 || a1 <= s0) return Overlap::NONE;
  return (a0 <= s0 && s1 <= a1) ? Overlap::INSIDE : Overlap::PARTIAL;
}

std::string range_text(uint32_t first, uint32_t count) {
  return std::to_string(first) + "-" + std::to_string(uint64_t(first) + count - 1);
}

}  // namespace

Result<std::vector<std::string>> select_slices(const std::string& dir, std::optional<IndexRange> experts,
                                               std::optional<IndexRange> layers) {
  const std::string manifest_path = (std::filesystem::path(dir) / "manifest.json").string();
  ESSAIM_ASSIGN_OR_RETURN(const SliceManifest m, SliceManifest::load(manifest_path));
  std::vector<std::string> out;
  for (const ManifestSlice& s : m.slices) {
    const Overlap e = overlap(s.expert_first, s.expert_count, experts);
    const Overlap l = overlap(s.layer_first, s.layer_count, layers);
    if (e == Overlap::NONE || l == Overlap::NONE) continue;
    if (e == Overlap::PARTIAL || l == Overlap::PARTIAL)
      return Status::error(s.file + " (layers " + range_text(s.layer_first, s.layer_count) + ", experts " +
                           range_text(s.expert_first, s.expert_count) + ") lies only partly inside the ranges "
                           "asked; a worker serves whole slices: choose ranges on slice boundaries (" +
                           manifest_path + " lists them) or re-slice");
    out.push_back((std::filesystem::path(dir) / s.file).string());
  }
  if (out.empty())
    return Status::error("no slice of " + manifest_path + " lies inside the ranges asked" +
                         (experts ? " (experts " + range_text(experts->first, experts->second) + ")" : std::string()));
  return out;
}

}  // namespace essaim::cli
