// The synthetic model the CLI tests run on, written once per test binary by `essaim synth` itself:
// qwen3moe tiny q4_k_m (2 MoE layers x 6 experts, a few MB).
#pragma once

#include <string>

namespace essaim::cli_test {

const std::string& tiny_model();         // absolute path; an ADD_FAILURE and "" when synth failed
const std::string& tiny_slices_dir();    // `essaim slice --plan 3 --backbone -o` of it: L{0,1}.E{0-2,3-5}
// The backbone file in tiny_slices_dir() (every tensor but the routed experts): what tests of coverage and
// churn run their backbone from (`--backbone-file`), so a range no worker serves fails them instead of being
// computed from a local copy (docs/invariants.md, invariant 5).
std::string tiny_backbone();

}  // namespace essaim::cli_test
