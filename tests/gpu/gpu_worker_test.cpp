// The GPU worker (--device cuda): results bit-identical to the CPU's, through the worker's own path
// (requests over a pipe, answers compared with the backbone's LocalExpertExecutor over the full model) and
// executor against executor on random batches with unrequested slots. Built in every configuration: a
// build without CUDA, or a machine without a visible device, reports the GPU tests as skipped with the
// reason; the device-selection tests run everywhere.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <bit>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <set>

#include "kernels/matmul.h"
#include "skip.h"
#include "worker/compute_device.h"
#include "worker_test_util.h"

namespace essaim::worker::testing {
namespace {

TEST(GpuDeviceSpecTest, ParsesTheDeviceForms) {
  Result<DeviceSpec> cpu = parse_device("cpu");
  ASSERT_TRUE(cpu.is_ok());
  EXPECT_EQ(cpu->kind, DeviceSpec::Kind::CPU);
  Result<DeviceSpec> cuda = parse_device("cuda");
  ASSERT_TRUE(cuda.is_ok());
  EXPECT_EQ(cuda->kind, DeviceSpec::Kind::CUDA);
  EXPECT_EQ(cuda->index, 0);
  Result<DeviceSpec> cuda3 = parse_device("cuda:3");
  ASSERT_TRUE(cuda3.is_ok());
  EXPECT_EQ(cuda3->index, 3);
  for (const char* bad : {"", "gpu", "cuda:", "cuda:-1", "cuda:1x", "cuda:99999", "CUDA", "cuda:0:1", " cpu"}) {
    Result<DeviceSpec> r = parse_device(bad);
    EXPECT_FALSE(r.is_ok()) << "'" << bad << "'";
    if (!r.is_ok()) {
      EXPECT_NE(r.status().message().find("cpu, cuda or cuda:N"), std::string::npos);
    }
  }
}

TEST(GpuDeviceSpecTest, CpuNeedsNoExecutor) {
  const TestModel& m = TestModel::get({.types = SynthTypeMix::Q4_K_M});
  Result<ComputeDevice> d = open_compute_device({.kind = DeviceSpec::Kind::CPU}, m.full);
  ASSERT_TRUE(d.is_ok()) << d.status().message();
  EXPECT_EQ(d->executor, nullptr);
  EXPECT_TRUE(d->isa_class.empty());
}

// Without CUDA compiled in, --device cuda is refused with a message that says how to get it.
TEST(GpuDeviceSpecTest, CudaIsRefusedClearlyWithoutCudaSupport) {
  if (cuda_compiled_in()) GTEST_SKIP() << "this build has CUDA support; the refusal path is for CPU-only builds";
  const TestModel& m = TestModel::get({.types = SynthTypeMix::Q4_K_M});
  Result<ComputeDevice> d = open_compute_device({.kind = DeviceSpec::Kind::CUDA, .index = 0}, m.full);
  ASSERT_FALSE(d.is_ok());
  EXPECT_NE(d.status().message().find("-DESSAIM_CUDA=ON"), std::string::npos) << d.status().message();
  EXPECT_NE(cuda_unavailable_reason().find("no CUDA support"), std::string::npos);
}

#if defined(ESSAIM_WORKER_BINARY)
// The command line: `essaim-worker --device cuda` in a build without CUDA exits 2 with the message, before
// listening; a malformed device is refused the same way.
TEST(GpuDeviceSpecTest, WorkerBinaryRefusesCudaWithoutSupport) {
  if (cuda_compiled_in()) GTEST_SKIP() << "this build has CUDA support; the refusal path is for CPU-only builds";
  const TestModel& m = TestModel::get({.types = SynthTypeMix::Q4_K_M});
  const std::string slice = m.slice(m.moe.layers.front().layer, 1, 0, 2);
  const std::string err = ::testing::TempDir() + "gpu_worker_test_stderr.txt";
  for (const char* device : {"cuda", "cuda:1", "tpu"}) {
    const std::string cmd = std::string(ESSAIM_WORKER_BINARY) + " --slice " + slice +
                            " --listen 127.0.0.1:0 -q --device " + device + " > /dev/null 2> " + err;
    const int status = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(status)) << cmd;
    EXPECT_EQ(WEXITSTATUS(status), 2) << cmd;
    std::ifstream f(err);
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const bool is_cuda = std::string(device).rfind("cuda", 0) == 0;
    EXPECT_NE(text.find(is_cuda ? "no CUDA support" : "cpu, cuda or cuda:N"), std::string::npos) << text;
  }
}
#endif

// With CUDA compiled in but no device visible, opening fails with the reason instead of crashing.
TEST(GpuDeviceSpecTest, NoVisibleDeviceIsAnErrorNotACrash) {
  if (!cuda_compiled_in()) GTEST_SKIP() << "this build has no CUDA support";
  if (cuda_unavailable_reason().empty()) GTEST_SKIP() << "a CUDA device is visible";
  const TestModel& m = TestModel::get({.types = SynthTypeMix::Q4_K_M});
  Result<ComputeDevice> d = open_compute_device({.kind = DeviceSpec::Kind::CUDA, .index = 0}, m.full);
  ASSERT_FALSE(d.is_ok());
  EXPECT_NE(d.status().message().find("no CUDA device visible"), std::string::npos) << d.status().message();
}

#define ESSAIM_SKIP_WITHOUT_GPU()                                                   \
  do {                                                                              \
    const std::string reason = cuda_unavailable_reason();                          \
    if (!reason.empty()) ESSAIM_SKIP_MISSING_HARDWARE(reason);                    \
  } while (0)

struct Case {
  const char* name;
  ModelSpec spec;
};

class GpuWorkerExactTest : public ::testing::TestWithParam<Case> {};

// A worker computing on the GPU answers requests bit-identically to the backbone's own CPU computation.
TEST_P(GpuWorkerExactTest, WorkerOnTheGpuMatchesTheBackboneBitForBit) {
  ESSAIM_SKIP_WITHOUT_GPU();
  const TestModel& m = TestModel::get(GetParam().spec);
  const uint32_t X = m.moe.expert_count;
  const uint32_t first = m.moe.layers.front().layer, last = m.moe.layers.back().layer;
  ASSERT_GE(X, 4u);
  const uint32_t half = X / 2;
  const std::vector<std::string> slices = {m.slice(first, 1, 0, half), m.slice(first, 1, half, X - half),
                                           m.slice(last, 1, 1, X - 2)};
  // The executor's store: the same slices, opened the way the worker opens them.
  Result<WorkerState> gpu_state = WorkerState::open(slices);
  ASSERT_TRUE(gpu_state.is_ok()) << gpu_state.status().message();
  Result<ComputeDevice> dev = open_compute_device({.kind = DeviceSpec::Kind::CUDA, .index = 0}, gpu_state->store(), 2);
  ASSERT_TRUE(dev.is_ok()) << dev.status().message();
  ASSERT_NE(dev->executor, nullptr);
  EXPECT_EQ(dev->isa_class.rfind("cuda-sm", 0), 0u) << dev->isa_class;

  ServedWorker w(slices, {.executor = dev->executor.get(), .isa_class = dev->isa_class});
  EXPECT_EQ(w.worker().hello().fingerprint.isa_class, dev->isa_class);
  std::unique_ptr<net::FrameConnection> c = w.connect();  // the backbone's handshake accepts a GPU worker
  ASSERT_NE(c, nullptr);

  std::mt19937_64 rng(20251201);
  std::vector<proto::ExpertRequest> reqs;
  uint64_t id = 1;
  for (int i = 0; i < 3; ++i) {
    reqs.push_back(random_request(m, {.layer = first, .first = 0, .count = X}, rng,
                                  {.n_rows = 9, .max_k = 3, .f32 = false, .request_id = id++}));
    reqs.push_back(random_request(m, {.layer = last, .first = 1, .count = X - 2}, rng,
                                  {.n_rows = 3, .max_k = 2, .f32 = false, .request_id = id++}));
  }
  reqs.push_back(random_request(m, {.layer = first, .first = 0, .count = X}, rng,
                                {.n_rows = 4, .max_k = 2, .f32 = true, .request_id = id++}));
  reqs.push_back(random_request(m, {.layer = first, .first = half, .count = X - half}, rng,
                                {.n_rows = 1, .max_k = 1, .f32 = false, .request_id = id++}));
  reqs.push_back(random_request(m, {.layer = first, .first = 0, .count = X}, rng,
                                {.n_rows = 200, .max_k = 4, .min_k = 1, .f32 = false, .request_id = id++}));

  std::vector<proto::ExpertResponse> got = exchange_all(*c, reqs);
  ASSERT_EQ(got.size(), reqs.size());
  std::set<uint32_t> first_bits;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const std::vector<float> want = reference_outputs(m, reqs[i]);
    EXPECT_EQ(got[i].request_id, reqs[i].request_id);
    expect_bits_equal(got[i].outputs, want, "request " + std::to_string(reqs[i].request_id));
    for (size_t p = 0; p < reqs[i].n_pairs(); ++p) first_bits.insert(std::bit_cast<uint32_t>(want[p * m.n_embd()]));
  }
  EXPECT_GT(first_bits.size(), size_t(10));
}

// Executor against executor over the full model: random [rows][k] batches with unrequested (-1) slots,
// which both must leave untouched.
TEST_P(GpuWorkerExactTest, ExecutorMatchesLocalExecutorOnRandomBatches) {
  ESSAIM_SKIP_WITHOUT_GPU();
  const TestModel& m = TestModel::get(GetParam().spec);
  Result<ComputeDevice> dev = open_compute_device({.kind = DeviceSpec::Kind::CUDA, .index = 0}, m.full, 2);
  ASSERT_TRUE(dev.is_ok()) << dev.status().message();
  LocalExpertExecutor cpu(m.full, nullptr);
  std::mt19937_64 rng(77);
  const int32_t X = int32_t(m.moe.expert_count), E = int32_t(m.n_embd());
  for (const MoeLayer& ml : m.moe.layers) {
    const ExpertLayer* l = m.full.any(int32_t(ml.layer));
    ASSERT_NE(l, nullptr);
    for (int64_t n : {1, 5, 64}) {
      const int32_t k = 3;
      std::vector<float> f(size_t(n) * size_t(E));
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (float& v : f) v = normal(rng);
      std::vector<uint8_t> act(size_t(n) * l->activation_row_bytes());
      quantize_activations(l->gate.type, f.data(), n, E, act.data());
      std::vector<int32_t> ids(size_t(n) * k);
      for (int64_t r = 0; r < n; ++r)
        for (int32_t s = 0; s < k; ++s)
          ids[size_t(r * k + s)] = (s == k - 1 && r % 3 == 0) ? -1 : int32_t((r * 7 + s * 3 + int64_t(rng() % 5)) % X);
      for (int64_t r = 0; r < n; ++r)  // distinct experts within a row, as the router gives
        if (ids[size_t(r * k)] == ids[size_t(r * k + 1)]) ids[size_t(r * k + 1)] = (ids[size_t(r * k)] + 1) % X;
      const ExpertBatch batch{.layer = int32_t(ml.layer), .n_rows = n, .k = k, .act_type = l->activation_type(),
                              .act = act, .ids = ids};
      std::vector<float> want(size_t(n) * k * E, -7.25f), got(size_t(n) * k * E, -7.25f);
      ASSERT_TRUE(cpu.compute(batch, want).is_ok());
      ASSERT_TRUE(dev->executor->compute(batch, got).is_ok());
      expect_bits_equal(got, want, "layer " + std::to_string(ml.layer) + " n=" + std::to_string(n));
    }
  }
  // An id the store does not hold is an error, not a crash.
  const ExpertLayer* l = m.full.any(int32_t(m.moe.layers.front().layer));
  std::vector<uint8_t> act(l->activation_row_bytes(), 0);
  std::vector<int32_t> ids = {X + 3};
  std::vector<float> out(static_cast<size_t>(E));
  EXPECT_FALSE(dev->executor
                   ->compute({.layer = int32_t(m.moe.layers.front().layer), .n_rows = 1, .k = 1,
                              .act_type = l->activation_type(), .act = act, .ids = ids}, out)
                   .is_ok());
}

INSTANTIATE_TEST_SUITE_P(Models, GpuWorkerExactTest,
                         ::testing::Values(Case{"Qwen3MoeQ4KM", {.types = SynthTypeMix::Q4_K_M}},
                                           Case{"Qwen3MoeF32", {.types = SynthTypeMix::F32}},
                                           Case{"Qwen35MoeQ4KMFused", {.arch = SynthArch::QWEN35MOE,
                                                                       .types = SynthTypeMix::Q4_K_M,
                                                                       .fused_gate_up = true}}),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace essaim::worker::testing
