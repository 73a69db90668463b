// GPU expert worker benchmark: (row, expert) pairs per second for one MoE layer's routed experts at the
// Qwen3.5-122B-A10B Q4_K_M shapes (gate/up 3072 -> 1024 Q4_K, down 1024 -> 3072 Q6_K or Q4_K), on the GPU
// executor and on the CPU worker path (LocalExpertExecutor over every core) in the same run, with the two
// outputs compared bit for bit. Also: the slice's upload and verification time and the device memory used.
// Prints one JSON document. CUDA builds only (ESSAIM_CUDA=ON).
//
//   build-cuda/bench/gpu_expert_bench                              # 256 experts, batches 1..4096, k = 8
//   build-cuda/bench/gpu_expert_bench --experts 64 --batches 1,512 --down q4_k --cpu-reps 1
//
// A batch of N rows routes each row to k distinct experts (seeded), so it is N * k pairs; "pairs/s" counts
// those. One pair is 3 * 3072 * 1024 multiply-adds = 18.9 M integer ops (2 per MAC), the figure behind the
// "gops" column. Weights: `--distinct` experts quantised by the reference quantiser from seeded Gaussian
// values, repeated to fill the layer (quantising 256 experts would take minutes; every expert is still its
// own bytes in memory and on the device, uploaded and verified like a real slice).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gpu/cuda_expert_executor.h"
#include "kernels/kernel_cases.h"
#include "kernels/kernel_traits.h"
#include "kernels/matmul.h"
#include "moe/executor.h"
#include "median.h"

namespace essaim {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Options {
  int experts = 256;
  int distinct = 4;
  int k = 8;
  std::string batches = "1,8,64,512,4096";
  std::string down = "q6_k";
  int reps = 5;
  int cpu_reps = 3;
  int device = 0;
  bool cpu = true;
  size_t threads = 0;
};

double seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

using bench::median;

std::string cpu_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

// X experts of one [cols -> rows] projection as one [X * rows] matrix (the *_exps tensor layout): `distinct`
// quantised experts (one thread each: the reference quantiser takes seconds per matrix), repeated.
std::vector<uint8_t> expert_tensor(GgmlType type, int64_t cols, int64_t rows, int experts, int distinct, uint64_t seed) {
  const uint64_t one = type_traits(type).row_bytes(uint64_t(cols)) * uint64_t(rows);
  std::vector<uint8_t> t(one * uint64_t(experts));
  std::vector<std::thread> workers;
  for (int d = 0; d < distinct && d < experts; ++d)
    workers.emplace_back([&, d] {
      const KernelProblem p = kernel_problem_build({.name = "bench", .type = type, .cols = cols, .rows = rows, .n_rows = 1,
                                                    .fill = WeightFill::QUANTIZED}, seed + uint64_t(d));
      for (int e = d; e < experts; e += distinct) std::memcpy(t.data() + one * uint64_t(e), p.w.data(), one);
    });
  for (std::thread& w : workers) w.join();
  return t;
}

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::stoll(item));
  return v;
}

int run(const Options& o) {
  const int64_t E = 3072, F = 1024;
  const GgmlType down = o.down == "q4_k" ? GgmlType::Q4_K : GgmlType::Q6_K;
  const gpu::CudaAvailability avail = gpu::cuda_availability();
  if (avail.devices == 0) {
    std::cout << json{{"benchmark", "gpu_expert_bench"}, {"skipped", avail.reason}}.dump(2) << "\n";
    return 0;
  }
  const Clock::time_point tb = Clock::now();
  const std::vector<uint8_t> gate = expert_tensor(GgmlType::Q4_K, E, F, o.experts, o.distinct, 100);
  const std::vector<uint8_t> up = expert_tensor(GgmlType::Q4_K, E, F, o.experts, o.distinct, 200);
  const std::vector<uint8_t> dn = expert_tensor(down, F, E, o.experts, o.distinct, 300);
  const double build_s = seconds(tb);
  const ExpertLayer layer = ExpertLayer::separate({GgmlType::Q4_K, E, F, o.experts, gate.data()},
                                                  {GgmlType::Q4_K, E, F, o.experts, up.data()},
                                                  {down, F, E, o.experts, dn.data()});
  ExpertStore store;
  if (Status s = store.add(0, layer); !s) {
    std::fprintf(stderr, "gpu_expert_bench: %s\n", s.message().c_str());
    return 1;
  }
  const Clock::time_point tc = Clock::now();
  Result<std::unique_ptr<gpu::CudaExpertExecutor>> g = gpu::CudaExpertExecutor::create(store, {.device = o.device, .host_threads = o.threads});
  if (!g) {
    std::fprintf(stderr, "gpu_expert_bench: %s\n", g.status().message().c_str());
    return 1;
  }
  const double create_s = seconds(tc);
  ThreadPool pool(o.threads);
  LocalExpertExecutor cpu(store, &pool);

  json results = json::array();
  std::mt19937_64 rng(42);
  for (int64_t n : parse_list(o.batches)) {
    std::vector<float> f(size_t(n * E));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& v : f) v = normal(rng);
    std::vector<uint8_t> act(size_t(n) * layer.activation_row_bytes());
    quantize_activations(GgmlType::Q4_K, f.data(), n, E, act.data());
    std::vector<int32_t> ids(size_t(n * o.k));
    std::vector<int32_t> perm(size_t(o.experts));
    for (int i = 0; i < o.experts; ++i) perm[size_t(i)] = i;
    for (int64_t r = 0; r < n; ++r) {  // k distinct experts per row
      for (int s = 0; s < o.k; ++s) std::swap(perm[size_t(s)], perm[size_t(s) + rng() % size_t(o.experts - s)]);
      std::copy(perm.begin(), perm.begin() + o.k, ids.begin() + r * o.k);
    }
    const ExpertBatch batch{.layer = 0, .n_rows = n, .k = o.k, .act_type = GgmlType::Q8_K, .act = act, .ids = ids};
    std::vector<float> out_gpu(size_t(n * o.k * E)), out_cpu(out_gpu.size());
    std::vector<double> tg, tcpu;
    for (int rep = 0; rep <= o.reps; ++rep) {  // rep 0 warms up (scratch allocation)
      const Clock::time_point t0 = Clock::now();
      if (Status s = (*g)->compute(batch, out_gpu); !s) {
        std::fprintf(stderr, "gpu_expert_bench: %s\n", s.message().c_str());
        return 1;
      }
      if (rep > 0) tg.push_back(seconds(t0));
    }
    json row{{"rows", n}, {"pairs", n * o.k}};
    const double pairs = double(n * o.k);
    const double ops_per_pair = 2.0 * 3.0 * double(E) * double(F);
    row["gpu_s"] = median(tg);
    row["gpu_pairs_per_s"] = pairs / median(tg);
    row["gpu_gops"] = pairs * ops_per_pair / median(tg) * 1e-9;
    if (o.cpu) {
      for (int rep = 0; rep < o.cpu_reps; ++rep) {
        const Clock::time_point t0 = Clock::now();
        if (Status s = cpu.compute(batch, out_cpu); !s) {
          std::fprintf(stderr, "gpu_expert_bench: %s\n", s.message().c_str());
          return 1;
        }
        tcpu.push_back(seconds(t0));
      }
      row["cpu_s"] = median(tcpu);
      row["cpu_pairs_per_s"] = pairs / median(tcpu);
      row["gpu_vs_cpu"] = median(tcpu) / median(tg);
      row["bit_identical"] = std::memcmp(out_gpu.data(), out_cpu.data(), out_gpu.size() * sizeof(float)) == 0;
    }
    results.push_back(row);
    std::fprintf(stderr, "gpu_expert_bench: rows %lld done\n", static_cast<long long>(n));
  }
  const gpu::CudaUploadReport& upl = (*g)->upload();
  json doc{{"benchmark", "gpu_expert_bench"},
           {"gpu", (*g)->device_name()},
           {"isa_class", (*g)->isa_class()},
           {"cpu", cpu_name()},
           {"cpu_threads", pool.size()},
           {"cpu_isa", std::string(isa_name(kernels_isa()))},
           {"shapes", "gate/up 3072->1024 Q4_K, down 1024->3072 " + std::string(type_name(down))},
           {"experts", o.experts},
           {"k", o.k},
           {"slice_bytes", upl.bytes},
           {"upload_s", upl.upload_seconds},
           {"upload_gb_per_s", double(upl.bytes) / upl.upload_seconds * 1e-9},
           {"verify_s", upl.verify_seconds},
           {"executor_create_s", create_s},
           {"weights_build_s", build_s},
           {"gpu_memory_used_bytes", (*g)->device_bytes_in_use()},
           {"gpu_scratch_bytes", (*g)->scratch_bytes()},
           {"timing", "median of " + std::to_string(o.reps) + " GPU / " + std::to_string(o.cpu_reps) +
                          " CPU runs of executor.compute (host gather, SwiGLU and quantisation included)"},
           {"results", results}};
  std::cout << doc.dump(2) << "\n";
  return 0;
}

}  // namespace
}  // namespace essaim

int main(int argc, char** argv) {
  essaim::Options o;
  CLI::App app{"GPU expert worker benchmark (JSON on stdout)"};
  app.add_option("--experts", o.experts, "Experts in the layer")->check(CLI::Range(8, 1024));
  app.add_option("--distinct", o.distinct, "Distinct quantised experts, repeated to fill the layer")->check(CLI::Range(1, 1024));
  app.add_option("--k", o.k, "Experts per row")->check(CLI::Range(1, 8));
  app.add_option("--batches", o.batches, "Comma-separated row counts");
  app.add_option("--down", o.down, "Down projection type")->check(CLI::IsMember({"q6_k", "q4_k"}));
  app.add_option("--reps", o.reps, "Timed GPU runs per batch (median)")->check(CLI::Range(1, 100));
  app.add_option("--cpu-reps", o.cpu_reps, "Timed CPU runs per batch (median)")->check(CLI::Range(1, 100));
  app.add_option("--device", o.device, "CUDA device index");
  app.add_option("--threads", o.threads, "CPU threads (0 = every core)");
  app.add_flag("!--no-cpu", o.cpu, "Skip the CPU reference");
  CLI11_PARSE(app, argc, argv);
  return essaim::run(o);
}
