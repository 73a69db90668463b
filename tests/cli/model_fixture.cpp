#include "model_fixture.h"

#include <gtest/gtest.h>

#include "cli_test_util.h"

namespace essaim::cli_test {

const std::string& tiny_model() {
  static const std::string path = [] {
    const std::string dir = make_temp_dir("model");
    const std::string p = dir + "/tiny.gguf";
    const CliRun r = run_cli("essaim synth --arch qwen3moe --preset tiny --types q4_k_m --seed 3 -o " + p);
    if (r.code != 0) {
      ADD_FAILURE() << "essaim synth failed: " << r.err;
      return std::string();
    }
    return p;
  }();
  return path;
}

const std::string& tiny_slices_dir() {
  static const std::string path = [] {
    const std::string dir = make_temp_dir("slices");
    const CliRun r = run_cli("essaim slice -m " + tiny_model() + " --plan 3 --backbone -o " + dir);
    if (r.code != 0) {
      ADD_FAILURE() << "essaim slice failed: " << r.err;
      return std::string();
    }
    return dir;
  }();
  return path;
}

std::string tiny_backbone() { return tiny_slices_dir() + "/qwen3moe.backbone.gguf"; }

}  // namespace essaim::cli_test
