// A mixed swarm (docs/invariants.md invariant 1 across instruction sets): this x86 backbone dispatches to ARM64
// `essaim-worker` processes running under qemu-user on loopback TCP, and the logits equal the monolithic
// x86 run bit for bit — with the workers' NEON + dotprod kernels and with plain NEON (ESSAIM_ISA=neon).
//
// Needs the ARM64 build: ESSAIM_ARM64_WORKER names its essaim-worker (scripts/build-arm64.sh writes
// build-arm64/src/cli/essaim-worker) and ESSAIM_ARM64_EMULATOR the emulator (default qemu-aarch64).
// scripts/test.sh sets both; without them the test says it is skipped and why.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "backbone_test_util.h"
#include "skip.h"

namespace essaim::backbone::testing {
namespace {

std::string arm64_worker() {
  const char* p = std::getenv("ESSAIM_ARM64_WORKER");
  return p != nullptr ? p : "";
}

std::vector<std::string> launcher(const std::string& isa) {
  const char* emu = std::getenv("ESSAIM_ARM64_EMULATOR");
  std::vector<std::string> out = {"env"};
  if (!isa.empty()) out.push_back("ESSAIM_ISA=" + isa);
  out.push_back(emu != nullptr && *emu != '\0' ? emu : "qemu-aarch64");
  return out;
}

struct MixedCase {
  ModelSpec spec;
  std::string isa;  // "" = the worker's own choice (neon-dotprod under qemu's default CPU)
};

class MixedIsa : public ::testing::TestWithParam<MixedCase> {};

TEST_P(MixedIsa, Arm64WorkersUnderQemuGiveTheMonolithicX86Logits) {
  const std::string binary = arm64_worker();
  if (binary.empty()) ESSAIM_SKIP_MISSING_DEP(essaim::test_support::Dep::ARM64_WORKER, "ESSAIM_ARM64_WORKER is not set");
  ASSERT_TRUE(std::filesystem::exists(binary)) << binary;
  const SwarmModel& m = SwarmModel::get(GetParam().spec);
  std::vector<std::unique_ptr<WorkerProcess>> workers;
  ExpertMap map;
  for (const std::vector<std::string>& part : m.split_experts(3)) {
    workers.push_back(std::make_unique<WorkerProcess>(part, binary, launcher(GetParam().isa)));
    ASSERT_TRUE(workers.back()->ok());
    map.workers.push_back({.address = workers.back()->address(), .label = {}, .holdings = std::nullopt});
  }
  ThreadPool pool(2);
  DispatchOptions options = patient_options();
  Result<std::unique_ptr<RemoteExpertExecutor>> ex =
      RemoteExpertExecutor::create(m.model->expert_store(), m.identity, map, &pool, options);
  ASSERT_TRUE(ex.is_ok()) << ex.status().message();
  ASSERT_EQ((*ex)->wait_connected(net::deadline_in(60s)), 3u) << (*ex)->stats().to_json();

  const std::vector<int32_t> tokens = m.tokens(12, 23);
  expect_same_bits(eval_logits(m, tokens, **ex), mono_logits(m, tokens), "prefill");
  expect_same_bits(eval_logits(m, tokens, **ex, 1), mono_logits(m, tokens), "one token at a time");
  const DispatchStats s = (*ex)->stats();
  EXPECT_EQ(s.pairs_remote, s.pairs) << "every pair must come from an ARM64 worker: " << s.to_json();
  EXPECT_EQ(s.pairs_fallback, 0u) << s.to_json();
  for (const WorkerReport& w : s.workers) EXPECT_GT(w.pairs_served, 0u) << s.to_json();
}

std::vector<MixedCase> mixed_cases() {
  std::vector<MixedCase> out;
  for (const ModelSpec& spec : exactness_specs()) out.push_back({.spec = spec, .isa = ""});
  out.push_back({.spec = {.arch = SynthArch::QWEN3MOE, .types = SynthTypeMix::Q4_K_M}, .isa = "neon"});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Models, MixedIsa, ::testing::ValuesIn(mixed_cases()), [](const auto& info) {
  return spec_name(info.param.spec) + (info.param.isa.empty() ? "" : "_" + info.param.isa);
});

}  // namespace
}  // namespace essaim::backbone::testing
