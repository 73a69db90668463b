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
#include <algorithm>
#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "expert_rows.h"
#include "kernels/kernel_traits.h"
#include "speed/memory_bandwidth.h"

int main(int argc, char** argv) {
  using namespace essaim;
  using namespace essaim::bench;
  using json = nlohmann::json;
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
             {"amx", amx_enabled()}, {"lanes", lanes_enabled()}, {"row_lanes", rowlanes_enabled()},
             {"threads", pool.size()}, {"reps", reps}, {"experts_per_call", kExpertsPerCall}};
    doc["int8_peak"] = int8_peak(&pool);
    const Bandwidth bw = measure_bandwidth({.bytes = 512 << 20, .reps = 5, .copy = false}, &pool);
    doc["read_gb_per_s"] = bw.read_gb_per_s;
    const double peak = doc["int8_peak"]["int8_gops_per_s"].get<double>();
    doc["cases"] = json::array();
    for (GgmlType down : {GgmlType::Q4_K, GgmlType::Q6_K}) {
      const ExpertWeights ex = make_expert_weights(down, n_experts);
      int next_group = 0;
      // Every batch size once before any timing: the first timed runs of a size in the process came out up to
      // 2x slow (whichever down type ran first) — a first-use cost in the process (memory the size needs for
      // the first time, presumably), not of the products.
      for (int64_t m : rows) (void)time_expert_batch(ex, n_experts, m, 1, &pool, next_group);
      for (int64_t m : rows) {
        json r = time_expert_batch(ex, n_experts, m, reps, &pool, next_group);
        r["down_type"] = std::string(type_name(down));
        // Both per CPU-second: the fraction of the int8 peak the CPU time spent actually achieves.
        r["fraction_of_int8_peak"] = r["gflop_per_cpu_s"].get<double>() / (peak / double(pool.size()));
        if (doc["int8_peak"].contains("amx_int8_gops_per_s"))
          r["fraction_of_amx_int8_peak"] = r["gflop_per_cpu_s"].get<double>() /
                                           (doc["int8_peak"]["amx_int8_gops_per_s"].get<double>() / double(pool.size()));
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
