// `essaim slice`: cut a full MoE GGUF into expert slices, a backbone file and a manifest (docs/slicing.md).
//
//   essaim slice -m model.gguf --layers 3-4 --experts 32-63 -o l3-4.e32-63.gguf    # one slice
//   essaim slice -m model.gguf --backbone -o backbone.gguf                         # everything but experts
//   essaim slice -m model.gguf --plan 32                                           # print the plan only
//   essaim slice -m model.gguf --plan 32 --backbone -o out/                        # write it + manifest.json
//   essaim slice --verify out/manifest.json                                        # sizes and SHA-256
//   essaim slice -m model.gguf --plan 32 -o out/ --json        # one JSON summary (files + SHA-256) on stdout
//
// Writing shows progress on stderr when it is a terminal. Inconsistent options are usage errors (exit 2);
// a failure while reading or writing, or a range beyond the model, exits 1.
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/file_digest.h"
#include "core/progress.h"
#include "gguf/gguf_file.h"
#include "slice/gguf_slice.h"
#include "slice/slice_manifest.h"

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
  bool json = false;
};

void print_json(nlohmann::json j) {
  std::fputs((j.dump() + "\n").c_str(), stdout);
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
  uint64_t total = m.backbone ? m.backbone->bytes : 0;
  for (const ManifestSlice& s : m.slices) total += s.bytes;
  Progress progress("verify " + a.verify, total);
  ESSAIM_RETURN_IF_ERROR(verify_manifest(m, dir.empty() ? "." : dir, &progress));
  progress.finish();
  if (a.json) {
    nlohmann::json files = nlohmann::json::array();
    if (m.backbone) files.push_back(file_json(m.backbone->file, m.backbone->bytes, m.backbone->sha256));
    for (const ManifestSlice& s : m.slices) files.push_back(file_json(s.file, s.bytes, s.sha256));
    print_json({{"command", "slice"}, {"mode", "verify"}, {"manifest", a.verify}, {"ok", true},
                {"model", digest_hex(m.source_model)}, {"files", files}});
    return Status::ok();
  }
  std::printf("ok: %zu files match %s (model %s)\n", m.slices.size() + (m.backbone ? 1 : 0), a.verify.c_str(),
              digest_hex(m.source_model).c_str());
  return Status::ok();
}

Status run_one(const Args& a, const GgufFile& src, const MoeLayout& moe) {
  OutFile f;
  if (a.backbone) {
    f = backbone_file(src, moe);
  } else {
    const auto layers = parse_inclusive_range(a.layers, "layers");
    const auto experts = parse_inclusive_range(a.experts, "experts");
    ESSAIM_ASSIGN_OR_RETURN(f, expert_slice_file(src, moe, {layers.first, layers.second, experts.first, experts.second}));
  }
  const auto t0 = std::chrono::steady_clock::now();
  Progress progress("slice " + a.out, f.size());
  ESSAIM_ASSIGN_OR_RETURN(const WrittenFile w, write_out_file(f, a.out, /*hash=*/true, &progress));
  progress.finish();
  if (a.json) {
    const double secs = seconds_since(t0);
    print_json({{"command", "slice"}, {"mode", a.backbone ? "backbone" : "slice"}, {"model", digest_hex(moe.source_model)},
                {"seconds", secs}, {"bytes", w.bytes}, {"files", nlohmann::json::array({file_json(w.path, w.bytes, w.sha256)})}});
    return Status::ok();
  }
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
    if (a.json) {
      nlohmann::json files = nlohmann::json::array();
      if (plan.backbone) files.push_back({{"path", plan.backbone->file}, {"bytes", plan.backbone->bytes}});
      for (const ManifestSlice& s : plan.slices)
        files.push_back({{"path", s.file}, {"bytes", s.bytes}, {"layer_first", s.layer_first},
                         {"layer_count", s.layer_count}, {"expert_first", s.expert_first},
                         {"expert_count", s.expert_count}});
      print_json({{"command", "slice"}, {"mode", "plan"}, {"model", digest_hex(moe.source_model)}, {"written", false},
                  {"bytes", total}, {"files", files}});
      return Status::ok();
    }
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
  Progress progress("slice " + a.out, total);
  ESSAIM_ASSIGN_OR_RETURN(const SliceManifest done, write_plan(src, moe, plan, a.out, &progress));
  progress.finish();
  const double s = seconds_since(t0);
  if (a.json) {
    const std::filesystem::path dir(a.out);
    nlohmann::json files = nlohmann::json::array();
    if (done.backbone)
      files.push_back(file_json((dir / done.backbone->file).string(), done.backbone->bytes, done.backbone->sha256));
    for (const ManifestSlice& m : done.slices) files.push_back(file_json((dir / m.file).string(), m.bytes, m.sha256));
    ESSAIM_ASSIGN_OR_RETURN(nlohmann::json manifest, file_summary_json((dir / "manifest.json").string()));
    files.push_back(manifest);
    print_json({{"command", "slice"}, {"mode", "plan"}, {"model", digest_hex(moe.source_model)}, {"written", true},
                {"seconds", s}, {"bytes", total}, {"files", files}});
    return Status::ok();
  }
  std::printf("wrote %zu files (%" PRIu64 " bytes) and manifest.json into %s in %.2f s (%.0f MB/s)\n", n_files, total,
              a.out.c_str(), s, s > 0 ? double(total) / s / 1e6 : 0.0);
  return Status::ok();
}

Status run(const Args& a) {
  if (!a.verify.empty()) {
    if (!a.model.empty() || a.plan != 0 || a.backbone || !a.layers.empty() || !a.experts.empty())
      throw UsageError("--verify takes only a manifest (and --dir)");
    return run_verify(a);
  }
  if (a.model.empty()) throw UsageError("-m FILE is required (or --verify MANIFEST)");
  const bool one_slice = !a.layers.empty() || !a.experts.empty();
  if (one_slice && (a.layers.empty() || a.experts.empty()))
    throw UsageError("a slice needs both --layers A-B and --experts X-Y");
  if (one_slice && (a.backbone || a.plan != 0))
    throw UsageError("choose one of: --layers/--experts (one slice), --backbone, --plan N");
  if (!one_slice && !a.backbone && a.plan == 0)
    throw UsageError("nothing to do: give --layers A-B --experts X-Y, --backbone, or --plan N");
  if (a.plan == 0 && a.out.empty()) throw UsageError("-o OUT is required");
  if (one_slice) {  // malformed ranges are usage errors, found before any file is read
    (void)parse_inclusive_range(a.layers, "layers");
    (void)parse_inclusive_range(a.experts, "experts");
  }

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
  add_json_flag(*cmd, args->json);
  cmd->callback([args, &exit_code] {
    const Status s = run(*args);
    if (!s) {
      std::fprintf(stderr, "essaim slice: %s\n", s.message().c_str());
      exit_code = kExitFailure;
      return;
    }
    exit_code = kExitOk;
  });
}

}  // namespace essaim::cli
