// Dispatch to worker PROCESSES over TCP on loopback (docs/invariants.md invariants 1 and 5): three `essaim-worker`
// processes give the monolithic logits bit for bit for each test model; a worker killed with SIGKILL in
// the middle of a generation changes no token and costs no layer call more than the deadline; and the
// command line (`essaim eval/run --worker`, `essaim npy-diff`) shows the same.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "backbone_test_util.h"

namespace essaim::backbone::testing {
namespace {

class DispatchTcp : public ::testing::TestWithParam<ModelSpec> {};

TEST_P(DispatchTcp, ThreeWorkerProcessesGiveTheMonolithicLogits) {
  const SwarmModel& m = SwarmModel::get(GetParam());
  WorkerSwarm swarm = start_worker_swarm(m, 3);
  ASSERT_TRUE(swarm.ok());
  ThreadPool pool(2);
  Result<std::unique_ptr<RemoteExpertExecutor>> ex =
      RemoteExpertExecutor::create(m.model->expert_store(), m.identity, swarm.map, &pool, patient_options());
  ASSERT_TRUE(ex.is_ok()) << ex.status().message();
  ASSERT_EQ((*ex)->wait_connected(net::deadline_in(30s)), 3u) << (*ex)->stats().to_json();

  const std::vector<int32_t> tokens = m.tokens(16, 17);
  expect_same_bits(eval_logits(m, tokens, **ex), mono_logits(m, tokens), "prefill");
  expect_same_bits(eval_logits(m, tokens, **ex, 1), mono_logits(m, tokens), "one token at a time");
  const DispatchStats s = (*ex)->stats();
  EXPECT_EQ(s.pairs_remote, s.pairs) << s.to_json();
  EXPECT_EQ(s.pairs_fallback, 0u) << s.to_json();
  for (const WorkerReport& w : s.workers) EXPECT_GT(w.pairs_served, 0u) << s.to_json();
}

INSTANTIATE_TEST_SUITE_P(Models, DispatchTcp, ::testing::ValuesIn(exactness_specs()),
                         [](const auto& info) { return spec_name(info.param); });

class DispatchKill : public ::testing::TestWithParam<ModelSpec> {};

// This tests the local fallback itself (one replica per part, the backbone recomputes the killed worker's
// experts from its own copy), so its backbone holds the whole model. Churn with no local copy to hide a hole:
// backbone_swarm_harness_test, cli_test MarketSwarm.Churn*, cli_test BackboneFile.*.
TEST_P(DispatchKill, AWorkerKilledMidGenerationChangesNoToken) {
  const SwarmModel& m = SwarmModel::get(GetParam());
  const std::vector<int32_t> prompt = m.tokens(6, 29);
  constexpr int kTokens = 16;
  ThreadPool pool(2);
  LocalExpertExecutor local(m.model->expert_store(), &pool);
  const std::vector<int32_t> want = greedy(m, prompt, kTokens, local);

  WorkerSwarm swarm = start_worker_swarm(m, 3);
  ASSERT_TRUE(swarm.ok());
  DispatchOptions o = patient_options();
  o.timeout = 1000ms;
  Result<std::unique_ptr<RemoteExpertExecutor>> ex =
      RemoteExpertExecutor::create(m.model->expert_store(), m.identity, swarm.map, &pool, o);
  ASSERT_TRUE(ex.is_ok()) << ex.status().message();
  ASSERT_EQ((*ex)->wait_connected(net::deadline_in(30s)), 3u);

  uint64_t served_before_kill = 0;
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int32_t> got = greedy(m, prompt, kTokens, **ex, [&](int i) {
    if (i == 5) {
      served_before_kill = (*ex)->stats().workers[1].pairs_served;
      swarm.processes[1]->kill_hard();
    }
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(got, want);
  const DispatchStats s = (*ex)->stats();
  EXPECT_GT(served_before_kill, 0u) << s.to_json();
  EXPECT_EQ(s.workers[1].pairs_served, served_before_kill) << "a dead worker served: " << s.to_json();
  EXPECT_FALSE(s.workers[1].connected);
  EXPECT_GT(s.pairs_fallback, 0u) << "the killed worker's experts were never recomputed: " << s.to_json();
  EXPECT_GT(s.workers[0].pairs_served + s.workers[2].pairs_served, 0u);
  // The bound: a layer call waits at most the deadline, plus the local compute (≪ 1 s for a tiny model).
  EXPECT_LT(s.max_call_seconds, 1.0 + 2.0) << s.to_json();
  EXPECT_LT(seconds, double(s.layer_calls) * 3.0);
}

INSTANTIATE_TEST_SUITE_P(Models, DispatchKill,
                         ::testing::Values(ModelSpec{SynthArch::QWEN3MOE, SynthTypeMix::Q4_K_M},
                                           ModelSpec{SynthArch::QWEN35MOE, SynthTypeMix::Q4_K_M}),
                         [](const auto& info) { return spec_name(info.param); });

std::string essaim_binary() { return std::string(ESSAIM_BINARY_DIR) + "/src/cli/essaim"; }

int run_shell(const std::string& cmd) {
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(DispatchCli, EvalAndRunWithWorkersMatchTheMonolithicOnes) {
  const SwarmModel& m = SwarmModel::get({SynthArch::QWEN3MOE, SynthTypeMix::Q4_K_M});
  WorkerSwarm swarm = start_worker_swarm(m, 3);
  std::string workers;
  for (const auto& p : swarm.processes) workers += " --worker " + p->address();
  const std::string bin = essaim_binary(), d = m.dir + "/cli";
  std::filesystem::create_directories(d);
  const std::string tokens = " --tokens 5,17,99,3,42,7,250,11,64 --threads 1";
  ASSERT_EQ(run_shell(bin + " eval -m " + m.path + tokens + " --logits-out " + d + "/mono.npy 2>/dev/null"), 0);
  ASSERT_EQ(run_shell(bin + " eval -m " + m.path + tokens + workers + " --logits-out " + d + "/swarm.npy 2>" + d +
                      "/eval.err"),
            0)
      << read_file(d + "/eval.err");
  EXPECT_NE(read_file(d + "/eval.err").find("3 of 3 workers connected"), std::string::npos) << read_file(d + "/eval.err");
  EXPECT_EQ(run_shell(bin + " npy-diff " + d + "/mono.npy " + d + "/swarm.npy > " + d + "/diff.txt"), 0);
  EXPECT_NE(read_file(d + "/diff.txt").find("max |Δ| = 0 "), std::string::npos) << read_file(d + "/diff.txt");

  // npy-diff is not a check that cannot fail: another sequence's logits differ.
  ASSERT_EQ(run_shell(bin + " eval -m " + m.path + " --tokens 5,17,99,3,42,7,250,12,64 --threads 1 --logits-out " + d +
                      "/other.npy 2>/dev/null"),
            0);
  EXPECT_EQ(run_shell(bin + " npy-diff " + d + "/mono.npy " + d + "/other.npy > /dev/null"), 1);

  const std::string run = " run -m " + m.path + " -p 'Once upon a time' --threads 1 -n 24 --temp 0";
  ASSERT_EQ(run_shell(bin + run + " > " + d + "/mono.txt 2>/dev/null"), 0);
  ASSERT_EQ(run_shell(bin + run + workers + " > " + d + "/swarm.txt 2>" + d + "/run.err"), 0) << read_file(d + "/run.err");
  EXPECT_EQ(read_file(d + "/swarm.txt"), read_file(d + "/mono.txt"));
  const std::string err = read_file(d + "/run.err");
  EXPECT_NE(err.find("dispatch:"), std::string::npos) << err;
  EXPECT_NE(err.find("pairs served"), std::string::npos) << err;
}

TEST(DispatchCli, ExpertOutputBf16WithWorkersMatchesTheMonolithicBf16Run) {
  const SwarmModel& m = SwarmModel::get({SynthArch::QWEN3MOE, SynthTypeMix::Q4_K_M});
  WorkerSwarm swarm = start_worker_swarm(m, 2);
  std::string workers;
  for (const auto& p : swarm.processes) workers += " --worker " + p->address();
  const std::string bin = essaim_binary(), d = m.dir + "/cli-bf16";
  std::filesystem::create_directories(d);
  const std::string eval = bin + " eval -m " + m.path + " --tokens 5,17,99,3,42,7,250,11,64 --threads 1";
  ASSERT_EQ(run_shell(eval + " --logits-out " + d + "/f32.npy 2>/dev/null"), 0);
  ASSERT_EQ(run_shell(eval + " --expert-output bf16 --logits-out " + d + "/mono.npy 2>/dev/null"), 0);
  ASSERT_EQ(run_shell(eval + workers + " --expert-output bf16 --logits-out " + d + "/swarm.npy 2>" + d + "/eval.err"), 0)
      << read_file(d + "/eval.err");
  EXPECT_EQ(run_shell(bin + " npy-diff " + d + "/mono.npy " + d + "/swarm.npy > " + d + "/diff.txt"), 0)
      << read_file(d + "/diff.txt");
  // bf16 mode is another output than f32: the flag does something.
  EXPECT_EQ(run_shell(bin + " npy-diff " + d + "/f32.npy " + d + "/mono.npy > /dev/null"), 1);
  EXPECT_EQ(run_shell(eval + " --expert-output f16 --logits-out " + d + "/x.npy 2>/dev/null"), 2);  // usage error
}

}  // namespace
}  // namespace essaim::backbone::testing
