// The flags every essaim subcommand spells the same way, defined once, with the spellings a llama.cpp user
// already types (docs/cli.md has the table), and the exit-code convention of every subcommand:
//   0 success, 1 the work failed (a file, the network, the model), 2 a usage error (the command line).
//
//   CLI::App* cmd = app.add_subcommand("run", "...");
//   add_threads_flag(*cmd, args->threads);          // -t, --threads
//   add_ctx_flag(*cmd, args->n_ctx);                // -c, --ctx-size, --ctx
//   add_json_flag(*cmd, args->json);                // --json: one JSON summary on stdout
//   ...
//   return parse_and_run(app, argc, argv, exit_code);   // main(): CLI11 errors -> 2, help -> 0
//
// Callbacks report a usage error they find (two options that do not go together, a malformed range) with
// `throw UsageError("...")`; parse_and_run prints it like CLI11's own and exits 2.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace essaim::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

struct UsageError : CLI::ValidationError {
  explicit UsageError(const std::string& message) : CLI::ValidationError(message) {}
};

// Number checks with a message a person reads ("must be a number >= 0"), instead of CLI11's
// NonNegativeNumber / PositiveNumber, whose message prints the whole range up to DBL_MAX in 300 digits.
extern const CLI::Validator kNonNegative;
extern const CLI::Validator kPositive;

// The first argument when it names no subcommand (and is not a flag): the message that says so and lists the
// subcommands, e.g. "unknown subcommand 'foo' (the subcommands: version, inspect, ...)"; empty otherwise.
std::string unknown_subcommand_message(const CLI::App& app, const std::vector<std::string>& args);

// -t, --threads N (0 = every core).
CLI::Option* add_threads_flag(CLI::App& cmd, int32_t& threads, const std::string& help = "Threads (default: all cores)");
CLI::Option* add_threads_flag(CLI::App& cmd, size_t& threads, const std::string& help = "Threads (0 = every core)");
// -c, --ctx-size, --ctx N.
CLI::Option* add_ctx_flag(CLI::App& cmd, int32_t& n_ctx, const std::string& help);
// --max-connections N, --max-per-address N: every listener's admission limits (net::Admission, docs/cli.md
// "Admission flags"): authenticated connections in all, and of one source address.
void add_admission_flags(CLI::App& cmd, int32_t& max_connections, size_t& max_per_address);
// -b, --batch-size, --batch N.
CLI::Option* add_batch_flag(CLI::App& cmd, int32_t& batch, const std::string& help);
// -np, --parallel N (sequences decoded at once; `essaim serve`, `essaim bench`). "-np" is rewritten to
// "--parallel" by parse_and_run (CLI11 takes one-letter short names only).
CLI::Option* add_parallel_flag(CLI::App& cmd, int32_t& n_parallel, const std::string& help);
// --host H and --port P (a server's or worker's address).
void add_host_port_flags(CLI::App& cmd, std::string& host, int32_t& port, const std::string& what);
// --no-mmap (llama.cpp's spelling): read the model into private memory instead of mapping it.
CLI::Option* add_no_mmap_flag(CLI::App& cmd, bool& no_mmap);
// --keep-page-cache: no re-read of a model cached in 4 KiB pages (cli/model_load.h).
CLI::Option* add_keep_page_cache_flag(CLI::App& cmd, bool& keep);
// --json: a machine-readable summary on stdout instead of human text (the fields: docs/cli.md).
CLI::Option* add_json_flag(CLI::App& cmd, bool& json);

// "A-B" or "A" (inclusive, decimal) -> (first, count); a UsageError naming --`what` otherwise.
std::pair<uint32_t, uint32_t> parse_inclusive_range(const std::string& text, const char* what);

// The llama.cpp spellings CLI11 cannot declare (multi-letter single-dash names), rewritten to ours:
// "-np" -> "--parallel", and the llama-server ones `essaim serve` accepts with a note ("-ngl" -> "--n-gpu-layers",
// "-fa", "-cb", "-sm", "-mg"). Everything after a bare "--" is left alone.
std::vector<std::string> rewrite_llama_spellings(int argc, char** argv);

// Parses (running the chosen subcommand's callback) and returns the process exit code: `exit_code` as the
// callback set it, 0 for --help, 2 (message on stderr) for any CLI11 error or UsageError.
int parse_and_run(CLI::App& app, int argc, char** argv, const int& exit_code);

}  // namespace essaim::cli
