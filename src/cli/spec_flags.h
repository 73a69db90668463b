// The speculative-decoding flags of `run` and `serve`, spelled as llama.cpp does (docs/speculative.md):
//
//   add_spec_flags(*cmd, args->spec);   // --spec mtp --draft-max K --draft-min N
//   if (args->spec.enabled()) ...       // K > 0 and the drafter is mtp
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "cli/common_flags.h"
#include "model/speculative.h"

namespace essaim::cli {

struct SpecFlags {
  std::string drafter = "mtp";  // the model's own MTP (nextn) block; "none" turns speculation off
  int32_t draft_max = 0;
  int32_t draft_min = 0;
  std::string draft_experts = "backbone";  // where the MTP block's routed experts are computed

  bool enabled() const { return drafter == "mtp" && draft_max > 0; }
  // Drafts never change the stream, only how many rows are accepted: when this process holds the experts,
  // the MTP block's are computed here and a draft costs no round trip.
  bool drafts_on_backbone(const Model& m) const {
    return enabled() && draft_experts == "backbone" && !m.expert_store().shape_only();
  }
  SpecOptions options(bool adaptive) const {
    return {.draft_max = draft_max, .draft_min = draft_min, .adaptive = adaptive};
  }
};

inline void add_spec_flags(CLI::App& cmd, SpecFlags& f) {
  cmd.add_option("--spec", f.drafter, "Drafter for speculative decoding: mtp (the model's MTP block) or none")
      ->check(CLI::IsMember({"mtp", "none"}))
      ->capture_default_str();
  cmd.add_option("--draft-max", f.draft_max,
                 "Speculative decoding: draft up to K tokens per step with the MTP block, verified in one forward "
                 "(default 0 = off; the output stream is unchanged)")
      ->check(CLI::Range(0, 16));
  cmd.add_option("--draft-min", f.draft_min, "Fewest drafts per step while K adapts (default 0)")
      ->check(CLI::Range(0, 16));
  cmd.add_option("--draft-experts", f.draft_experts,
                 "Where the MTP block's experts are computed: backbone (default, when this process holds them: "
                 "no round trip per draft) or swarm (dispatched like any layer's)")
      ->check(CLI::IsMember({"backbone", "swarm"}))
      ->capture_default_str();
}

}  // namespace essaim::cli
