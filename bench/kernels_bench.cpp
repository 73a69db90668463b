// Kernel benchmarks: dot products and matrix products at the Qwen3.5-122B expert shapes (the cases of
// kernels/kernel_cases.h, the same ones the tests check), beside the machine's memory bandwidth and the
// scalar reference kernel measured in the same run. Prints one JSON document.
//
//   build-kernels/bench/kernels_bench                 # all cases, median of 7, all hardware threads
//   build-kernels/bench/kernels_bench --filter q4_k --threads 1 --reps 11
//
// GB/s counts weight bytes streamed (each weight byte is read once per product); GFLOP/s counts
// 2 * rows * cols * n_rows. Weights are cold: every timed product reads a different copy of the matrix from
// a pool larger than the last-level cache, as in decoding, where each expert's weights come from DRAM.
// "dot" is the bare kernel on one thread (vec_dot over every weight row, no tiling); "matmul" is
// matmul_preq with the thread pool; "scalar" is matmul_preq with the scalar reference kernels. Each figure
// comes as wall-clock rates and as rates per CPU-second (process CPU time, all threads): on a shared
// machine only the second says what the code does.
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "kernels/dot_kernels.h"
#include "kernels/kernel_cases.h"
#include "kernels/kernel_traits.h"
#include "kernels/matmul.h"

namespace essaim {
namespace {

using json = nlohmann::json;

struct Options {
  int reps = 7;
  int scalar_reps = 3;
  int threads = 0;  // 0: all hardware threads
  std::string filter;
  int64_t stream_mb = 1024;
  int64_t pool_mb = 0;  // 0: twice the last-level cache, at least 256, at most 1024
  bool scalar = true;
};

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// CPU time of all threads of this process: on a shared machine the wall clock also counts the time other
// processes held the cores, the CPU time does not (our pool's workers sleep, they never spin).
double cpu_seconds_now() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

struct Timing {
  double median = 0, min = 0;  // wall seconds per operation
  double cpu_median = 0;       // CPU seconds per operation, all threads together
};

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One untimed warm-up, then reps timings of fn(); fn returns how many operations it performed.
template <typename Fn>
Timing time_median(int reps, Fn fn) {
  fn();
  std::vector<double> wall, cpu;
  for (int r = 0; r < reps; ++r) {
    const double t0 = seconds_now(), c0 = cpu_seconds_now();
    const int ops = fn();
    wall.push_back((seconds_now() - t0) / ops);
    cpu.push_back((cpu_seconds_now() - c0) / ops);
  }
  return Timing{.median = median_of(wall), .min = *std::min_element(wall.begin(), wall.end()),
                .cpu_median = median_of(cpu)};
}

int64_t llc_bytes() {
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return l3 > 0 ? l3 : 32 << 20;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

// STREAM-style copy (bytes read + written per second, STREAM's convention) and a pure read (sum) over
// buffers much larger than the last-level cache.
json memory_bandwidth(int64_t bytes, int reps, ThreadPool* pool) {
  std::vector<uint64_t> a(size_t(bytes / 8)), b(size_t(bytes / 8));
  for (size_t i = 0; i < a.size(); ++i) a[i] = i * 0x9E3779B97F4A7C15ull;
  std::fill(b.begin(), b.end(), 1);
  volatile uint64_t sink = 0;
  auto copy = [&](ThreadPool* p) {
    parallel_for(p, 64, [&](size_t begin, size_t end) {
      const size_t chunk = a.size() / 64;
      std::memcpy(b.data() + begin * chunk, a.data() + begin * chunk, (end - begin) * chunk * 8);
    });
    return 1;
  };
  auto read = [&](ThreadPool* p) {
    std::vector<uint64_t> partial(64);
    parallel_for(p, 64, [&](size_t begin, size_t end) {
      const size_t chunk = a.size() / 64;
      for (size_t c = begin; c < end; ++c) {
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        const uint64_t* q = a.data() + c * chunk;
        for (size_t i = 0; i + 4 <= chunk; i += 4) {
          s0 += q[i];
          s1 += q[i + 1];
          s2 += q[i + 2];
          s3 += q[i + 3];
        }
        partial[c] = s0 ^ s1 ^ s2 ^ s3;
      }
    });
    for (uint64_t v : partial) sink = sink + v;
    return 1;
  };
  const double gb = double(bytes) / 1e9;
  json out;
  out["buffer_bytes"] = bytes;
  out["threads"] = pool ? pool->size() : 1;
  const Timing copy_n = time_median(reps, [&] { return copy(pool); });
  const Timing read_n = time_median(reps, [&] { return read(pool); });
  const Timing copy_1 = time_median(reps, [&] { return copy(nullptr); });
  const Timing read_1 = time_median(reps, [&] { return read(nullptr); });
  out["copy_gb_per_s"] = 2 * gb / copy_n.median;
  out["read_gb_per_s"] = gb / read_n.median;
  out["copy_gb_per_s_1thread"] = 2 * gb / copy_1.median;
  out["read_gb_per_s_1thread"] = gb / read_1.median;
  out["read_gb_per_cpu_s"] = gb / read_1.cpu_median;  // one core's read rate from its CPU time
  out["copy_gb_per_cpu_s"] = 2 * gb / copy_1.cpu_median;
  return out;
}

// Copies of one weight matrix filling a pool larger than the cache, visited round-robin.
struct WeightPool {
  std::vector<uint8_t> bytes;
  uint64_t matrix_bytes = 0;
  int64_t copies = 0;
  int64_t next = 0;
  const uint8_t* take() {
    const uint8_t* p = bytes.data() + uint64_t(next) * matrix_bytes;
    next = (next + 1) % copies;
    return p;
  }
};

// Wall-clock rates, and per-core rates from CPU time (what one uncontended core sustains).
json figures(const Timing& t, uint64_t weight_bytes, double flops, Isa isa, size_t threads) {
  return json{{"isa", isa_name(isa)},
              {"threads", threads},
              {"median_ms", t.median * 1e3},
              {"min_ms", t.min * 1e3},
              {"gb_per_s", double(weight_bytes) / t.median / 1e9},
              {"gflop_per_s", flops / t.median / 1e9},
              {"cpu_ms", t.cpu_median * 1e3},
              {"gb_per_cpu_s", double(weight_bytes) / t.cpu_median / 1e9},
              {"gflop_per_cpu_s", flops / t.cpu_median / 1e9}};
}

// Timed unit: as many products (each on the next cold copy) as fill ~50 ms, so short products are not
// dominated by timer resolution.
template <typename Product>
Timing time_products(int reps, WeightPool& pool, Product product) {
  const double t0 = seconds_now();
  product(pool.take());
  const double once = std::max(seconds_now() - t0, 1e-7);
  const int batch = int(std::clamp<double>(0.05 / once, 1, double(pool.copies)));
  return time_median(reps, [&] {
    for (int i = 0; i < batch; ++i) product(pool.take());
    return batch;
  });
}

int run(const Options& opt) {
  const size_t threads = opt.threads > 0 ? size_t(opt.threads) : std::max(1u, std::thread::hardware_concurrency());
  ThreadPool pool(threads);
  const Isa isa = kernels_isa();
  const int64_t llc = llc_bytes();
  const int64_t pool_bytes =
      opt.pool_mb > 0 ? opt.pool_mb << 20 : std::clamp<int64_t>(2 * llc, int64_t(256) << 20, int64_t(1024) << 20);

  json doc;
  doc["benchmark"] = "kernels";
  doc["machine"] = {{"cpu", cpu_model()},
                    {"isa", isa_name(isa)},
                    {"best_isa", isa_name(best_isa())},
                    {"threads", threads},
                    {"prefetch_bytes", weight_prefetch_bytes()},
                    {"amx", amx_enabled()}, {"lanes", lanes_enabled()}, {"row_lanes", rowlanes_enabled()},
                    {"llc_bytes", llc}};
  doc["reps"] = opt.reps;
  doc["weight_pool_bytes"] = pool_bytes;
  doc["memory_bandwidth"] = memory_bandwidth(opt.stream_mb << 20, std::max(3, opt.reps / 2), &pool);
  const double read_bw = doc["memory_bandwidth"]["read_gb_per_s"].get<double>();

  // Cases of one shape share weights; build them once, at the largest row count.
  std::map<std::string, std::vector<KernelCase>> by_shape;
  for (const KernelCase& c : kernel_cases_benchmark()) {
    if (!opt.filter.empty() && c.name.find(opt.filter) == std::string::npos) continue;
    by_shape[c.name.substr(0, c.name.find(" n="))].push_back(c);
  }

  json cases = json::array();
  for (auto& [shape, shape_cases] : by_shape) {
    KernelCase biggest = shape_cases.front();
    for (const KernelCase& c : shape_cases) biggest.n_rows = std::max(biggest.n_rows, c.n_rows);
    const KernelProblem problem = kernel_problem_build(biggest, 1);
    const WeightMatrix w0 = problem.weights();
    WeightPool weights;
    weights.matrix_bytes = problem.w.size();
    weights.copies = std::max<int64_t>(1, pool_bytes / int64_t(weights.matrix_bytes));
    weights.bytes.resize(weights.matrix_bytes * uint64_t(weights.copies));
    for (int64_t i = 0; i < weights.copies; ++i)
      std::memcpy(weights.bytes.data() + uint64_t(i) * weights.matrix_bytes, problem.w.data(), weights.matrix_bytes);
    const uint64_t x_row = activation_row_bytes(w0.type, w0.cols);
    std::vector<uint8_t> xq(x_row * uint64_t(biggest.n_rows));
    quantize_activations(w0.type, problem.x.data(), biggest.n_rows, w0.cols, xq.data());
    const KernelTraits& k = *kernel_traits(w0.type);

    for (const KernelCase& c : shape_cases) {
      const double flops = 2.0 * double(c.cols) * double(c.rows) * double(c.n_rows);
      std::vector<float> y(size_t(c.n_rows * c.rows));
      auto matmul_on = [&](ThreadPool* p) {
        return [&, p](const uint8_t* data) {
          WeightMatrix w = w0;
          w.data = data;
          matmul_preq(w, xq.data(), c.n_rows, y.data(), p);
        };
      };
      const VecDotFn dot = k.dot(isa);
      auto dot_all_rows = [&](const uint8_t* data) {
        for (int64_t t = 0; t < c.n_rows; t += kDotMaxRows) {
          const int nx = int(std::min<int64_t>(kDotMaxRows, c.n_rows - t));
          for (int64_t o = 0; o < c.rows; ++o)
            dot(c.cols, data + uint64_t(o) * w0.row_stride, xq.data() + uint64_t(t) * x_row, x_row, nx,
                &y[size_t(t * c.rows + o)]);
        }
      };

      json j{{"name", c.name},     {"type", type_name(c.type)},   {"cols", c.cols},
             {"rows", c.rows},     {"n_rows", c.n_rows},          {"weight_bytes", weights.matrix_bytes},
             {"flops", flops}};
      const Timing mm = time_products(opt.reps, weights, matmul_on(&pool));
      j["matmul"] = figures(mm, weights.matrix_bytes, flops, isa, threads);
      j["matmul"]["fraction_of_read_bandwidth"] = double(weights.matrix_bytes) / mm.median / 1e9 / read_bw;
      j["dot"] = figures(time_products(opt.reps, weights, dot_all_rows), weights.matrix_bytes, flops, isa, 1);
      if (opt.scalar) {
        (void)set_kernel_isa(Isa::SCALAR);
        const Timing ref = time_products(opt.scalar_reps, weights, matmul_on(&pool));
        (void)set_kernel_isa(isa);
        j["scalar"] = figures(ref, weights.matrix_bytes, flops, Isa::SCALAR, threads);
        j["matmul_speedup_vs_scalar"] = ref.median / mm.median;
      }
      std::fprintf(stderr, "%-32s matmul %8.3f ms %7.2f GB/s %8.1f GFLOP/s (%7.2f GB/cpu-s)\n", c.name.c_str(),
                   mm.median * 1e3, double(weights.matrix_bytes) / mm.median / 1e9, flops / mm.median / 1e9,
                   double(weights.matrix_bytes) / mm.cpu_median / 1e9);
      cases.push_back(j);
    }
  }
  doc["cases"] = cases;
  std::cout << doc.dump(2) << "\n";
  return 0;
}

}  // namespace
}  // namespace essaim

int main(int argc, char** argv) {
  essaim::Options opt;
  CLI::App app{"essaim kernel benchmarks (JSON on stdout, progress on stderr)"};
  app.add_option("--reps", opt.reps, "timed repetitions per figure (median reported)")->check(CLI::Range(1, 1000));
  app.add_option("--scalar-reps", opt.scalar_reps, "repetitions for the scalar reference")->check(CLI::Range(1, 1000));
  app.add_option("--threads", opt.threads, "threads for matmul (0 = all hardware threads)")->check(CLI::Range(0, 1024));
  app.add_option("--filter", opt.filter, "only cases whose name contains this (e.g. q4_k, 'n=512')");
  app.add_option("--stream-mb", opt.stream_mb, "bandwidth buffer size in MiB")->check(CLI::Range(16, 1 << 16));
  app.add_option("--pool-mb", opt.pool_mb, "cold weight pool in MiB (0 = 2x LLC, 256..1024)")->check(CLI::Range(0, 1 << 16));
  app.add_flag("!--no-scalar", opt.scalar, "skip the scalar reference");
  CLI11_PARSE(app, argc, argv);
  return essaim::run(opt);
}
