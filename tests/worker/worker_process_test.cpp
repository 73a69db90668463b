// Worker processes over TCP loopback: `essaim-worker` and `essaim worker` print their port, answer
// bit-identically to the backbone's own executor, refuse a backbone of another model, keep their resident
// memory within the slices' bytes + 32 MiB while touching every expert, map no full model, and stop
// cleanly on SIGTERM and SIGINT.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "child_process.h"
#include "net/tcp.h"
#include "temp_dir.h"
#include "worker_test_util.h"

namespace essaim::worker::testing {
namespace {

using namespace std::chrono_literals;

const std::string kWorkerBinary = std::string(ESSAIM_BINARY_DIR) + "/src/cli/essaim-worker";
const std::string kEssaimBinary = std::string(ESSAIM_BINARY_DIR) + "/src/cli/essaim";

using test_support::ChildProcess;  // tests/support/child_process.h

// Where the children's stderr files go: a directory of this test program's own, removed at exit.
std::string stderr_file(const std::string& name) {
  static const struct Dir {
    std::string path = essaim::testing::make_temp_dir("essaim-worker-process");
    ~Dir() { std::filesystem::remove_all(path); }
  } dir;
  static int serial = 0;
  return dir.path + "/" + name + "-" + std::to_string(serial++) + ".stderr";
}

// Starts a worker process on port 0 and reads the port from its ready line.
struct RunningWorker {
  std::unique_ptr<ChildProcess> child;
  uint16_t port = 0;
};

RunningWorker start_worker(const std::vector<std::string>& command, const std::vector<std::string>& slices,
                           const std::string& name) {
  std::vector<std::string> argv = command;
  for (const std::string& s : slices) argv.insert(argv.end(), {"--slice", s});
  argv.insert(argv.end(), {"--listen", "127.0.0.1:0", "--threads", "2"});
  RunningWorker w{std::make_unique<ChildProcess>(argv, test_support::ChildOptions{.stderr_path = stderr_file(name)}), 0};
  w.port = w.child->await_listening(30s);
  EXPECT_NE(w.port, 0) << "no \"listening on\" line; stderr:\n" << w.child->stderr_text();
  return w;
}

std::unique_ptr<net::FrameConnection> tcp_backbone(uint16_t port, const proto::ModelId& model,
                                                    net::NetResult<proto::Hello>* peer_out = nullptr) {
  net::NetResult<std::unique_ptr<net::TcpStream>> s = net::tcp_connect("127.0.0.1", port, net::deadline_in(5s));
  EXPECT_TRUE(s.is_ok()) << s.error().message;
  if (!s) return nullptr;
  auto c = std::make_unique<net::FrameConnection>(std::move(*s));
  net::NetResult<proto::Hello> peer = net::handshake(*c, backbone_hello(model), net::deadline_in(5s));
  if (peer_out) *peer_out = peer;
  else EXPECT_TRUE(peer.is_ok()) << peer.error().message;
  return c;
}

uint64_t vm_rss_bytes(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  while (f >> key) {
    if (key == "VmRSS:") {
      uint64_t kib = 0;
      f >> kib;
      return kib << 10;
    }
    std::string rest;
    std::getline(f, rest);
  }
  return 0;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

class WorkerProcessTest : public ::testing::TestWithParam<std::vector<std::string>> {};

TEST_P(WorkerProcessTest, AnswersOverTcpBitForBitAndStopsOnSigterm) {
  const TestModel& m = TestModel::get({.types = SynthTypeMix::Q4_K_M});
  const uint32_t first = m.moe.layers.front().layer, last = m.moe.layers.back().layer;
  const uint32_t X = m.moe.expert_count;
  RunningWorker w = start_worker(GetParam(), {m.slice(first, 1, 0, X / 2), m.slice(last, 1, X / 2, X - X / 2)},
                                 "essaim-worker-tcp");
  ASSERT_NE(w.port, 0);
  net::NetResult<proto::Hello> peer = net::net_error(net::NetErrorKind::IO, "not connected");
  std::unique_ptr<net::FrameConnection> c = tcp_backbone(w.port, m.moe.source_model, &peer);
  ASSERT_TRUE(peer.is_ok()) << peer.error().message;
  ASSERT_EQ(peer->holdings.size(), 2u);
  const std::vector<proto::Holding> want = {{first, 0, X / 2}, {last, X / 2, X - X / 2}};
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(peer->holdings[i].layer, want[i].layer);
    EXPECT_EQ(peer->holdings[i].first_expert, want[i].first_expert);
    EXPECT_EQ(peer->holdings[i].expert_count, want[i].expert_count);
    EXPECT_NE(peer->holdings[i].sha256, proto::ContentDigest{});  // the slice's content digest
  }
  EXPECT_EQ(peer->fingerprint, build_fingerprint());

  std::mt19937_64 rng(314);
  std::vector<proto::ExpertRequest> reqs;
  for (uint64_t i = 0; i < 10; ++i) {
    const bool lo = i % 2 == 0;
    reqs.push_back(random_request(m, {.layer = lo ? first : last, .first = lo ? 0 : X / 2, .count = lo ? X / 2 : X - X / 2},
                                  rng, {.n_rows = 6, .max_k = 2, .f32 = i == 9, .request_id = i + 1}));
  }
  std::vector<proto::ExpertResponse> got = exchange_all(*c, reqs);
  ASSERT_EQ(got.size(), reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i)
    expect_bits_equal(got[i].outputs, reference_outputs(m, reqs[i]), "request " + std::to_string(i + 1));

  // A backbone of another model is refused, with the reason.
  proto::ModelId other = m.moe.source_model;
  other[5] ^= 1;
  net::NetResult<proto::Hello> refused = net::net_error(net::NetErrorKind::IO, "not connected");
  tcp_backbone(w.port, other, &refused);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.error().kind, net::NetErrorKind::REFUSED);
  EXPECT_EQ(refused.error().refuse, proto::RefuseReason::MODEL);
  // Both sides refuse at once; wait until the worker's side has logged its own refusal.
  for (int i = 0; i < 500 && w.child->stderr_text().find("refused (MODEL)") == std::string::npos; ++i)
    std::this_thread::sleep_for(10ms);

  // SIGTERM with a live connection: a clean exit, stats on stderr.
  EXPECT_EQ(w.child->stop(SIGTERM, 10s), 0) << w.child->stderr_text();
  const std::string err = w.child->stderr_text();
  EXPECT_NE(err.find("SIGTERM, stopping"), std::string::npos) << err;
  EXPECT_NE(err.find("\"requests\":10"), std::string::npos) << err;
  EXPECT_NE(err.find("\"MODEL\":1"), std::string::npos) << err;
}

INSTANTIATE_TEST_SUITE_P(Binaries, WorkerProcessTest,
                         ::testing::Values(std::vector<std::string>{kWorkerBinary},
                                           std::vector<std::string>{kEssaimBinary, "worker"}),
                         [](const auto& p) { return p.param.size() == 1 ? std::string("EssaimWorker") : std::string("EssaimSubcommand"); });

// docs/invariants.md invariant 4: resident memory within the slices' bytes + 32 MiB after every expert has computed,
// and the full model never mapped. F32 experts, so that the slices (~9 MiB) dominate what is measured.
TEST(WorkerProcess, ResidentMemoryStaysWithinSlicesPlus32MiB) {
  const TestModel& m = TestModel::get({.types = SynthTypeMix::F32});
  std::vector<std::string> slices;
  uint64_t slice_bytes = 0;
  for (const MoeLayer& l : m.moe.layers) {
    slices.push_back(m.slice(l.layer, 1, 0, m.moe.expert_count));
    slice_bytes += std::filesystem::file_size(slices.back());
  }
  RunningWorker w = start_worker({kWorkerBinary}, slices, "essaim-worker-rss");
  ASSERT_NE(w.port, 0);
  std::unique_ptr<net::FrameConnection> c = tcp_backbone(w.port, m.moe.source_model);
  std::mt19937_64 rng(2718);
  for (int round = 0; round < 3; ++round) {
    std::vector<proto::ExpertRequest> reqs;
    for (const MoeLayer& l : m.moe.layers)  // row 0 of each request takes every expert of the layer
      reqs.push_back(random_request(m, {.layer = l.layer, .first = 0, .count = m.moe.expert_count}, rng,
                                    {.n_rows = 16, .max_k = m.moe.expert_count,
                                     .request_id = uint64_t(round * 100 + reqs.size() + 1)}));
    std::vector<proto::ExpertResponse> got = exchange_all(*c, reqs);
    ASSERT_EQ(got.size(), reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i) expect_bits_equal(got[i].outputs, reference_outputs(m, reqs[i]));
  }
  const uint64_t rss = vm_rss_bytes(w.child->pid());
  std::printf("[ worker   ] RSS %.1f MiB, slices %.1f MiB, model file %.1f MiB\n", double(rss) / (1 << 20),
              double(slice_bytes) / (1 << 20), double(std::filesystem::file_size(m.path)) / (1 << 20));
  // Every expert's pages were touched, so the slices are resident: the measurement sees them.
  EXPECT_GT(rss, slice_bytes * 9 / 10);
  EXPECT_LE(rss, slice_bytes + (uint64_t(32) << 20));
  const std::string maps = read_file("/proc/" + std::to_string(w.child->pid()) + "/maps");
  EXPECT_NE(maps.find(slices.front()), std::string::npos);
  EXPECT_EQ(maps.find(m.path), std::string::npos) << "the worker mapped the full model";
  EXPECT_EQ(w.child->stop(SIGINT, 10s), 0) << w.child->stderr_text();
}

TEST(WorkerProcess, RefusesBadArguments) {
  const test_support::ChildOptions err{.stderr_path = stderr_file("essaim-worker-args")};
  {
    const TestModel& m = TestModel::get({.types = SynthTypeMix::Q4_K_M});
    ChildProcess c({kWorkerBinary, "--slice", m.path, "--listen", "127.0.0.1:0"}, err);  // a full model is not a slice
    EXPECT_EQ(c.read_line(30s), "");
    EXPECT_EQ(c.stop(0, 30s), 1);
    EXPECT_NE(c.stderr_text().find(m.path), std::string::npos) << c.stderr_text();
  }
  {
    const TestModel& m = TestModel::get({.types = SynthTypeMix::Q4_K_M});
    ChildProcess c({kWorkerBinary, "--slice", m.slice(m.moe.layers.front().layer, 1, 0, 2), "--listen", "nonsense"}, err);
    EXPECT_EQ(c.stop(0, 30s), 2) << c.stderr_text();
  }
}

}  // namespace
}  // namespace essaim::worker::testing
