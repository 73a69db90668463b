#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

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
  essaim::cli::register_serve(app, exit_code);
  // llama.cpp spells --parallel "-np", a multi-letter single-dash flag CLI11 cannot declare: accept it by
  // rewriting it before parsing.
  std::vector<std::string> args(argv + 1, argv + argc);
  for (std::string& a : args)
    if (a == "-np") a = "--parallel";
  std::reverse(args.begin(), args.end());  // CLI11 takes a reversed vector
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return exit_code;
}
