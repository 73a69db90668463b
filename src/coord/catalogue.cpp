#include "coord/catalogue.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "gguf/gguf_file.h"
#include "slice/gguf_slice.h"
#include "slice/model_identity.h"
#include "slice/slice_manifest.h"

namespace essaim::coord {

Result<Catalogue> load_catalogue(const CatalogueOptions& opt) {
  namespace fs = std::filesystem;
  ESSAIM_ASSIGN_OR_RETURN(GgufFile src, GgufFile::open(opt.model));
  ESSAIM_ASSIGN_OR_RETURN(MoeLayout moe, moe_layout(src));
  const std::string manifest_path = (fs::path(opt.slices_dir) / "manifest.json").string();
  std::error_code ec;
  if (!fs::exists(manifest_path, ec)) {
    if (opt.slice_experts == 0) return Status::error("--slice-experts must be at least 1");
    ESSAIM_ASSIGN_OR_RETURN(SliceManifest plan, plan_manifest(src, moe, {.experts_per_slice = opt.slice_experts}));
    if (!opt.quiet) {
      std::fprintf(stderr, "essaim coordinator: %s has no manifest.json: cutting %zu slices of %u experts there\n",
                   opt.slices_dir.c_str(), plan.slices.size(), opt.slice_experts);
    }
    Result<SliceManifest> written = write_plan(src, moe, plan, opt.slices_dir);
    if (!written) return written.status().with_context("cutting the slices into " + opt.slices_dir);
  }
  ESSAIM_ASSIGN_OR_RETURN(SliceManifest m, SliceManifest::load(manifest_path));
  if (m.source_model != moe.source_model) {
    return Status::error(manifest_path + " was cut from model " + digest_hex(m.source_model) + ", not from " +
                         opt.model + " (" + digest_hex(moe.source_model) + "): give the matching --slices directory");
  }
  Catalogue cat;
  cat.model_identity = digest_hex(moe.source_model);
  cat.architecture = moe.architecture;
  cat.n_layers = moe.block_count;
  cat.n_experts = moe.expert_count;
  cat.n_expert_used = moe.expert_used_count;
  cat.protocol_version = opt.protocol_version;
  cat.kernel_abi = opt.kernel_abi;
  for (const ManifestSlice& s : m.slices) {
    if (s.layer_count != 1) {
      return Status::error(manifest_path + ": slice " + s.file + " spans " + std::to_string(s.layer_count) +
                           " layers; the market trades one-layer slices (cut with essaim slice --plan N)");
    }
    const fs::path file = fs::path(opt.slices_dir) / s.file;
    const uintmax_t size = fs::file_size(file, ec);
    if (ec) return Status::error("slice " + file.string() + " is missing: " + ec.message());
    if (size != s.bytes) {
      return Status::error("slice " + file.string() + " has " + std::to_string(size) + " bytes, the manifest says " +
                           std::to_string(s.bytes) + ": re-cut the slices (or restore the file)");
    }
    cat.slices.push_back({s.file, s.layer_first, s.expert_first, s.expert_count, int64_t(s.bytes), digest_hex(s.sha256)});
  }
  std::sort(cat.slices.begin(), cat.slices.end(), [](const CatalogueSlice& a, const CatalogueSlice& b) {
    return std::make_pair(a.layer, a.expert_first) < std::make_pair(b.layer, b.expert_first);
  });
  for (size_t i = 1; i < cat.slices.size(); ++i) {
    const CatalogueSlice &a = cat.slices[i - 1], &b = cat.slices[i];
    if (a.layer == b.layer && a.expert_first + a.expert_count > b.expert_first) {
      return Status::error(manifest_path + ": slices " + a.name + " and " + b.name + " overlap");
    }
  }
  if (cat.slices.empty()) return Status::error(manifest_path + " lists no slices");
  return cat;
}

}  // namespace essaim::coord
