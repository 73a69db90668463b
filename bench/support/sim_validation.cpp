#include "sim_validation.h"

#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "backbone/remote_executor.h"
#include "median.h"

namespace essaim::bench {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// Times every call of the executor it wraps, counts the distinct experts each call asks for, and keeps the
// first activation row it sees of each layer (real activations for the expert timing below).
class TimedExpertExecutor final : public ExpertExecutor {
 public:
  explicit TimedExpertExecutor(ExpertExecutor& inner) : inner_(inner) {}
  Status compute(const ExpertBatch& batch, std::span<float> out) override {
    const auto t0 = Clock::now();
    Status s = inner_.compute(batch, out);
    call_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    std::set<int32_t> distinct;
    for (int32_t id : batch.ids)
      if (id >= 0) distinct.insert(id);
    call_experts.push_back(distinct.size());
    if (!first_row.count(batch.layer) && batch.n_rows > 0) {
      const size_t row = batch.act.size() / size_t(batch.n_rows);
      first_row[batch.layer] = {batch.act.begin(), batch.act.begin() + ptrdiff_t(row)};
    }
    return s;
  }
  bool may_fail() const override { return inner_.may_fail(); }

  std::vector<double> call_s;
  std::vector<size_t> call_experts;
  std::map<int32_t, std::vector<uint8_t>> first_row;  // layer -> one activation row

 private:
  ExpertExecutor& inner_;
};

struct DensePoint {
  double step_s = 0;       // median over the timed steps of (step time - time inside expert calls)
  double experts_per_call = 0;
};

// Per timed step, its time minus the time inside its expert calls (every forward pass makes the same number
// of calls: the prefill, the warm-up step, then the timed steps): the median, and the distinct experts per call.
Result<DensePoint> outside_expert_calls(const TimedExpertExecutor& timed, const BatchRun& run, int decode) {
  const size_t forwards = size_t(decode) + 2;
  if (timed.call_s.empty() || timed.call_s.size() % forwards != 0)
    return Status::error("calibration: the forward passes did not make the same number of expert calls");
  const size_t per = timed.call_s.size() / forwards;
  DensePoint p;
  std::vector<double> dense;
  double experts = 0;
  for (size_t j = 0; j < run.step_s.size(); ++j) {
    double inside = 0;
    for (size_t c = (2 + j) * per; c < (3 + j) * per; ++c) {
      inside += timed.call_s[c];
      experts += double(timed.call_experts[c]);
    }
    dense.push_back(std::max(0.0, run.step_s[j] - inside));
  }
  p.step_s = median(dense);
  p.experts_per_call = experts / double(run.step_s.size() * per);
  return p;
}

Result<DensePoint> dense_point(const Model& m, ThreadPool& pool, const BatchDecodeOptions& o, int n,
                               TimedExpertExecutor& timed, BatchRun& run) {
  timed.call_s.clear();
  timed.call_experts.clear();
  ESSAIM_ASSIGN_OR_RETURN(run, batch_decode(m, o, n, timed, nullptr, pool));
  return outside_expert_calls(timed, run, o.decode);
}

// Seconds per expert at `rows` rows each: k experts of `layer` (the next group of k each repetition) over
// `rows` copies of a real activation row, on one thread; the median of the repetitions.
double time_expert_rows(const Model& m, LocalExpertExecutor& one_thread, int32_t layer,
                        const std::vector<uint8_t>& act_row, int64_t rows, int32_t first_group) {
  const int32_t k = m.info().n_expert_used, X = m.info().n_expert;
  const int32_t groups = std::max(1, X / k);
  std::vector<uint8_t> act;
  for (int64_t r = 0; r < rows; ++r) act.insert(act.end(), act_row.begin(), act_row.end());
  std::vector<int32_t> ids(size_t(rows) * size_t(k));  // [rows][k]
  std::vector<float> out(size_t(rows) * size_t(k) * size_t(m.info().n_embd));
  const ExpertLayer* l = m.expert_store().any(layer);
  std::vector<double> reps;
  for (int rep = -1; rep < 7; ++rep) {  // one warm-up
    const int32_t g = (first_group + 3 * (rep + 1)) % groups;
    for (int64_t r = 0; r < rows; ++r)
      for (int32_t s = 0; s < k; ++s) ids[size_t(r) * size_t(k) + size_t(s)] = (g * k + s) % X;
    const auto t0 = Clock::now();
    const Status st = one_thread.compute({.layer = layer, .n_rows = rows, .k = k, .act_type = l->activation_type(),
                                          .act = act, .ids = ids}, out);
    if (!st) return -1;
    if (rep >= 0) reps.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return median(reps) / double(k);
}

Result<json> expert_cost_points(const Model& m, const std::map<int32_t, std::vector<uint8_t>>& first_row) {
  ThreadPool one(1);
  LocalExpertExecutor one_thread(m.expert_store(), &one);
  std::set<GgmlType> done;
  json points = json::array();
  for (const auto& [layer, row] : first_row) {
    const GgmlType down = m.expert_store().any(layer)->down.type;
    if (!done.insert(down).second) continue;
    for (int64_t rows : {1, 2, 4, 8, 16, 64}) {
      const double s = time_expert_rows(m, one_thread, layer, row, rows, 0);
      if (!(s > 0)) return Status::error("calibration: the expert timing batch of layer " + std::to_string(layer) + " failed");
      points.push_back({{"down_type", std::string(type_traits(down).name)}, {"rows_per_expert", rows},
                        {"seconds_per_expert", s}, {"layer", layer}});
    }
  }
  return json{{"what", "one worker thread's LocalExpertExecutor on k experts x r rows each (wall, median of 7)"},
              {"threads", 1},
              {"points", points}};
}

constexpr int kDenseRttMs = 1;

struct RemoteRun {
  BatchRun run;
  DensePoint outside;  // the step time outside the executor's calls
};

// batch_decode over the workers behind proxies at rtt_ms (none at 0), through a timing wrapper; refused
// unless the tokens equal `reference` (where it has the sequence) and nothing fell back.
// A RemoteExpertExecutor over `delayed` (the bench defaults: first replica, no hedging, no audits, a 60 s
// deadline), once every worker is connected.
Result<std::unique_ptr<backbone::RemoteExpertExecutor>> connected_executor(const Model& m, const DelayedWorkers& delayed,
                                                                            size_t workers, ThreadPool& pool) {
  backbone::DispatchOptions dopt;
  dopt.timeout = std::chrono::milliseconds(60000);
  dopt.link.connect_timeout = std::chrono::seconds(60);
  ESSAIM_ASSIGN_OR_RETURN(std::unique_ptr<backbone::RemoteExpertExecutor> remote,
                          backbone::remote_executor_for_model(m, delayed.map, &pool, dopt));
  for (int i = 0; i < 600 && remote->connected() < workers; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (remote->connected() != workers) return Status::error("not every worker connected: " + remote->stats().to_json());
  return remote;
}

Result<RemoteRun> remote_run(const Model& m, const std::vector<WorkerProcess>& procs, int rtt_ms, int n,
                             const BatchDecodeOptions& o, ThreadPool& pool,
                             const std::vector<std::vector<int32_t>>& reference) {
  ESSAIM_ASSIGN_OR_RETURN(DelayedWorkers delayed, behind_delay(procs, rtt_ms));
  ESSAIM_ASSIGN_OR_RETURN(std::unique_ptr<backbone::RemoteExpertExecutor> remote,
                          connected_executor(m, delayed, procs.size(), pool));
  TimedExpertExecutor timed(*remote);
  RemoteRun r;
  ESSAIM_ASSIGN_OR_RETURN(r.run, batch_decode(m, o, n, timed, remote.get(), pool));
  ESSAIM_ASSIGN_OR_RETURN(r.outside, outside_expert_calls(timed, r.run, o.decode));
  if (remote->stats().fallbacks() > 0) return Status::error("fallbacks in the real run: " + remote->stats().to_json());
  for (size_t i = 0; i < r.run.tokens.size() && i < reference.size(); ++i)
    if (r.run.tokens[i] != reference[i])
      return Status::error("sequence " + std::to_string(i) + " generated other tokens than the monolithic run");
  remote.reset();  // the links close before the proxies go
  return r;
}

// What a layer call costs beyond the injected round trip and the expert's compute (the proxy's threads
// waking, the request and the answer through both processes): calls of one expert on one row to each worker
// in turn over the proxies at kDenseRttMs, the median call minus that round trip and the calibrated cost of
// one expert on one row.
Result<double> call_overhead_s(const Model& m, const std::vector<WorkerProcess>& procs, ThreadPool& pool,
                               int32_t layer, const std::vector<uint8_t>& act_row, double one_expert_s) {
  ESSAIM_ASSIGN_OR_RETURN(DelayedWorkers delayed, behind_delay(procs, kDenseRttMs));
  ESSAIM_ASSIGN_OR_RETURN(std::unique_ptr<backbone::RemoteExpertExecutor> remote,
                          connected_executor(m, delayed, procs.size(), pool));
  const int32_t k = m.info().n_expert_used, X = m.info().n_expert;
  const ExpertLayer* l = m.expert_store().any(layer);
  std::vector<int32_t> ids(size_t(k), -1);  // [1][k]: one slot asked, the others not
  std::vector<float> out(size_t(k) * size_t(m.info().n_embd));
  std::vector<double> calls;
  const int n = 8 * int(procs.size());
  for (int c = -1; c < n; ++c) {  // one warm-up
    ids[0] = int32_t((int64_t(std::max(c, 0)) * X / n + X / (2 * n)) % X);  // spread over every worker's range
    const auto t0 = Clock::now();
    ESSAIM_RETURN_IF_ERROR(remote->compute({.layer = layer, .n_rows = 1, .k = k, .act_type = l->activation_type(),
                                            .act = act_row, .ids = ids}, out));
    if (c >= 0) calls.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  remote.reset();  // the links close before the proxies go
  return std::max(0.0, median(calls) - kDenseRttMs / 1e3 - one_expert_s);
}

}  // namespace

int host_cores() { return int(std::max(1u, std::thread::hardware_concurrency())); }

json SimCalibration::to_json() const {
  json dense = json::array();
  for (size_t i = 0; i < dense_sequences.size(); ++i)
    dense.push_back({{"sequences", dense_sequences[i]}, {"dense_ms_per_step", 1e3 * dense_step_s[i]}});
  return {{"backbone_layer_ms", layer_ms},
          {"backbone_row_us", row_us},
          {"dense_measured", dense},
          {"distinct_experts_per_layer_call", {{"measured", distinct_experts}, {"uniform", distinct_experts_uniform}}},
          {"expert_cost", expert_cost},
          {"monolithic_dense_ms_per_step_at_largest_batch", 1e3 * monolithic_dense_s},
          {"call_overhead_ms", call_overhead_ms},
          {"decode_steps", decode.decode},
          {"rounds", rounds}};
}

Result<SimCalibration> calibrate_for_sim(const Model& m, const std::vector<WorkerProcess>& procs, ThreadPool& pool,
                                         const BatchDecodeOptions& o, int max_n) {
  SimCalibration c;
  c.decode = o;
  // The reference tokens, the distinct experts per call and real activation rows: a monolithic run with the
  // experts on one thread.
  ThreadPool one(1);
  LocalExpertExecutor local(m.expert_store(), &one);
  TimedExpertExecutor timed(local);
  BatchRun mono;
  ESSAIM_ASSIGN_OR_RETURN(DensePoint p, dense_point(m, pool, o, max_n, timed, mono));
  c.distinct_experts = p.experts_per_call;
  c.monolithic_dense_s = p.step_s;
  c.reference_tokens = std::move(mono.tokens);
  // The dense path as it runs between the workers' answers: the step time outside the executor's calls over
  // the proxies at kDenseRttMs, a round trip that is none of the cells'. On a machine other sessions load,
  // the same work takes longer in a process that never sleeps (a monolithic run: 29.6 ms a step at 16
  // sequences of the 122B shape; directly connected: 25.7 ms) than in one that waits for the network
  // between layers (16.5 ms), as the scheduler favours a thread back from a sleep.
  for (int n : {1, max_n}) {
    if (!c.dense_sequences.empty() && n == c.dense_sequences.back()) break;
    ESSAIM_ASSIGN_OR_RETURN(RemoteRun r, remote_run(m, procs, kDenseRttMs, n, o, pool, c.reference_tokens));
    c.dense_sequences.push_back(n);
    c.dense_step_s.push_back(r.outside.step_s);
  }
  // dense per step = a + b·sequences, spread over the MoE layers (the simulation charges it per layer).
  const int moe_layers = m.info().n_layer;
  const double d1 = c.dense_step_s.front(), dn = c.dense_step_s.back();
  const double b = max_n > 1 ? std::max(0.0, (dn - d1) / double(max_n - 1)) : 0.0;
  const double a = std::max(0.0, d1 - b);
  c.layer_ms = 1e3 * a / double(moe_layers);
  c.row_us = 1e6 * b / double(moe_layers);
  const double X = double(m.info().n_expert), k = double(m.info().n_expert_used);
  c.distinct_experts_uniform = X * (1.0 - std::pow(1.0 - k / X, double(max_n)));
  ESSAIM_ASSIGN_OR_RETURN(c.expert_cost, expert_cost_points(m, timed.first_row));
  const auto& [layer, row] = *timed.first_row.begin();
  ESSAIM_ASSIGN_OR_RETURN(const double overhead, call_overhead_s(m, procs, pool, layer, row,
                                                                 c.expert_cost["points"][0]["seconds_per_expert"]));
  c.call_overhead_ms = 1e3 * overhead;
  return c;
}

SimCalibration median_calibration(const std::vector<SimCalibration>& rounds) {
  SimCalibration c = rounds.front();
  const auto median_of = [&](auto field) {
    std::vector<double> v;
    for (const SimCalibration& r : rounds) v.push_back(field(r));
    return median(v);
  };
  c.layer_ms = median_of([](const SimCalibration& r) { return r.layer_ms; });
  c.row_us = median_of([](const SimCalibration& r) { return r.row_us; });
  for (size_t i = 0; i < c.dense_step_s.size(); ++i)
    c.dense_step_s[i] = median_of([i](const SimCalibration& r) { return r.dense_step_s[i]; });
  c.distinct_experts = median_of([](const SimCalibration& r) { return r.distinct_experts; });
  c.call_overhead_ms = median_of([](const SimCalibration& r) { return r.call_overhead_ms; });
  c.monolithic_dense_s = median_of([](const SimCalibration& r) { return r.monolithic_dense_s; });
  json& points = c.expert_cost["points"];
  for (size_t i = 0; i < points.size(); ++i)
    points[i]["seconds_per_expert"] =
        median_of([i](const SimCalibration& r) { return r.expert_cost["points"][i]["seconds_per_expert"].get<double>(); });
  c.rounds = int(rounds.size());
  return c;
}

Result<RealCell> run_real_cell(const Model& m, const std::vector<WorkerProcess>& procs, const CellConfig& cell,
                               ThreadPool& pool, const SimCalibration& cal) {
  ESSAIM_ASSIGN_OR_RETURN(RemoteRun r, remote_run(m, procs, cell.rtt_ms, cell.sequences, cal.decode, pool,
                                                  cal.reference_tokens));
  return RealCell{.cell = cell, .tok_s = r.run.tokens_per_s(cell.sequences), .p50_s = median(r.run.step_s),
                  .step_s = r.run.step_s, .outside_calls_s = r.outside.step_s};
}

json validation_scenario(const SimSetup& s, const SimCalibration& cal) {
  const int cores = s.host_cores > 0 ? s.host_cores : host_cores();
  const double warmup_s = 3;
  // Loopback behind the proxies: the round trip is the proxy's plus the calibrated cost of a call through
  // them (the link's latency), bandwidth is not limited (1 Tbit/s here).
  const json process = {{"name", "process"}, {"share", 1}, {"budget_mb", 1 << 20}, {"speed", 1},
                        {"uplink_mbps", 1e6}, {"downlink_mbps", 1e6}, {"bandwidth_sigma", 0},
                        {"rtt_ms", s.cell.rtt_ms + cal.call_overhead_ms}, {"rtt_sigma", 0}, {"online_hours", 0}};
  return {{"workers", s.workers}, {"backbones", 1}, {"seed", 1}, {"hours", (warmup_s + s.sim_seconds) / 3600},
          {"warmup_s", warmup_s}, {"heartbeat_s", 1}, {"probe_every_s", 0}, {"probe_steps", 1'000'000},
          {"sequences", s.cell.sequences}, {"replicas", 1},
          {"backbone_layer_ms", cal.layer_ms}, {"backbone_row_us", cal.row_us}, {"backbone_rtt_ms", 0},
          {"backbone_mbps", 1e6}, {"deadline_ms", 60000}, {"hedge", false}, {"nearest", false}, {"audit", false},
          {"coverage_every_s", 1e6}, {"model_file", std::filesystem::absolute(s.model_file).string()},
          {"expert_cost", cal.expert_cost}, {"routing", "uniform"}, {"fixed_placement", true},
          {"shared_host_cores", cores}, {"classes", json::array({process})}};
}

Result<json> run_essaim_sim(const std::string& sim_bin, const json& scenario, const std::string& scratch_dir) {
  std::filesystem::create_directories(scratch_dir);
  const std::string file = scratch_dir + "/sim-scenario-" + std::to_string(scenario.value("sequences", 0)) + "-" +
                           std::to_string(scenario["classes"][0].value("rtt_ms", 0.0)) + ".json";
  std::ofstream(file) << scenario.dump(1);
  const std::string cmd = "'" + sim_bin + "' --scenario '" + file + "' --json";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return Status::error("cannot run " + sim_bin);
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = pclose(p);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return Status::error(sim_bin + " failed on " + file);
  json report = json::parse(out, nullptr, false);
  if (report.is_discarded() || !report.contains("tok_s")) return Status::error(sim_bin + ": no report on " + file);
  return report;
}

json compare_cell(const RealCell& real, const json& sim_report, double tolerance) {
  const double sim_tok_s = sim_report["tok_s"].get<double>();
  const double sim_p50 = sim_report["token_latency_s"]["p50"].get<double>();
  const double r_tok = real.tok_s > 0 ? sim_tok_s / real.tok_s : 0, r_p50 = real.p50_s > 0 ? sim_p50 / real.p50_s : 0;
  const bool within = std::abs(r_tok - 1) <= tolerance && std::abs(r_p50 - 1) <= tolerance;
  return {{"rtt_ms", real.cell.rtt_ms},
          {"sequences", real.cell.sequences},
          {"real", {{"tok_s", real.tok_s}, {"p50_ms", 1e3 * real.p50_s}, {"steps", real.step_s.size()},
                    {"outside_expert_calls_ms", 1e3 * real.outside_calls_s}}},
          {"sim", {{"tok_s", sim_tok_s}, {"p50_ms", 1e3 * sim_p50}, {"steps", sim_report["token_latency_s"]["steps"]}}},
          {"ratio", {{"tok_s", r_tok}, {"p50", r_p50}}},
          {"within", within}};
}

}  // namespace essaim::bench
