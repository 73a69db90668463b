// essaim-sim's timing against a real multi-process run (docs/scale.md, "Validated before believed"): the
// same small configuration run for real — N `essaim-worker` processes behind one DelayProxy each, the real
// RemoteExpertExecutor driven by the serve scheduler's batched decode loop (batch_decode.h) — and simulated
// by essaim-sim with the model's shape read from the same GGUF file, the harness's placement, the proxies'
// round trip, every process computing on one host of this machine's cores, and costs calibrated here, on
// the spot, once for all cells:
//  - the backbone's dense path: decode steps over the same workers behind proxies at 1 ms (a round trip
//    none of the cells has) at 1 and at the largest batch, with a timing wrapper around the executor; step
//    time minus the time inside its calls, fitted as layer_ms + row_us × sequences per MoE layer (the same
//    split of a monolithic run, which never waits, gave nearly twice as much on this loaded machine: it is
//    reported, not used);
//  - the expert FFN: one worker thread's LocalExpertExecutor (what essaim-worker --threads 1 runs) on k
//    experts × r rows per expert, per down type, as seconds per expert at r rows (data/expert_cost.json's
//    format). Timed alone: a calibration timed with every core doing the same at once (the workers of a
//    layer call compute together) made the simulation 30-60 % slow on this loaded machine, as the cores'
//    sharing then counts twice (in the measured cost and in the simulated host); docs/scale.md.
//  - the transport: calls of one expert on one row to each worker over the proxies at 1 ms; the median
//    call minus that millisecond and one expert's cost is a call's overhead, added to the simulated links'
//    round trip (on a machine this loaded, a proxy's thread can wait milliseconds to be scheduled).
// Shared by bench/sim_validate_bench and tests/sim/sim_timing_test.
//
//   ESSAIM_ASSIGN_OR_RETURN(SimCalibration cal, calibrate_for_sim(model, procs, pool, {.decode = 8}, 16));
//   ESSAIM_ASSIGN_OR_RETURN(RealCell real, run_real_cell(model, procs, {.rtt_ms = 20, .sequences = 1}, pool, cal));
//   json scenario = validation_scenario({.model_file = path, .workers = 4, .cell = {20, 1}}, cal);
//   ESSAIM_ASSIGN_OR_RETURN(json sim, run_essaim_sim(sim_bin, scenario, scratch_dir));
//   json row = compare_cell(real, sim, 0.15);    // ratios sim / real of tok/s and p50, "within"
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "batch_decode.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "worker_processes.h"

namespace essaim::bench {

int host_cores();  // std::thread::hardware_concurrency(), at least 1

struct SimCalibration {
  double layer_ms = 0, row_us = 0;      // the dense path per MoE layer: layer_ms + row_us × sequences (wall)
  nlohmann::json expert_cost;           // {"what", "points": [{down_type, rows_per_expert, seconds_per_expert}]}
  std::vector<int> dense_sequences;     // the batches measured, and the dense seconds per step at each
  std::vector<double> dense_step_s;
  double monolithic_dense_s = 0;        // the same split of a monolithic run at the largest batch
  // A layer call's cost beyond the injected round trip and the compute (the proxy's threads waking, the
  // request and answer through both processes), added to every simulated link's round trip.
  double call_overhead_ms = 0;
  double distinct_experts = 0;          // per layer call at the largest batch, measured
  double distinct_experts_uniform = 0;  // what uniform routing gives there (the simulation's routing)
  BatchDecodeOptions decode;
  std::vector<std::vector<int32_t>> reference_tokens;  // monolithic tokens of the largest batch
  int rounds = 1;                       // calibrations this is the median of
  nlohmann::json to_json() const;       // everything but the tokens
};

// A monolithic run of max_n sequences (the reference tokens, real activation rows), runs over `procs`
// behind proxies at 1 ms at 1 and max_n sequences (the dense path, `pool`'s threads), then the expert FFN on
// one thread. The machine's load counts in all, as it does in the real run measured beside it.
Result<SimCalibration> calibrate_for_sim(const Model& m, const std::vector<WorkerProcess>& procs, ThreadPool& pool,
                                         const BatchDecodeOptions& o, int max_n);

// Parameter by parameter, the median of calibrations made at different times (the dense path's per-layer and
// per-row costs, every expert cost point); the tokens and the rest from the first. Needs at least one.
SimCalibration median_calibration(const std::vector<SimCalibration>& rounds);

struct CellConfig {
  int rtt_ms = 20;
  int sequences = 1;
};

struct RealCell {
  CellConfig cell;
  double tok_s = 0, p50_s = 0;
  std::vector<double> step_s;
  // Median over the steps of the step time outside the executor's calls: the backbone's dense path as it
  // ran here (beside the calibration's, measured in a monolithic run).
  double outside_calls_s = 0;
};

// The workers behind one proxy each at the cell's round trip, a RemoteExpertExecutor over them (the bench
// defaults: first replica, no hedging, no audits, a 60 s deadline), batch_decode of the cell's sequences.
// Refused unless every sequence's tokens equal the monolithic ones and nothing fell back.
Result<RealCell> run_real_cell(const Model& m, const std::vector<WorkerProcess>& procs, const CellConfig& cell,
                               ThreadPool& pool, const SimCalibration& cal);

struct SimSetup {
  std::string model_file;
  int workers = 4;
  CellConfig cell;
  int host_cores = 0;        // the machine's cores (0: std::thread::hardware_concurrency())
  double sim_seconds = 60;   // simulated decode time after a 3 s warm-up (the step medians settle)
};
nlohmann::json validation_scenario(const SimSetup& s, const SimCalibration& cal);

// Runs `sim_bin --scenario <scratch_dir>/<file> --json` and parses its report.
Result<nlohmann::json> run_essaim_sim(const std::string& sim_bin, const nlohmann::json& scenario,
                                      const std::string& scratch_dir);

// {"rtt_ms", "sequences", "real": {tok_s, p50_ms}, "sim": {tok_s, p50_ms}, "ratio": {tok_s, p50}, "within"}:
// ratios are simulated / measured; within when both are within `tolerance` of 1.
nlohmann::json compare_cell(const RealCell& real, const nlohmann::json& sim_report, double tolerance);

}  // namespace essaim::bench
