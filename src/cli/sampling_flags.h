// The sampling flags of every generating subcommand (`run`, `serve`, `bench`), spelled as llama.cpp does:
//
//   add_sampling_flags(*cmd, args->sampling);   // --temp --top-k --top-p --min-p --repeat-penalty
//                                               // --repeat-last-n -s/--seed
#pragma once

#include <CLI/CLI.hpp>

#include "text/sampler.h"

namespace essaim::cli {

inline void add_sampling_flags(CLI::App& cmd, SamplerParams& s) {
  cmd.add_option("--temp", s.temperature, "Temperature (default 0.8; 0 = greedy)");
  cmd.add_option("--top-k", s.top_k, "Top-k (default 40; 0 = off)");
  cmd.add_option("--top-p", s.top_p, "Top-p (default 0.95; 1 = off)");
  cmd.add_option("--min-p", s.min_p, "Min-p (default 0.05; 0 = off)");
  cmd.add_option("--repeat-penalty", s.repeat_penalty, "Repetition penalty (default 1 = off)");
  cmd.add_option("--repeat-last-n", s.repeat_last_n, "Penalty window (default 64; 0 = off, -1 = whole history)");
  cmd.add_option("-s,--seed", s.seed, "Sampling seed (default: random)");
}

}  // namespace essaim::cli
