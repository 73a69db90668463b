#include "expert_rows.h"

#include <immintrin.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <stdexcept>

#include "kernels/kernel_cases.h"
#include "kernels/kernel_traits.h"
#if defined(__x86_64__)
#include "kernels/matmul_amx.h"
#include "median.h"
#endif

namespace essaim::bench {

using json = nlohmann::json;

namespace {

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
}  // namespace

// Int8 multiply-accumulates per CPU-second of one thread (its own CPU time, so a shared machine's other
// load does not lower it):  independent accumulators of vpdpbusd (AVX-512 VNNI)
// or vpmaddubsw + vpaddw (AVX2), so only the multiply ports limit it. Returns int8 ops (2 per MAC) / s.
// Sixteen accumulators, each step its own asm statement (so the compiler keeps them in registers and the
// loop as written): on the AMD EPYC (Zen 5) eight accumulators ran at half the rate of four or sixteen
// (244 against 450 int8 GOPS per CPU-second), which made the products' "fraction of the peak" exceed 1.
__attribute__((target("avx512f,avx512bw,avx512vnni"))) double int8_ops_avx512(int64_t iters) {
  constexpr int kAcc = 16;
  __m512i acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_set1_epi32(i);
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
  const double t0 = thread_cpu_now();
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < kAcc; ++i) asm volatile("vpdpbusd %2, %1, %0" : "+v"(acc[i]) : "v"(a), "v"(b));
  }
  const double s = thread_cpu_now() - t0;
  __m512i sum = acc[0];
  for (int i = 1; i < kAcc; ++i) sum = _mm512_add_epi32(sum, acc[i]);
  volatile int sink = _mm512_reduce_add_epi32(sum);
  (void)sink;
  return double(iters) * kAcc * 64 * 2 / s;
}
__attribute__((target("avx2"))) double int8_ops_avx2(int64_t iters) {
  // In asm: eight accumulators, four inputs, b and two temporaries in registers (GCC 12 spilled half the
  // accumulators of the intrinsic form, and hoisted a loop-invariant vpmaddubsw out of it).
  __m256i c0 = _mm256_set1_epi16(0), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0;
  __m256i a0 = _mm256_set1_epi8(3), a1 = _mm256_set1_epi8(4), a2 = _mm256_set1_epi8(5), a3 = _mm256_set1_epi8(6);
  const __m256i b = _mm256_set1_epi8(-2);
  __m256i t0, t1;
  const double t_begin = thread_cpu_now();
  for (int64_t it = 0; it < iters; ++it)
    asm volatile(
        "vpmaddubsw %[b], %[a0], %[t0]\n\tvpaddw %[t0], %[c0], %[c0]\n\t"
        "vpmaddubsw %[b], %[a1], %[t1]\n\tvpaddw %[t1], %[c1], %[c1]\n\t"
        "vpmaddubsw %[b], %[a2], %[t0]\n\tvpaddw %[t0], %[c2], %[c2]\n\t"
        "vpmaddubsw %[b], %[a3], %[t1]\n\tvpaddw %[t1], %[c3], %[c3]\n\t"
        "vpmaddubsw %[a0], %[a1], %[t0]\n\tvpaddw %[t0], %[c4], %[c4]\n\t"
        "vpmaddubsw %[a1], %[a2], %[t1]\n\tvpaddw %[t1], %[c5], %[c5]\n\t"
        "vpmaddubsw %[a2], %[a3], %[t0]\n\tvpaddw %[t0], %[c6], %[c6]\n\t"
        "vpmaddubsw %[a3], %[a0], %[t1]\n\tvpaddw %[t1], %[c7], %[c7]\n\t"
        : [c0] "+x"(c0), [c1] "+x"(c1), [c2] "+x"(c2), [c3] "+x"(c3), [c4] "+x"(c4), [c5] "+x"(c5),
          [c6] "+x"(c6), [c7] "+x"(c7), [t0] "=&x"(t0), [t1] "=&x"(t1), [a0] "+x"(a0), [a1] "+x"(a1),
          [a2] "+x"(a2), [a3] "+x"(a3)
        : [b] "x"(b));
  const double s = thread_cpu_now() - t_begin;
  const __m256i sum = _mm256_add_epi16(_mm256_add_epi16(_mm256_add_epi16(c0, c1), _mm256_add_epi16(c2, c3)),
                                       _mm256_add_epi16(_mm256_add_epi16(c4, c5), _mm256_add_epi16(c6, c7)));
  volatile int sink = _mm256_extract_epi16(sum, 0);
  (void)sink;
  return double(iters) * 8 * 32 * 2 / s;
}

#if defined(__x86_64__)
// The same for AMX tiles (matmul_amx.h's register-only loop: four independent accumulator tiles).
double int8_ops_amx(int64_t iters) {
  const double t0 = thread_cpu_now();
  amx_tile_peak_loop(iters);
  return double(iters) * 4 * 16 * 16 * 64 * 2 / (thread_cpu_now() - t0);
}
#endif

json int8_peak(ThreadPool* pool) {
  const bool vnni = isa_supported(Isa::AVX512);
  std::vector<double> per_thread(pool->size());
  std::vector<double> best(pool->size(), 0);
  for (int r = 0; r < 5; ++r) {
    parallel_for(pool, pool->size(), [&](size_t b, size_t e) {
      for (size_t t = b; t < e; ++t) per_thread[t] = vnni ? int8_ops_avx512(1'000'000) : int8_ops_avx2(2'000'000);
    });
    for (size_t t = 0; t < per_thread.size(); ++t) best[t] = std::max(best[t], per_thread[t]);
  }
  double total = 0;
  for (double v : best) total += v;
  // One core's rate times the threads: what the threads could do with a core each.
  json out{{"instruction", vnni ? "vpdpbusd zmm" : "vpmaddubsw ymm"}, {"threads", pool->size()},
           {"int8_gops_per_cpu_s_per_thread", best[0] / 1e9}, {"int8_gops_per_s", total / 1e9}};
#if defined(__x86_64__)
  // Where the Q4_K and Q6_K products of several rows run on tiles (matmul_amx.h), their peak too.
  if (amx_enabled()) {
    std::vector<double> amx(pool->size(), 0);
    for (int r = 0; r < 3; ++r)
      parallel_for(pool, pool->size(), [&](size_t b, size_t e) {
        for (size_t t = b; t < e; ++t) amx[t] = std::max(amx[t], int8_ops_amx(200'000));
      });
    double amx_total = 0;
    for (double v : amx) amx_total += v;
    out["amx_instruction"] = "tdpbusd 16x16x64";
    out["amx_int8_gops_per_cpu_s_per_thread"] = amx[0] / 1e9;
    out["amx_int8_gops_per_s"] = amx_total / 1e9;
  }
#endif
  return out;
}

ExpertWeights make_expert_weights(GgmlType down_type, int32_t n) {
  ExpertWeights e;
  // Realistic blocks (Gaussian weights through the quantiser: random bits give values whose SwiGLU
  // overflows expf, a slow path of libm, and moved the figures by 1.5x between the two down types), four
  // distinct experts copied to the rest: every expert still has its own bytes in memory, which is what the
  // cold reads measure, and the set-up stays a few seconds.
  constexpr int32_t kDistinct = 4;
  auto fill = [&](GgmlType t, int64_t cols, int64_t rows, std::vector<uint8_t>& out, uint64_t seed) {
    const uint64_t bytes = type_traits(t).row_bytes(cols) * uint64_t(rows);
    out.resize(bytes * uint64_t(n));
    for (int32_t j = 0; j < n; ++j) {
      if (j >= kDistinct) {
        std::copy_n(out.begin() + int64_t(bytes * uint64_t(j % kDistinct)), bytes, out.begin() + int64_t(bytes * uint64_t(j)));
        continue;
      }
      const KernelProblem p = kernel_problem_build(
          {.name = "", .type = t, .cols = cols, .rows = rows, .n_rows = 1, .fill = WeightFill::QUANTIZED},
          seed * 1000 + uint64_t(j));
      std::copy(p.w.begin(), p.w.end(), out.begin() + int64_t(bytes * uint64_t(j)));
    }
  };
  fill(GgmlType::Q4_K, kExpertEmbd, kExpertFf, e.gate, 1);
  fill(GgmlType::Q4_K, kExpertEmbd, kExpertFf, e.up, 2);
  fill(down_type, kExpertFf, kExpertEmbd, e.down, 3);
  e.layer = ExpertLayer::separate({GgmlType::Q4_K, kExpertEmbd, kExpertFf, n, e.gate.data()},
                                  {GgmlType::Q4_K, kExpertEmbd, kExpertFf, n, e.up.data()},
                                  {down_type, kExpertFf, kExpertEmbd, n, e.down.data()});
  return e;
}

json time_expert_batch(const ExpertWeights& ex, int32_t n_experts, int64_t m, int reps, ThreadPool* pool, int& next_group) {
  const ExpertLayer& layer = ex.layer;
  const int64_t n_rows = m * kExpertsPerCall;  // k = 1: row r goes to the (r / m)-th expert of the call
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> f(size_t(n_rows) * kExpertEmbd);
  for (float& v : f) v = normal(rng);
  std::vector<uint8_t> act(size_t(n_rows) * layer.activation_row_bytes());
  quantize_activations(GgmlType::Q4_K, f.data(), n_rows, kExpertEmbd, act.data());
  std::vector<float> out(size_t(n_rows) * kExpertEmbd);
  std::vector<int32_t> ids(static_cast<size_t>(n_rows));
  std::vector<double> wall, cpu;
  const int groups = std::max(1, n_experts / kExpertsPerCall);
  for (int r = 0; r < reps + 1; ++r) {
    const int32_t first = int32_t((next_group++ % groups) * kExpertsPerCall);
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
  const double flop = 2.0 * 3 * kExpertEmbd * double(kExpertFf) * double(n_rows);
  const double bytes = double(kExpertsPerCall) * double(layer.gate.expert_stride + layer.up.expert_stride + layer.down.expert_stride);
  return json{{"rows_per_expert", m},          {"rows", n_rows},
              {"median_ms", t * 1e3},          {"rows_per_s", double(n_rows) / t},
              {"gflop_per_s", flop / t / 1e9}, {"gflop_per_cpu_s", flop / tc / 1e9},
              {"weight_gb_per_s", bytes / t / 1e9}};
}

}  // namespace essaim::bench
