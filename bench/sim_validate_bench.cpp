// essaim-sim against a real multi-process run of the same configuration (docs/scale.md, "Validated before
// believed"; bench/support/sim_validation.h says what runs on each side and what is calibrated): for every
// round trip × sequences cell, aggregate tok/s and p50 token latency measured over N essaim-worker processes
// behind delaying proxies (medians over --repeat rounds), the same from essaim-sim, and their ratios
// (simulated / measured). One calibration for all cells, on the spot: the median of one per round. Prints
// one JSON document; --check exits 1 when a cell misses the tolerance.
//
//   build/bench/sim_validate_bench --data-dir /tmp/essaim-bench                       # tiny synth, 8 layers
//   build/bench/sim_validate_bench --preset q35-122b --layers 2 --rtt-ms 5,20 --seqs 1,16 --decode 8
#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "decode_steps.h"
#include "median.h"
#include "sim_validation.h"
#include "worker_processes.h"

namespace essaim {
namespace {

using json = nlohmann::json;

struct Options {
  std::string model;
  std::string data_dir = "bench-data";
  std::string worker_bin, sim_bin;
  std::string preset = "tiny";
  uint32_t layers = 8;
  int workers = 4;
  int threads = 2;
  std::vector<int> seqs = {1, 16};
  std::vector<int> rtt_ms = {5, 20};
  int decode = 16;
  int repeat = 3;
  double sim_seconds = 60;
  int sim_cores = 0;
  double tolerance = 0.15;
  bool check = false;
};

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "sim_validate_bench: %s\n", what.c_str());
  std::exit(1);
}

template <typename T>
T must(Result<T> r) {
  if (!r) die(r.status().message());
  return std::move(*r);
}

// Each cell measured `repeat` times, the rounds one after another (load from elsewhere drifts over minutes, so
// every cell and the calibration see each period alike): the medians over the rounds of tok/s and of p50.
bench::RealCell median_cell(const std::vector<bench::RealCell>& rounds) {
  bench::RealCell m;
  m.cell = rounds.front().cell;
  std::vector<double> tok_s, p50, outside;
  for (const bench::RealCell& r : rounds) {
    tok_s.push_back(r.tok_s);
    p50.push_back(r.p50_s);
    outside.push_back(r.outside_calls_s);
    m.step_s.insert(m.step_s.end(), r.step_s.begin(), r.step_s.end());
  }
  m.tok_s = bench::median(tok_s);
  m.p50_s = bench::median(p50);
  m.outside_calls_s = bench::median(outside);
  return m;
}

// The workers' processes stay up for every cell (each cell puts its own proxies in front of them).
// Each round calibrates, then measures every cell; the simulation takes the median calibration.
json run_cells(const Options& o, const std::string& path, const Model& m, const std::vector<bench::WorkerProcess>& procs,
               ThreadPool& pool, bench::SimCalibration& cal, bool& all_within) {
  std::vector<bench::CellConfig> cells;
  for (int rtt : o.rtt_ms)
    for (int n : o.seqs) cells.push_back({.rtt_ms = rtt, .sequences = n});
  const int max_n = *std::max_element(o.seqs.begin(), o.seqs.end());
  std::vector<bench::SimCalibration> calibrations;
  std::vector<std::vector<bench::RealCell>> rounds(cells.size());
  for (int round = 0; round < o.repeat; ++round) {
    calibrations.push_back(must(bench::calibrate_for_sim(m, procs, pool, {.decode = o.decode}, std::max(max_n, 16))));
    for (size_t c = 0; c < cells.size(); ++c)
      rounds[c].push_back(must(bench::run_real_cell(m, procs, cells[c], pool, calibrations.back())));
  }
  cal = bench::median_calibration(calibrations);
  json out = json::array();
  for (size_t c = 0; c < cells.size(); ++c) {
    const bench::RealCell real = median_cell(rounds[c]);
    const json scenario = bench::validation_scenario(
        {.model_file = path, .workers = o.workers, .cell = cells[c], .host_cores = o.sim_cores,
         .sim_seconds = o.sim_seconds},
        cal);
    const json sim = must(bench::run_essaim_sim(o.sim_bin, scenario, o.data_dir));
    json row = bench::compare_cell(real, sim, o.tolerance);
    json per_round = json::array();
    for (const bench::RealCell& r : rounds[c]) per_round.push_back({{"tok_s", r.tok_s}, {"p50_ms", 1e3 * r.p50_s}});
    row["real"]["rounds"] = per_round;
    all_within = all_within && row["within"].get<bool>();
    std::fprintf(stderr, "sim_validate_bench: %d ms, %d sequences: real %.1f tok/s p50 %.1f ms, sim %.1f tok/s p50 %.1f ms\n",
                 cells[c].rtt_ms, cells[c].sequences, real.tok_s, 1e3 * real.p50_s, row["sim"]["tok_s"].get<double>(),
                 row["sim"]["p50_ms"].get<double>());
    out.push_back(row);
  }
  return out;
}

int run(const Options& o) {
  if (o.worker_bin.empty()) die("--worker-bin is required when the default path does not exist");
  const std::string path =
      o.model.empty() ? must(bench::ensure_synth_model(o.data_dir, o.preset, o.layers, "sim_validate_bench")) : o.model;
  const std::unique_ptr<Model> model = must(load_model(path));
  const Model& m = *model;
  const auto slices = must(bench::ensure_slices(m, path, o.workers, o.data_dir));
  {  // fault the mapping in: the timings should see RAM, not the disk
    const auto bytes = m.file().mapping().bytes();
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < bytes.size(); i += 4096) sink = sink + bytes[i];
  }
  std::vector<bench::WorkerProcess> procs;
  for (const auto& s : slices) procs.push_back(must(bench::start_worker(o.worker_bin, 1, s)));
  ThreadPool pool(size_t(o.threads));
  const double load_before = bench::load_average();
  bench::SimCalibration cal;
  bool all_within = true;
  const json cells = run_cells(o, path, m, procs, pool, cal, all_within);
  bench::stop_workers(procs);

  json doc = {{"benchmark", "sim_validate"},
              {"cpu", bench::cpu_name()},
              {"cores", std::thread::hardware_concurrency()},
              {"model", path},
              {"moe_layers", m.info().n_layer},
              {"n_expert", m.info().n_expert},
              {"n_expert_used", m.info().n_expert_used},
              {"n_embd", m.info().n_embd},
              {"workers", o.workers},
              {"worker_threads", 1},
              {"backbone_threads", pool.size()},
              {"timed_decode_steps", o.decode},
              {"rounds", o.repeat},
              {"sim_seconds", o.sim_seconds},
              {"sim_cores", o.sim_cores > 0 ? o.sim_cores : bench::host_cores()},
              {"load_average", {load_before, bench::load_average()}},
              {"calibration", cal.to_json()},
              {"cells", cells},
              {"tolerance", o.tolerance},
              {"all_within", all_within}};
  std::printf("%s\n", doc.dump(2).c_str());
  return o.check && !all_within ? 1 : 0;
}

}  // namespace
}  // namespace essaim

int main(int argc, char** argv) {
  essaim::Options o;
  o.worker_bin = essaim::bench::default_worker_binary(argv[0]);
  o.sim_bin = ESSAIM_SIM_BIN;
  CLI::App app{"essaim-sim's timing against a real run of the same configuration (workers behind delaying proxies)"};
  app.add_option("--model", o.model, "GGUF file (default: a synth qwen3moe, written once)");
  app.add_option("--preset", o.preset, "Synth preset when no --model: tiny (default) or q35-122b");
  app.add_option("--layers", o.layers, "Layers of the synth model (default 8)")->check(CLI::Range(1, 48));
  app.add_option("--data-dir", o.data_dir, "Where the model, its slices and the scenarios go (default ./bench-data)");
  app.add_option("--workers", o.workers, "Worker processes, 1 thread each (default 4)")->check(CLI::Range(1, 64));
  app.add_option("--worker-bin", o.worker_bin, "essaim-worker binary (default: <build>/src/cli/essaim-worker)");
  app.add_option("--sim-bin", o.sim_bin, "essaim-sim binary (default: the one built beside this bench)");
  app.add_option("--threads", o.threads, "Backbone threads (default 2)")->check(CLI::Range(1, 256));
  app.add_option("--seqs", o.seqs, "Concurrent sequences (default 1,16)")->delimiter(',')->check(CLI::Range(1, 1024));
  app.add_option("--rtt-ms", o.rtt_ms, "Round trips per request in ms (default 5,20)")->delimiter(',')->check(CLI::Range(1, 10000));
  app.add_option("--decode", o.decode, "Timed decode steps per cell and per calibration run (default 16)")->check(CLI::Range(1, 4096));
  app.add_option("--repeat", o.repeat, "Rounds of real measurements of every cell, medians over them (default 3)")
      ->check(CLI::Range(1, 100));
  app.add_option("--sim-seconds", o.sim_seconds, "Simulated decode seconds per cell (default 60)")->check(CLI::Range(1.0, 3600.0));
  app.add_option("--sim-cores", o.sim_cores, "Cores of the simulated machine (default: this machine's)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--tolerance", o.tolerance, "Largest |ratio - 1| a cell may have (default 0.15)")->check(CLI::Range(0.0, 10.0));
  app.add_flag("--check", o.check, "Exit 1 when a cell is outside the tolerance");
  CLI11_PARSE(app, argc, argv);
  return essaim::run(o);
}
