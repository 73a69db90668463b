// The synthetic model the CLI tests run on, written once per test binary by `essaim synth` itself:
// qwen3moe tiny q4_k_m (2 MoE layers x 6 experts, a few MB).
#pragma once

#include <string>

namespace essaim::cli_test {

const std::string& tiny_model();         // absolute path; an ADD_FAILURE and "" when synth failed
const std::string& tiny_slices_dir();    // `essaim slice --plan 3 -o` of it: L{0,1}.E{0-2,3-5}

}  // namespace essaim::cli_test
