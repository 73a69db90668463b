#include "cli/common_flags.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string_view>
#include <utility>

namespace essaim::cli {
namespace {

CLI::Validator number_at_least(double min, const std::string& what) {
  return CLI::Validator(
      [min, what](std::string& value) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(value.c_str(), &end);
        if (value.empty() || end == nullptr || *end != '\0' || !(v >= min)) return "'" + value + "' is not " + what;
        return "";
      },
      what);
}

}  // namespace

const CLI::Validator kNonNegative = number_at_least(0, "a number >= 0");
const CLI::Validator kPositive = number_at_least(1, "a number >= 1");

std::string unknown_subcommand_message(const CLI::App& app, const std::vector<std::string>& args) {
  if (args.size() < 2 || args[1].empty() || args[1][0] == '-') return "";
  std::string names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    if (sub->get_name() == args[1]) return "";
    names += (names.empty() ? "" : ", ") + sub->get_name();
  }
  return "unknown subcommand '" + args[1] + "' (the subcommands: " + names + "; essaim --help says what each does)";
}

CLI::Option* add_threads_flag(CLI::App& cmd, int32_t& threads, const std::string& help) {
  return cmd.add_option("-t,--threads", threads, help)->check(kNonNegative);
}

CLI::Option* add_threads_flag(CLI::App& cmd, size_t& threads, const std::string& help) {
  return cmd.add_option("-t,--threads", threads, help)->capture_default_str();
}

CLI::Option* add_no_mmap_flag(CLI::App& cmd, bool& no_mmap) {
  return cmd.add_flag("--no-mmap", no_mmap,
                      "Read the model into private memory instead of mapping it: its size in RAM and one read at "
                      "load; faster weight streams on some machines (docs/engine.md)");
}

CLI::Option* add_keep_page_cache_flag(CLI::App& cmd, bool& keep) {
  return cmd.add_flag("--keep-page-cache", keep,
                      "Map the model as the page cache holds it: do not drop and read again a model cached in 4 KiB "
                      "pages to map it in 2 MiB ones (docs/engine.md)");
}

void add_admission_flags(CLI::App& cmd, int32_t& max_connections, size_t& max_per_address) {
  cmd.add_option("--max-connections", max_connections,
                 "Connections served at once, authenticated (past it 503 / refused; default " +
                     std::to_string(max_connections) + ")")
      ->check(CLI::Range(1, 65536));
  cmd.add_option("--max-per-address", max_per_address,
                 "Of those, from one source address (default " + std::to_string(max_per_address) +
                     "); unauthenticated ones past the per-address cap evict the oldest")
      ->check(CLI::Range(size_t(1), size_t(65536)));
}

CLI::Option* add_ctx_flag(CLI::App& cmd, int32_t& n_ctx, const std::string& help) {
  return cmd.add_option("-c,--ctx-size,--ctx", n_ctx, help)->check(kNonNegative);
}

CLI::Option* add_batch_flag(CLI::App& cmd, int32_t& batch, const std::string& help) {
  return cmd.add_option("-b,--batch-size,--batch", batch, help)->check(kPositive);
}

CLI::Option* add_parallel_flag(CLI::App& cmd, int32_t& n_parallel, const std::string& help) {
  return cmd.add_option("--parallel", n_parallel, help + " (also -np)")->check(kPositive);
}

void add_host_port_flags(CLI::App& cmd, std::string& host, int32_t& port, const std::string& what) {
  cmd.add_option("--host", host, "Address to " + what + " on");
  cmd.add_option("--port", port, "Port to " + what + " on (0 picks a free one)")->check(CLI::Range(0, 65535));
}

CLI::Option* add_json_flag(CLI::App& cmd, bool& json) {
  return cmd.add_flag("--json", json, "Print one JSON summary on stdout (fields: docs/cli.md)");
}

std::pair<uint32_t, uint32_t> parse_inclusive_range(const std::string& text, const char* what) {
  const auto number = [&](const std::string& s) -> std::optional<uint32_t> {
    if (s.empty() || s.size() > 10 || s.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
    const uint64_t v = std::stoull(s);
    return v <= UINT32_MAX ? std::optional<uint32_t>(uint32_t(v)) : std::nullopt;
  };
  const size_t dash = text.find('-');
  const std::optional<uint32_t> a = number(text.substr(0, dash));
  const std::optional<uint32_t> b = dash == std::string::npos ? a : number(text.substr(dash + 1));
  if (!a || !b)
    throw UsageError(std::string("--") + what + " '" + text + "' is not a range like 3-7 or 5 (inclusive)");
  if (*b < *a) throw UsageError(std::string("--") + what + " '" + text + "' ends before it starts");
  return {*a, *b - *a + 1};
}

std::vector<std::string> rewrite_llama_spellings(int argc, char** argv) {
  std::vector<std::string> out;
  bool after_dashes = false;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") after_dashes = true;
    if (!after_dashes && i > 0) {
      static constexpr std::pair<std::string_view, std::string_view> kSpellings[] = {
          {"-np", "--parallel"}, {"-ngl", "--n-gpu-layers"}, {"-fa", "--flash-attn"}, {"-cb", "--cont-batching"},
          {"-sm", "--split-mode"}, {"-mg", "--main-gpu"}, {"-cram", "--cache-ram"}};
      for (const auto& [llama, ours] : kSpellings) {
        if (a == llama) a = std::string(ours);
        else if (a.rfind(std::string(llama) + "=", 0) == 0) a = std::string(ours) + a.substr(llama.size());
      }
    }
    out.push_back(std::move(a));
  }
  return out;
}

int parse_and_run(CLI::App& app, int argc, char** argv, const int& exit_code) {
  std::vector<std::string> args = rewrite_llama_spellings(argc, argv);
  // CLI11 takes the arguments reversed, without the program name.
  std::vector<std::string> reversed(args.rbegin(), args.rend() - (args.empty() ? 0 : 1));
  if (const std::string unknown = unknown_subcommand_message(app, args); !unknown.empty()) {
    std::fprintf(stderr, "essaim: %s\n", unknown.c_str());
    return kExitUsage;
  }
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints help or the error in CLI11's words
    return code == 0 ? kExitOk : kExitUsage;
  }
  return exit_code;
}

}  // namespace essaim::cli
