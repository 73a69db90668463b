// essaim-worker: the expert worker alone, linked from the worker library and nothing above it (no model,
// attention, tokenizer or sampler code: tests/worker/worker_link_test.cpp checks its symbols). Same flags
// as `essaim worker`, plus --version.
#include "cli/commands.h"
#include "cli/common_flags.h"

int main(int argc, char** argv) {
  CLI::App app{"essaim-worker: serve the experts of some slices to backbones over TCP"};
  int exit_code = 0;
  essaim::cli::configure_worker_app(app, exit_code);
  return essaim::cli::parse_and_run(app, argc, argv, exit_code);
}
