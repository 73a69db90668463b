// Worker-side benchmark: the expert FFN (expert_ffn, the pure function a worker runs) at the Qwen3.5-122B
// expert shapes (3072 -> 1024 gate/up Q4_K, 1024 -> 3072 down Q4_K or Q6_K, as in a Q4_K_M file) on batches
// of 1, 8, 64 and 512 rows per expert, 8 experts per call (a layer's top-8), reported as rows/s, GFLOP/s
// and weight GB/s beside two references measured in the same run: the machine's int8 multiply-accumulate
// peak (a register-only loop of the widest int8 dot instruction, on every thread, per CPU-second) and its
// read bandwidth.
// Prints one JSON document; timings are medians, also per CPU-second (the machine is shared).
//
//   build/bench/expert_bench                         # all batch sizes, both down types, all threads
//   build/bench/expert_bench --threads 2 --reps 5 --rows 1,8
//
// Weights are seeded random blocks (finite scales) for --experts experts (default 96, ~510 MB, more than
// the last-level cache here); every repetition uses the next 8 experts, so one-row batches stream their
// weights from DRAM as a worker's decode does. GFLOP counts 2 * 3 * 3072 * 1024 per (row, expert).
#include <immintrin.h>
#include <time.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/kernel_cases.h"
#include "kernels/kernel_traits.h"
#include "moe/expert_ffn.h"
#include "speed/memory_bandwidth.h"

namespace essaim {
namespace {

using json = nlohmann::json;
constexpr int32_t kEmbd = 3072, kFf = 1024, kPerCall = 8;

double wall_now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
double cpu_now() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}
double thread_cpu_now() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Int8 multiply-accumulates per CPU-second of one thread (its own CPU time, so a shared machine's other
// load does not lower it):  independent accumulators of vpdpbusd (AVX-512 VNNI)
// or vpmaddubsw + vpaddw (AVX2), so only the multiply ports limit it. Returns int8 ops (2 per MAC) / s.
__attribute__((target("avx512f,avx512bw,avx512vnni"))) double int8_ops_avx512(int64_t iters) {
  __m512i acc[8];
  for (int i = 0; i < 8; ++i) acc[i] = _mm512_set1_epi32(i);
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
  const double t0 = thread_cpu_now();
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < 8; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
  const double s = thread_cpu_now() - t0;
  __m512i sum = acc[0];
  for (int i = 1; i < 8; ++i) sum = _mm512_add_epi32(sum, acc[i]);
  volatile int sink = _mm512_reduce_add_epi32(sum);
  (void)sink;
  return double(iters) * 8 * 64 * 2 / s;
}
__attribute__((target("avx2"))) double int8_ops_avx2(int64_t iters) {
  __m256i acc[8];
  for (int i = 0; i < 8; ++i) acc[i] = _mm256_set1_epi16(short(i));
  const __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(-2);
  const double t0 = thread_cpu_now();
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < 8; ++i) acc[i] = _mm256_add_epi16(acc[i], _mm256_maddubs_epi16(a, b));
  const double s = thread_cpu_now() - t0;
  __m256i sum = acc[0];
  for (int i = 1; i < 8; ++i) sum = _mm256_add_epi16(sum, acc[i]);
  volatile int sink = _mm256_extract_epi16(sum, 0);
  (void)sink;
  return double(iters) * 8 * 32 * 2 / s;
}

json int8_peak(ThreadPool* pool) {
  const bool vnni = isa_supported(Isa::AVX512);
  std::vector<double> per_thread(pool->size());
  std::vector<double> best(pool->size(), 0);
  for (int r = 0; r < 5; ++r) {
    parallel_for(pool, pool->size(), [&](size_t b, size_t e) {
      for (size_t t = b; t < e; ++t) per_thread[t] = vnni ? int8_ops_avx512(2'000'000) : int8_ops_avx2(2'000'000);
    });
    for (size_t t = 0; t < per_thread.size(); ++t) best[t] = std::max(best[t], per_thread[t]);
  }
  double total = 0;
  for (double v : best) total += v;
  // One core's rate times the threads: what the threads could do with a core each.
  return json{{"instruction", vnni ? "vpdpbusd zmm" : "vpmaddubsw ymm"}, {"threads", pool->size()},
              {"int8_gops_per_cpu_s_per_thread", best[0] / 1e9}, {"int8_gops_per_s", total / 1e9}};
}

struct Experts {
  std::vector<uint8_t> gate, up, down;
  ExpertLayer layer;
};

Experts make_experts(GgmlType down_type, int32_t n) {
  Experts e;
  auto fill = [&](GgmlType t, int64_t cols, int64_t rows, std::vector<uint8_t>& out, uint64_t seed) {
    const uint64_t bytes = type_traits(t).row_bytes(cols) * uint64_t(rows);
    out.resize(bytes * uint64_t(n));
    for (int32_t j = 0; j < n; ++j) {
      const KernelProblem p = kernel_problem_build(
          {.name = "", .type = t, .cols = cols, .rows = rows, .n_rows = 1, .fill = WeightFill::RANDOM_BITS},
          seed * 1000 + uint64_t(j));
      std::copy(p.w.begin(), p.w.end(), out.begin() + int64_t(bytes * uint64_t(j)));
    }
  };
  fill(GgmlType::Q4_K, kEmbd, kFf, e.gate, 1);
  fill(GgmlType::Q4_K, kEmbd, kFf, e.up, 2);
  fill(down_type, kFf, kEmbd, e.down, 3);
  e.layer = ExpertLayer::separate({GgmlType::Q4_K, kEmbd, kFf, n, e.gate.data()},
                                  {GgmlType::Q4_K, kEmbd, kFf, n, e.up.data()},
                                  {down_type, kFf, kEmbd, n, e.down.data()});
  return e;
}

json bench_batch(const Experts& ex, int32_t n_experts, int64_t m, int reps, ThreadPool* pool, int& next_group) {
  const ExpertLayer& layer = ex.layer;
  const int64_t n_rows = m * kPerCall;  // k = 1: row r goes to the (r / m)-th expert of the call
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> f(size_t(n_rows) * kEmbd);
  for (float& v : f) v = normal(rng);
  std::vector<uint8_t> act(size_t(n_rows) * layer.activation_row_bytes());
  quantize_activations(GgmlType::Q4_K, f.data(), n_rows, kEmbd, act.data());
  std::vector<float> out(size_t(n_rows) * kEmbd);
  std::vector<int32_t> ids(static_cast<size_t>(n_rows));
  std::vector<double> wall, cpu;
  const int groups = std::max(1, n_experts / kPerCall);
  for (int r = 0; r < reps + 1; ++r) {
    const int32_t first = int32_t((next_group++ % groups) * kPerCall);
    for (int64_t i = 0; i < n_rows; ++i) ids[size_t(i)] = first + int32_t(i / m);
    const double w0 = wall_now(), c0 = cpu_now();
    Status s = expert_ffn(layer, act.data(), n_rows, 1, ids.data(), out.data(), pool);
    if (!s) throw std::runtime_error(s.message());
    if (r > 0) {
      wall.push_back(wall_now() - w0);
      cpu.push_back(cpu_now() - c0);
    }
  }
  const double t = median(wall), tc = median(cpu);
  const double flop = 2.0 * 3 * kEmbd * double(kFf) * double(n_rows);
  const double bytes = double(kPerCall) * double(layer.gate.expert_stride + layer.up.expert_stride + layer.down.expert_stride);
  return json{{"rows_per_expert", m},          {"rows", n_rows},
              {"median_ms", t * 1e3},          {"rows_per_s", double(n_rows) / t},
              {"gflop_per_s", flop / t / 1e9}, {"gflop_per_cpu_s", flop / tc / 1e9},
              {"weight_gb_per_s", bytes / t / 1e9}};
}

}  // namespace
}  // namespace essaim

int main(int argc, char** argv) {
  using namespace essaim;
  int threads = 0, reps = 5, n_experts = 96;
  std::vector<int64_t> rows = {1, 8, 64, 512};
  CLI::App app{"essaim expert FFN benchmark (worker side): rows/s and GFLOP/s vs int8 peak and read bandwidth"};
  app.add_option("--threads", threads, "threads (0 = all hardware threads)")->check(CLI::Range(0, 1024));
  app.add_option("--reps", reps, "timed repetitions (median reported)")->check(CLI::Range(1, 1000));
  app.add_option("--rows", rows, "rows per expert (default 1 8 64 512)")->delimiter(',')->check(CLI::Range(1, 4096));
  app.add_option("--experts", n_experts, "experts held (default 96, > LLC)")->check(CLI::Range(8, 4096));
  CLI11_PARSE(app, argc, argv);
  try {
    ThreadPool pool(static_cast<size_t>(threads));
    json doc{{"benchmark", "expert_ffn"}, {"cpu", cpu_model_name()}, {"isa", std::string(isa_name(kernels_isa()))},
             {"threads", pool.size()}, {"reps", reps}, {"experts_per_call", kPerCall}};
    doc["int8_peak"] = int8_peak(&pool);
    const Bandwidth bw = measure_bandwidth({.bytes = 512 << 20, .reps = 5, .copy = false}, &pool);
    doc["read_gb_per_s"] = bw.read_gb_per_s;
    const double peak = doc["int8_peak"]["int8_gops_per_s"].get<double>();
    doc["cases"] = json::array();
    for (GgmlType down : {GgmlType::Q4_K, GgmlType::Q6_K}) {
      const Experts ex = make_experts(down, n_experts);
      int next_group = 0;
      for (int64_t m : rows) {
        json r = bench_batch(ex, n_experts, m, reps, &pool, next_group);
        r["down_type"] = std::string(type_name(down));
        // Both per CPU-second: the fraction of the int8 peak the CPU time spent actually achieves.
        r["fraction_of_int8_peak"] = r["gflop_per_cpu_s"].get<double>() / (peak / double(pool.size()));
        r["fraction_of_read_bandwidth"] = r["weight_gb_per_s"].get<double>() / bw.read_gb_per_s;
        std::fprintf(stderr, "down %-5s rows/expert %4lld  %9.1f rows/s  %7.1f GFLOP/s (%4.1f %% of int8 peak per CPU-s)  %5.1f GB/s\n",
                     std::string(type_name(down)).c_str(), (long long)m, r["rows_per_s"].get<double>(),
                     r["gflop_per_s"].get<double>(), 100 * r["fraction_of_int8_peak"].get<double>(),
                     r["weight_gb_per_s"].get<double>());
        doc["cases"].push_back(std::move(r));
      }
    }
    std::printf("%s\n", doc.dump(2).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "expert_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
