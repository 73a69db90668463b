// Loading a model for a subcommand. With --mlock every page is read first, with progress on a terminal
// (mlock itself faults the whole file in silently — minutes for a large model), then the model is loaded
// and pinned from the warm page cache.
//
//   ESSAIM_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, load_model_for_cli(args.model, {.mlock = args.mlock}));
//
// `-m FULL.gguf` or `--backbone-file FILE` (exactly one; the second needs a swarm, docs/dispatch.md):
//   ModelSource src;
//   add_model_source_flags(*cmd, src);                       // then, in the callback:
//   check_model_source(src, swarm);                          // throws UsageError
//   load_model_for_cli(src.path(), {.mlock = mlock, .backbone_file = src.is_backbone()});
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "cli/dispatch_flags.h"
#include "core/status.h"
#include "model/model.h"

namespace essaim::cli {

// With backbone_file: the file is an `essaim slice --backbone` output, loaded with its experts bound to the
// swarm; stderr then says how many bytes are mapped (the backbone file's size) against the full model's.
// With no_mmap the file is read into private memory (--no-mmap); --mlock then pins that copy.
// A mapped model (no no_mmap) held by the page cache mostly in 4 KiB pages is read again in 2 MiB pages
// unless keep_page_cache (core/huge_pages.h: map_in_huge_pages); stderr says so, with the time it took.
Result<std::unique_ptr<Model>> load_model_for_cli(const std::string& path, const LoadOptions& options,
                                                  bool keep_page_cache = false);

struct ModelSource {
  std::string model;          // -m
  std::string backbone_file;  // --backbone-file
  const std::string& path() const { return backbone_file.empty() ? model : backbone_file; }
  bool is_backbone() const { return !backbone_file.empty(); }
};
// -m,--model and --backbone-file, excluding each other.
void add_model_source_flags(CLI::App& cmd, ModelSource& src, const std::string& model_help = "GGUF model file");
// Exactly one of the two; --backbone-file needs --worker, --expert-map or --coordinator, and no
// --worker-audit (an audit recomputes answers from the experts' bytes). Throws UsageError.
void check_model_source(const ModelSource& src, const backbone::SwarmSetup& swarm);

inline KvType kv_type_from_flag(const std::string& flag) { return flag == "f32" ? KvType::F32 : KvType::F16; }

// The loading flags run and eval share: the model source, --kv-type, --mlock, --no-mmap, --keep-page-cache.
//   ModelLoadFlags load;
//   add_model_load_flags(*cmd, load);                          // in the callback: check_model_source(load.source, swarm)
//   ESSAIM_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, load_model_for_cli(load));
//   model->new_cache({.kv_type = load.kv()});
struct ModelLoadFlags {
  ModelSource source;
  std::string kv_type = "f16";
  bool mlock = false;
  bool no_mmap = false;
  bool keep_page_cache = false;
  KvType kv() const { return kv_type_from_flag(kv_type); }
};
void add_model_load_flags(CLI::App& cmd, ModelLoadFlags& flags);
// --kv-type f16 (default, as llama.cpp) or f32.
void add_kv_type_flag(CLI::App& cmd, std::string& kv_type);
Result<std::unique_ptr<Model>> load_model_for_cli(const ModelLoadFlags& flags);

// Keeps the memory a forward frees for the next one (glibc: no mmap'd chunks, no trimming of the heap's top):
// a pp512 step frees ~200 MB of scratch, and getting it back from the kernel as fresh zeroed pages cost ~5 %
// of prefill in page faults. The process's resident size stays at its peak. For the commands that compute the
// model here (run, eval, serve, bench); not the worker, whose resident budget is its slice + 32 MB.
void keep_freed_memory_for_reuse();

// The process's resident and peak resident memory (VmRSS, VmHWM from /proc/self/status), bytes; 0 if unknown.
struct MemoryUse {
  uint64_t rss = 0;
  uint64_t peak_rss = 0;
};
MemoryUse memory_use();
// "WHO: backbone file N MiB mapped, peak resident M MiB" on stderr (what a backbone without experts costs).
void print_backbone_memory(const Model& model, const char* who);

}  // namespace essaim::cli
