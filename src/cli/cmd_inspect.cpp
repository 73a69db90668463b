// `essaim inspect FILE [--json] [--full-arrays]`: metadata, tensors and per-expert byte slabs of a GGUF file.
//
//   essaim inspect tiny.gguf                  # for people
//   essaim inspect tiny.gguf --json | jq '.metadata["general.architecture"].value'
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_inspect.h"

namespace essaim::cli {

void register_inspect(CLI::App& app, int& exit_code) {
  struct Args {
    std::string path;
    bool json = false;
    bool full_arrays = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("inspect", "Print a GGUF file's metadata, tensors and expert slabs");
  // The file as a positional argument, or as -m/--model like every other subcommand that reads a model.
  CLI::Option* positional = cmd->add_option("FILE", args->path, "GGUF file");
  CLI::Option* model = cmd->add_option("-m,--model", args->path, "GGUF file (instead of FILE)");
  positional->excludes(model);
  cmd->add_flag("--json", args->json, "Machine-readable JSON instead of text");
  cmd->add_flag("--full-arrays", args->full_arrays,
                "Every array element (JSON: no 16-element cap; text: also every expert slab)");
  cmd->callback([args, &exit_code] {
    if (args->path.empty()) throw UsageError("give the GGUF file: essaim inspect FILE (or -m FILE)");
    Result<GgufFile> file = GgufFile::open(args->path);
    if (!file) {
      std::fprintf(stderr, "essaim inspect: %s\n", file.status().message().c_str());
      exit_code = 1;
      return;
    }
    const GgufInspectOptions options{.full_arrays = args->full_arrays};
    const std::string out = args->json ? gguf_inspect_json(*file, options).dump(1) + "\n"
                                       : gguf_inspect_text(*file, options);
    if (std::fwrite(out.data(), 1, out.size(), stdout) != out.size() || std::fflush(stdout) != 0) {
      std::fprintf(stderr, "essaim inspect: cannot write the output\n");
      exit_code = 1;
      return;
    }
    exit_code = 0;
  });
}

}  // namespace essaim::cli
