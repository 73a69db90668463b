// `essaim run --draft-max K` as a user runs it (docs/speculative.md): the trained model's backbone file over
// 3 worker processes (every expert from the workers, the MTP block's included) prints the same tokens as
// plain decoding of the full file on one node, greedy and seeded, in fewer layer calls (round trips) per
// token, and says so on stderr; a model without an MTP block refuses the flag with a message.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"

namespace essaim::cli_test {
namespace {

const std::string kModel = std::string(ESSAIM_SOURCE_DIR) + "/models/kjv-moe-q4_k_m.gguf";
const std::string kRun = " -p 'And the LORD spake unto Moses, saying,' -n 48 --json";

nlohmann::json run_json(const std::string& command) {
  const CliRun r = run_cli(command);
  EXPECT_EQ(r.code, 0) << command << "\n" << r.err;
  return r.code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json::object();
}

TEST(SpeculativeRun, TrainedModelOverThreeWorkersPrintsThePlainTokensInFewerRoundTrips) {
  const std::string dir = make_temp_dir("spec_run");
  const CliRun cut = run_cli("essaim slice -m " + kModel + " --plan 11 --backbone --stem m -o " + dir, "", 600);
  ASSERT_EQ(cut.code, 0) << cut.err;
  std::vector<std::unique_ptr<BackgroundProcess>> workers;
  std::string flags;
  for (const char* r : {"0-10", "11-21", "22-31"}) {
    workers.push_back(std::make_unique<BackgroundProcess>("essaim-worker --slices " + dir + " --experts " + r +
                                                          " --port 0 -q"));
    ASSERT_NE(workers.back()->port(), 0) << workers.back()->stderr_text();
    flags += " --worker 127.0.0.1:" + std::to_string(workers.back()->port());
  }
  const std::string swarm = "essaim run --backbone-file " + dir + "/m.backbone.gguf --require-workers" + flags;
  for (const std::string sampling : {" --temp 0", " --temp 0.8 -s 42"}) {
    const nlohmann::json mono = run_json("essaim run -m " + kModel + kRun + sampling);
    const nlohmann::json plain = run_json(swarm + kRun + sampling);
    const CliRun spec_run = run_cli(swarm + kRun + sampling + " --draft-max 3");
    ASSERT_EQ(spec_run.code, 0) << spec_run.err;
    const nlohmann::json spec = nlohmann::json::parse(spec_run.out);
    EXPECT_EQ(spec.at("tokens"), mono.at("tokens")) << sampling;
    EXPECT_EQ(spec.at("text"), mono.at("text")) << sampling;
    EXPECT_EQ(plain.at("tokens"), mono.at("tokens")) << sampling;
    const auto calls = [](const nlohmann::json& j) { return j.at("dispatch").at("layer_calls").get<uint64_t>(); };
    EXPECT_EQ(calls(plain), 8 * plain.at("generated_tokens").get<uint64_t>());  // the prompt, then n - 1 forwards
    EXPECT_LT(calls(spec), calls(plain)) << sampling;
    EXPECT_EQ(spec.at("speculative").at("draft_max").get<int>(), 3);
    EXPECT_GT(spec.at("speculative").at("accepted").get<int>(), 0) << sampling;
    EXPECT_NE(spec_run.err.find("per generated token"), std::string::npos) << spec_run.err;
    EXPECT_NE(spec_run.err.find("speculative (mtp, K 3)"), std::string::npos) << spec_run.err;
  }
}

TEST(SpeculativeRun, AModelWithoutAnMtpBlockRefusesDraftMax) {
  const std::string dir = make_temp_dir("spec_no_mtp");
  ASSERT_EQ(run_cli("essaim synth --arch qwen3moe --preset tiny --types f32 -o " + dir + "/m.gguf").code, 0);
  const CliRun r = run_cli("essaim run -m " + dir + "/m.gguf -p hi -n 4 --draft-max 2");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--draft-max needs a model with an MTP (nextn) block"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace essaim::cli_test
