#include <cstdio>

#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"essaim: serve Mixture-of-Experts models sharded at the grain of one expert"};
  app.require_subcommand(1);
  int exit_code = 0;
  essaim::cli::register_inspect(app, exit_code);
  essaim::cli::register_synth(app, exit_code);
  essaim::cli::register_slice(app, exit_code);
  essaim::cli::register_tokenize(app, exit_code);
  essaim::cli::register_run(app, exit_code);
  essaim::cli::register_eval(app, exit_code);
  essaim::cli::register_worker(app, exit_code);
  essaim::cli::register_npy_diff(app, exit_code);
  essaim::cli::register_bench(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return exit_code;
}
