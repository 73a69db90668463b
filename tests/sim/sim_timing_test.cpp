// essaim-sim's timing validated against a real multi-process run (docs/scale.md, "Validated before
// believed"), on the small scenario where the round trip dominates: the tiny synth qwen3moe (8 MoE layers),
// 4 essaim-worker processes behind delaying proxies at 20 ms, one sequence. Calibrated on the spot
// (bench/support/sim_validation.h); medians of 24 timed steps (tok/s as sequences / median step). The
// simulated tok/s and p50 token latency must be within 15 % of the measured ones, and a simulator whose
// timing model is broken (the round trip doubled in the simulation only) must miss, so the comparison can
// fail. Up to 3 measurements, any one within passing; ctest runs it alone (RUN_SERIAL).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "batch_decode.h"
#include "sim_validation.h"
#include "temp_dir.h"
#include "worker_processes.h"

namespace essaim {
namespace {

using json = nlohmann::json;

// Stops whatever workers are left when the test ends early.
struct WorkersGuard {
  std::vector<bench::WorkerProcess> procs;
  ~WorkersGuard() { stop(); }
  void stop() {
    bench::stop_workers(procs);
    procs.clear();
  }
};

TEST(SimTiming, FourWorkersAt20msOneSequenceAgreeWithTheRealRun) {
  const std::filesystem::path dir = testing::make_temp_dir("essaim-sim-timing");
  Result<std::string> path = bench::ensure_synth_model(dir.string(), "tiny", 8, "sim_timing_test");
  ASSERT_TRUE(path) << path.status().message();
  Result<std::unique_ptr<Model>> model = load_model(*path);
  ASSERT_TRUE(model) << model.status().message();
  const Model& m = **model;
  constexpr int kWorkers = 4;
  Result<std::vector<std::vector<std::string>>> slices = bench::ensure_slices(m, *path, kWorkers, dir.string());
  ASSERT_TRUE(slices) << slices.status().message();
  WorkersGuard workers;
  for (const auto& s : *slices) {
    Result<bench::WorkerProcess> w = bench::start_worker(ESSAIM_WORKER_BIN, 1, s);
    ASSERT_TRUE(w) << w.status().message();
    workers.procs.push_back(*w);
  }
  ThreadPool pool(2);
  const bench::CellConfig cell{.rtt_ms = 20, .sequences = 1};
  // Up to 3 measurements (each calibrated afresh): a shared CI machine can starve the 4 workers for a
  // whole measurement (other tests, other jobs), which no model of this machine predicts. Any one within
  // 15 % passes; the broken simulation below is compared with the last, and misses by ~1.9x.
  json row, scenario;
  bench::RealCell robust;
  for (int attempt = 0; attempt < 3 && !(row.is_object() && row["within"].get<bool>()); ++attempt) {
    Result<bench::SimCalibration> cal = bench::calibrate_for_sim(m, workers.procs, pool, {.decode = 24}, 1);
    ASSERT_TRUE(cal) << cal.status().message();
    Result<bench::RealCell> real = bench::run_real_cell(m, workers.procs, cell, pool, *cal);
    ASSERT_TRUE(real) << real.status().message();
    // tok/s from the median step (N / p50) rather than the mean: on a shared CI machine one descheduled step
    // moves the mean of 24 by several percent, and the simulation has no such outliers.
    robust = *real;
    robust.tok_s = double(cell.sequences) / real->p50_s;
    scenario = bench::validation_scenario({.model_file = *path, .workers = kWorkers, .cell = cell}, *cal);
    Result<json> sim = bench::run_essaim_sim(ESSAIM_SIM_BIN, scenario, dir.string());
    ASSERT_TRUE(sim) << sim.status().message();
    row = bench::compare_cell(robust, *sim, 0.15);
    std::printf("attempt %d, measured and simulated: %s\ncalibration %s\n", attempt + 1, row.dump().c_str(),
                cal->to_json().dump().c_str());
    EXPECT_GT((*sim)["token_latency_s"]["steps"].get<int>(), 100);  // the simulated median is over many steps
  }
  workers.stop();
  EXPECT_TRUE(row["within"].get<bool>()) << row.dump();

  // The same simulation with its round trip doubled (the real run unchanged) must fall outside.
  scenario["classes"][0]["rtt_ms"] = scenario["classes"][0]["rtt_ms"].get<double>() + cell.rtt_ms;
  Result<json> broken = bench::run_essaim_sim(ESSAIM_SIM_BIN, scenario, dir.string());
  ASSERT_TRUE(broken) << broken.status().message();
  const json broken_row = bench::compare_cell(robust, *broken, 0.15);
  EXPECT_FALSE(broken_row["within"].get<bool>()) << broken_row.dump();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace essaim
