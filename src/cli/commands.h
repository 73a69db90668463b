// The essaim subcommands. Each lives in its own cmd_<name>.cpp and registers itself on the CLI11 app;
// the callback it installs returns the process exit code through `exit_code` (0 ok, 1 failure; usage errors
// throw UsageError, which cli/common_flags.h's parse_and_run turns into exit code 2).
//
//   essaim synth --arch qwen3moe --preset tiny --types q4_k_m -o tiny.gguf
//   essaim inspect tiny.gguf --json
#pragma once

#include <CLI/CLI.hpp>

namespace essaim::cli {

// Add one line here and one file to CMakeLists.txt per subcommand.
void register_inspect(CLI::App& app, int& exit_code);
void register_synth(CLI::App& app, int& exit_code);
void register_slice(CLI::App& app, int& exit_code);
void register_tokenize(CLI::App& app, int& exit_code);
void register_run(CLI::App& app, int& exit_code);
void register_eval(CLI::App& app, int& exit_code);
void register_perplexity(CLI::App& app, int& exit_code);
void register_worker(CLI::App& app, int& exit_code);
void register_relay(CLI::App& app, int& exit_code);
void register_npy_diff(CLI::App& app, int& exit_code);
void register_version(CLI::App& app, int& exit_code);
// `essaim --version` on the top-level app.
void add_version_flag(CLI::App& app);
void register_serve(CLI::App& app, int& exit_code);
void register_bench(CLI::App& app, int& exit_code);
void register_coordinator(CLI::App& app, int& exit_code);
// The stand-alone essaim-worker binary: the worker's options on the top-level app (same flags).
void configure_worker_app(CLI::App& app, int& exit_code);

}  // namespace essaim::cli
