// essaim-worker: the expert worker alone, linked from the worker library and nothing above it (no model,
// attention, tokenizer or sampler code: tests/worker/worker_link_test.cpp checks its symbols). Same flags
// as `essaim worker`.
#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"essaim-worker: serve the experts of some slices to backbones over TCP"};
  int exit_code = 0;
  essaim::cli::configure_worker_app(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return exit_code;
}
