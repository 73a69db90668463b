#include "cli/model_load.h"

#include <malloc.h>

#include <algorithm>
#include <climits>
#include <cstdio>

#include "cli/common_flags.h"

#include "core/huge_pages.h"
#include "core/mapped_file.h"
#include "core/progress.h"

namespace essaim::cli {
namespace {

// Touches one byte of every page, chunk by chunk, so the file is in the page cache afterwards.
Status read_into_memory(const std::string& path) {
  ESSAIM_ASSIGN_OR_RETURN(const MappedFile f, MappedFile::open(path));
  constexpr size_t kChunk = size_t(16) << 20;
  constexpr size_t kPage = 4096;
  Progress progress("reading " + path, f.size());
  const std::span<const uint8_t> bytes = f.bytes();
  volatile uint8_t sink = 0;
  for (size_t off = 0; off < bytes.size(); off += kChunk) {
    const size_t n = std::min(kChunk, bytes.size() - off);
    if (off + n < bytes.size()) f.advise_willneed(off + n, std::min(kChunk, bytes.size() - off - n));
    sink = sink ^ touch_pages(bytes.subspan(off, n), kPage);
    progress.advance(n);
  }
  progress.finish();
  return Status::ok();
}

}  // namespace

void add_kv_type_flag(CLI::App& cmd, std::string& kv_type) {
  cmd.add_option("--kv-type", kv_type, "KV cache type: f16 (default, as llama.cpp) or f32")
      ->check(CLI::IsMember({"f16", "f32"}));
}

void add_model_load_flags(CLI::App& cmd, ModelLoadFlags& flags) {
  add_model_source_flags(cmd, flags.source);
  add_kv_type_flag(cmd, flags.kv_type);
  cmd.add_flag("--mlock", flags.mlock, "Read the model into RAM (progress on a terminal) and pin it there");
  add_no_mmap_flag(cmd, flags.no_mmap);
  add_keep_page_cache_flag(cmd, flags.keep_page_cache);
}

Result<std::unique_ptr<Model>> load_model_for_cli(const ModelLoadFlags& flags) {
  return load_model_for_cli(
      flags.source.path(),
      {.mlock = flags.mlock, .no_mmap = flags.no_mmap, .backbone_file = flags.source.is_backbone()},
      flags.keep_page_cache);
}

void keep_freed_memory_for_reuse() {
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, INT_MAX);
}

Result<std::unique_ptr<Model>> load_model_for_cli(const std::string& path, const LoadOptions& options,
                                                  bool keep_page_cache) {
  if (options.mlock && !options.no_mmap) ESSAIM_RETURN_IF_ERROR(read_into_memory(path));
  ESSAIM_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, load_model(path, options));
  if (!options.no_mmap && !keep_page_cache) {
    const std::string note = map_in_huge_pages(m->file().mapping()).describe(path);
    if (!note.empty()) std::fprintf(stderr, "essaim: %s\n", note.c_str());
  }
  if (options.backbone_file) {
    const ModelInfo& info = m->info();
    std::fprintf(stderr,
                 "essaim: backbone file %s: %.1f MiB mapped; the routed experts (%.1f MiB in the full model) are "
                 "served by the swarm\n",
                 path.c_str(), double(m->file().file_size()) / (1 << 20), double(info.expert_bytes) / (1 << 20));
  }
  return m;
}

void add_model_source_flags(CLI::App& cmd, ModelSource& src, const std::string& model_help) {
  CLI::Option* m = cmd.add_option("-m,--model", src.model, model_help);
  CLI::Option* b = cmd.add_option("--backbone-file", src.backbone_file,
                                  "Backbone file (`essaim slice --backbone`) instead of -m: the dense path only, every "
                                  "routed expert from the swarm (needs --worker, --expert-map or --coordinator)");
  m->excludes(b);
}

void check_model_source(const ModelSource& src, const backbone::SwarmSetup& swarm) {
  if (src.model.empty() && src.backbone_file.empty()) throw UsageError("give -m MODEL or --backbone-file FILE");
  if (!src.is_backbone()) return;
  if (!swarm.has_swarm())
    throw UsageError("--backbone-file holds no experts: give the swarm that serves them (--worker, --expert-map or "
                     "--coordinator), or load the full model with -m");
  if (swarm.audit_every != 0)
    throw UsageError("--worker-audit recomputes answers from the experts' bytes, which a backbone file does not hold");
}

void print_backbone_memory(const Model& model, const char* who) {
  const MemoryUse u = memory_use();
  std::fprintf(stderr, "%s: backbone file %.1f MiB mapped, peak resident %.1f MiB, now %.1f MiB\n", who,
               double(model.file().file_size()) / (1 << 20), double(u.peak_rss) / (1 << 20), double(u.rss) / (1 << 20));
}

MemoryUse memory_use() {
  MemoryUse u;
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return u;
  char line[256];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long long kb = 0;
    if (std::sscanf(line, "VmRSS: %llu kB", &kb) == 1) u.rss = kb * 1024;
    if (std::sscanf(line, "VmHWM: %llu kB", &kb) == 1) u.peak_rss = kb * 1024;
  }
  std::fclose(f);
  return u;
}

}  // namespace essaim::cli
