// Workers behind a relay, as processes (docs/relay.md): `essaim relay`, three `essaim-worker --relay`
// processes and `essaim eval --worker ws://.../node/ID --token T` give the monolithic logits bit for bit;
// killing the relay in the middle of a generation changes no token (the backbone computes locally), and
// the workers register again when a relay returns on the same port. The exactness eval runs from the
// backbone file (no local copy: a worker the relay failed to pair fails it); the relay-dies run uses the
// full model on purpose: it tests the local fallback itself.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "backbone_test_util.h"

namespace essaim::backbone::testing {
namespace {

using namespace std::chrono_literals;

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

struct RelaySwarm {
  std::string dir, token_file;
  std::unique_ptr<ListeningProcess> relay;
  std::vector<std::unique_ptr<ListeningProcess>> workers;
  std::string worker_flags;  // " --worker ws://.../node/w0 ... --token tok-b"
};

std::unique_ptr<ListeningProcess> start_relay(const std::string& token_file, uint16_t port = 0) {
  return std::make_unique<ListeningProcess>(std::vector<std::string>{
      essaim_binary(), "relay", "--listen", "127.0.0.1:" + std::to_string(port), "--tokens", token_file, "--quiet"});
}

RelaySwarm start_relay_swarm(const SwarmModel& m, uint32_t n) {
  RelaySwarm s;
  s.dir = m.dir + "/relay";
  std::filesystem::create_directories(s.dir);
  s.token_file = s.dir + "/tokens.txt";
  {
    std::ofstream t(s.token_file);
    for (uint32_t i = 0; i < n; ++i) t << "w" << i << " tok-w" << i << "\n";
    t << "b0 tok-b\n";
  }
  s.relay = start_relay(s.token_file);
  const std::string url = "ws://127.0.0.1:" + std::to_string(s.relay->port());
  uint32_t i = 0;
  for (const std::vector<std::string>& part : m.split_experts(n)) {
    std::vector<std::string> args = {WorkerProcess::worker_binary(), "--relay", url, "--token", "tok-w" + std::to_string(i),
                                     "--threads", "1", "--quiet"};
    for (const std::string& sl : part) args.insert(args.end(), {"--slice", sl});
    s.workers.push_back(std::make_unique<ListeningProcess>(args));
    s.worker_flags += " --worker " + url + "/node/w" + std::to_string(i);
    ++i;
  }
  s.worker_flags += " --token tok-b";
  return s;
}

TEST(RelayProcesses, EvalThroughTheRelayEqualsMonolithicAndSurvivesTheRelayDying) {
  const SwarmModel& m = SwarmModel::get({SynthArch::QWEN3MOE, SynthTypeMix::Q4_K_M});
  RelaySwarm swarm = start_relay_swarm(m, 3);
  ASSERT_TRUE(swarm.relay->ok());
  const std::string bin = essaim_binary(), d = swarm.dir;
  const std::string tokens = " --tokens 5,17,99,3,42,7,250,11,64 --threads 1";
  ASSERT_EQ(run_shell(bin + " eval -m " + m.path + tokens + " --logits-out " + d + "/mono.npy 2>/dev/null"), 0);
  ASSERT_EQ(run_shell(bin + " eval --backbone-file " + backbone_file_path(m) + tokens + swarm.worker_flags +
                      " --require-workers --logits-out " + d +
                      "/relay.npy 2>" + d + "/eval.err"),
            0)
      << read_file(d + "/eval.err");
  EXPECT_NE(read_file(d + "/eval.err").find("3 of 3 workers connected"), std::string::npos) << read_file(d + "/eval.err");
  EXPECT_EQ(run_shell(bin + " npy-diff " + d + "/mono.npy " + d + "/relay.npy > " + d + "/diff.txt"), 0);
  EXPECT_NE(read_file(d + "/diff.txt").find("max |Δ| = 0 "), std::string::npos) << read_file(d + "/diff.txt");

  // The relay dies in the middle of a generation: same text (the backbone computes what is missing). This
  // tests the local fallback itself, so this backbone holds the whole model (-m).
  const std::string run = " run -m " + m.path + " -p 'Once upon a time' --threads 1 -n 160 --temp 0";
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(run_shell(bin + run + " > " + d + "/mono.txt 2>/dev/null"), 0);
  const auto mono_time = std::chrono::steady_clock::now() - t0;
  const uint16_t port = swarm.relay->port();
  std::thread killer([&] {
    // Once the run has its workers (it says so on stderr before the prompt), half the monolithic run's time
    // later: the dispatched run is slower, so that is well inside it. Timing from the run's start instead
    // killed the relay before the workers were connected once the model ran fast enough.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (read_file(d + "/run.err").find(" workers connected") == std::string::npos &&
           std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::this_thread::sleep_for(mono_time / 2);
    swarm.relay->kill_hard();
  });
  const int rc = run_shell(bin + run + swarm.worker_flags + " --worker-timeout-ms 500 > " + d + "/relay.txt 2>" + d + "/run.err");
  killer.join();
  ASSERT_EQ(rc, 0) << read_file(d + "/run.err");
  EXPECT_EQ(read_file(d + "/relay.txt"), read_file(d + "/mono.txt"));
  // And it was mid-generation: workers served some pairs, not all.
  unsigned long long calls = 0, pairs = 0, remote = 0;
  const std::string err = read_file(d + "/run.err");
  const size_t at = err.find("dispatch: ");
  ASSERT_NE(at, std::string::npos) << err;
  ASSERT_EQ(std::sscanf(err.c_str() + at, "dispatch: %llu layer calls, %llu (row, expert) pairs: %llu by workers", &calls, &pairs, &remote), 3) << err;
  EXPECT_GT(remote, 0u) << err;
  EXPECT_LT(remote, pairs) << err;

  // A relay on the same port again: the workers dial back (backoff) and serve.
  swarm.relay = start_relay(swarm.token_file, port);
  ASSERT_TRUE(swarm.relay->ok());
  std::string again_err;
  bool all = false;
  for (int attempt = 0; attempt < 4 && !all; ++attempt) {
    std::this_thread::sleep_for(1s);
    (void)run_shell(bin + " eval -m " + m.path + tokens + swarm.worker_flags + " --logits-out " + d + "/again.npy 2>" + d +
                    "/again.err");
    again_err = read_file(d + "/again.err");
    all = again_err.find("3 of 3 workers connected") != std::string::npos;
  }
  EXPECT_TRUE(all) << again_err;
  EXPECT_EQ(run_shell(bin + " npy-diff " + d + "/mono.npy " + d + "/again.npy > /dev/null"), 0);
}

}  // namespace
}  // namespace essaim::backbone::testing
