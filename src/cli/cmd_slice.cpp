// `essaim slice`: cut a full MoE GGUF into expert slices, a backbone file and a manifest (docs/slicing.md).
//
//   essaim slice -m model.gguf --layers 3-4 --experts 32-63 -o l3-4.e32-63.gguf    # one slice
//   essaim slice -m model.gguf --backbone -o backbone.gguf                         # everything but experts
//   essaim slice -m model.gguf --plan 32                                           # print the plan only
//   essaim slice -m model.gguf --plan 32 --backbone -o out/                        # write it + manifest.json
//   essaim slice --verify out/manifest.json                                        # sizes and SHA-256
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_slice.h"
#include "gguf/slice_manifest.h"

namespace essaim::cli {
namespace {

struct Args {
  std::string model;
  std::string layers;
  std::string experts;
  bool backbone = false;
  uint32_t plan = 0;
  std::string out;
  std::string stem;
  std::string verify;
  std::string dir;
};

// "A-B" or "A" (inclusive, decimal) -> (first, count).
Result<std::pair<uint32_t, uint32_t>> parse_range(const std::string& text, const char* what) {
  const auto number = [&](const std::string& s) -> std::optional<uint32_t> {
    if (s.empty() || s.size() > 10 || s.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
    const uint64_t v = std::stoull(s);
    return v <= UINT32_MAX ? std::optional<uint32_t>(uint32_t(v)) : std::nullopt;
  };
  const size_t dash = text.find('-');
  const std::optional<uint32_t> a = number(text.substr(0, dash));
  const std::optional<uint32_t> b = dash == std::string::npos ? a : number(text.substr(dash + 1));
  if (!a || !b)
    return Status::error(std::string("--") + what + " '" + text + "' is not a range like 3-7 or 5 (inclusive)");
  if (*b < *a) return Status::error(std::string("--") + what + " '" + text + "' ends before it starts");
  return std::pair<uint32_t, uint32_t>{*a, *b - *a + 1};
}

std::string range_text(uint32_t first, uint32_t count) {
  return count == 1 ? std::to_string(first) : std::to_string(first) + "-" + std::to_string(first + count - 1);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Status run_verify(const Args& a) {
  ESSAIM_ASSIGN_OR_RETURN(SliceManifest m, SliceManifest::load(a.verify));
  const std::string dir = !a.dir.empty() ? a.dir : std::filesystem::path(a.verify).parent_path().string();
  ESSAIM_RETURN_IF_ERROR(verify_manifest(m, dir.empty() ? "." : dir));
  std::printf("ok: %zu files match %s (model %s)\n", m.slices.size() + (m.backbone ? 1 : 0), a.verify.c_str(),
              digest_hex(m.source_model).c_str());
  return Status::ok();
}

Status run_one(const Args& a, const GgufFile& src, const MoeLayout& moe) {
  OutFile f;
  if (a.backbone) {
    f = backbone_file(src, moe);
  } else {
    ESSAIM_ASSIGN_OR_RETURN(const auto layers, parse_range(a.layers, "layers"));
    ESSAIM_ASSIGN_OR_RETURN(const auto experts, parse_range(a.experts, "experts"));
    ESSAIM_ASSIGN_OR_RETURN(f, expert_slice_file(src, moe, {layers.first, layers.second, experts.first, experts.second}));
  }
  const auto t0 = std::chrono::steady_clock::now();
  ESSAIM_ASSIGN_OR_RETURN(const WrittenFile w, write_out_file(f, a.out));
  std::printf("wrote %s: %" PRIu64 " bytes in %.2f s, sha256 %s\n", w.path.c_str(), w.bytes, seconds_since(t0),
              digest_hex(w.sha256).c_str());
  return Status::ok();
}

Status run_plan(const Args& a, const GgufFile& src, const MoeLayout& moe) {
  ESSAIM_ASSIGN_OR_RETURN(const SliceManifest plan,
                          plan_manifest(src, moe, {.experts_per_slice = a.plan, .with_backbone = a.backbone,
                                                   .stem = a.stem}));
  uint64_t total = plan.backbone ? plan.backbone->bytes : 0;
  for (const ManifestSlice& s : plan.slices) total += s.bytes;
  const size_t n_files = plan.slices.size() + (plan.backbone ? 1 : 0);
  if (a.out.empty()) {
    std::printf("plan for %s (%s, model %s): %zu MoE layers x %u experts, %u per slice\n", src.path().c_str(),
                moe.architecture.c_str(), digest_hex(moe.source_model).c_str(), moe.layers.size(), moe.expert_count,
                a.plan);
    std::printf("  %-40s %-7s %-9s %s\n", "file", "layers", "experts", "bytes");
    if (plan.backbone)
      std::printf("  %-40s %-7s %-9s %" PRIu64 "\n", plan.backbone->file.c_str(), "-", "-", plan.backbone->bytes);
    for (const ManifestSlice& s : plan.slices)
      std::printf("  %-40s %-7s %-9s %" PRIu64 "\n", s.file.c_str(), range_text(s.layer_first, s.layer_count).c_str(),
                  range_text(s.expert_first, s.expert_count).c_str(), s.bytes);
    std::printf("  %-40s\n%zu files, %" PRIu64 " bytes, plus manifest.json; nothing written (add -o DIR)\n",
                "manifest.json", n_files, total);
    return Status::ok();
  }
  const auto t0 = std::chrono::steady_clock::now();
  ESSAIM_RETURN_IF_ERROR(write_plan(src, moe, plan, a.out).status());
  const double s = seconds_since(t0);
  std::printf("wrote %zu files (%" PRIu64 " bytes) and manifest.json into %s in %.2f s (%.0f MB/s)\n", n_files, total,
              a.out.c_str(), s, s > 0 ? double(total) / s / 1e6 : 0.0);
  return Status::ok();
}

Status run(const Args& a) {
  if (!a.verify.empty()) {
    if (!a.model.empty() || a.plan != 0 || a.backbone || !a.layers.empty() || !a.experts.empty())
      return Status::error("--verify takes only a manifest (and --dir)");
    return run_verify(a);
  }
  if (a.model.empty()) return Status::error("-m FILE is required (or --verify MANIFEST)");
  const bool one_slice = !a.layers.empty() || !a.experts.empty();
  if (one_slice && (a.layers.empty() || a.experts.empty()))
    return Status::error("a slice needs both --layers A-B and --experts X-Y");
  if (one_slice && (a.backbone || a.plan != 0))
    return Status::error("choose one of: --layers/--experts (one slice), --backbone, --plan N");
  if (!one_slice && !a.backbone && a.plan == 0)
    return Status::error("nothing to do: give --layers A-B --experts X-Y, --backbone, or --plan N");
  if (a.plan == 0 && a.out.empty()) return Status::error("-o OUT is required");

  ESSAIM_ASSIGN_OR_RETURN(const GgufFile src, GgufFile::open(a.model));
  ESSAIM_ASSIGN_OR_RETURN(const MoeLayout moe, moe_layout(src));
  return a.plan != 0 ? run_plan(a, src, moe) : run_one(a, src, moe);
}

}  // namespace

void register_slice(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "slice", "Cut a MoE GGUF into expert slices (byte-identical expert ranges), a backbone file and a manifest");
  cmd->add_option("-m,--model", args->model, "Full model GGUF to cut");
  cmd->add_option("--layers", args->layers, "Layer range of one slice, inclusive: A-B or A");
  cmd->add_option("--experts", args->experts, "Expert range of one slice, inclusive: X-Y or X");
  cmd->add_flag("--backbone", args->backbone, "Write the backbone file (every tensor but the routed experts)");
  cmd->add_option("--plan", args->plan, "Cut every MoE layer into N-expert slices (prints the plan without -o)")
      ->check(CLI::Range(1u, UINT32_MAX));
  cmd->add_option("-o,--out", args->out, "Output file (one slice, --backbone) or directory (--plan)");
  cmd->add_option("--stem", args->stem, "File name prefix for --plan (default: the architecture)");
  cmd->add_option("--verify", args->verify, "Check every file a manifest lists: size and SHA-256");
  cmd->add_option("--dir", args->dir, "Directory of the files for --verify (default: the manifest's)");
  cmd->callback([args, &exit_code] {
    const Status s = run(*args);
    if (!s) {
      std::fprintf(stderr, "essaim slice: %s\n", s.message().c_str());
      exit_code = 1;
      return;
    }
    exit_code = 0;
  });
}

}  // namespace essaim::cli
