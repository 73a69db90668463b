#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/common_flags.h"

int main(int argc, char** argv) {
  CLI::App app{"essaim: serve Mixture-of-Experts models sharded at the grain of one expert", "essaim"};
  app.require_subcommand(1);
  int exit_code = 0;
  essaim::cli::add_version_flag(app);
  essaim::cli::register_version(app, exit_code);
  essaim::cli::register_inspect(app, exit_code);
  essaim::cli::register_synth(app, exit_code);
  essaim::cli::register_slice(app, exit_code);
  essaim::cli::register_tokenize(app, exit_code);
  essaim::cli::register_run(app, exit_code);
  essaim::cli::register_eval(app, exit_code);
  essaim::cli::register_perplexity(app, exit_code);
  essaim::cli::register_worker(app, exit_code);
  essaim::cli::register_relay(app, exit_code);
  essaim::cli::register_npy_diff(app, exit_code);
  essaim::cli::register_serve(app, exit_code);
  essaim::cli::register_bench(app, exit_code);
#ifdef ESSAIM_HAVE_COORD
  essaim::cli::register_coordinator(app, exit_code);
#endif
  return essaim::cli::parse_and_run(app, argc, argv, exit_code);
}
