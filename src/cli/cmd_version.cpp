// `essaim version [--json]` and `essaim --version`: this build's version, commit, build type and the
// handshake fingerprint (kernel ABI, run-time ISA, protocol), to compare two machines before pairing them.
//
//   essaim --version
//   essaim version --json | jq .kernel_abi
#include <cstdio>
#include <memory>

#include "cli/build_info.h"
#include "cli/commands.h"
#include "cli/common_flags.h"

namespace essaim::cli {

void add_version_flag(CLI::App& app) {
  app.set_version_flag("--version", [] { return build_info_version_flag_text(); });
}

void register_version(CLI::App& app, int& exit_code) {
  auto json = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("version", "Print the version, commit, build type and handshake fingerprint");
  add_json_flag(*cmd, *json);
  cmd->callback([json, &exit_code] {
    const BuildInfo b = build_info();
    const std::string out = *json ? build_info_json(b).dump() + "\n" : build_info_text(b);
    std::fputs(out.c_str(), stdout);
    exit_code = std::fflush(stdout) == 0 ? kExitOk : kExitFailure;
  });
}

}  // namespace essaim::cli
