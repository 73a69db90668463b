// Benchmark helpers shared by dispatch_bench, batch_steps_bench and serve_bench: slices of every MoE layer
// cut into N expert ranges (written once into a data directory), `essaim-worker` processes on loopback, and
// CPU time.
//
//   ESSAIM_ASSIGN_OR_RETURN(auto slices, ensure_slices(model, path, 4, "bench-data"));   // [worker][slice]
//   ESSAIM_ASSIGN_OR_RETURN(WorkerProcess w, start_worker(worker_bin, 1, slices[0]));      // 127.0.0.1:<port>
//   stop_workers(procs);                                                                    // SIGTERM + wait
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backbone/expert_map.h"
#include "core/status.h"
#include "delay_proxy.h"
#include "model/model.h"

namespace essaim::bench {

// Slices of worker w: experts [w·X/N, (w+1)·X/N) of every MoE layer, one file per (layer, worker), written
// into data_dir once (reused while newer than the model; the directory name carries the model identity).
Result<std::vector<std::vector<std::string>>> ensure_slices(const Model& m, const std::string& model_path, int n,
                                                            const std::string& data_dir);

struct WorkerProcess {
  pid_t pid = -1;
  uint16_t port = 0;
  std::string address;  // 127.0.0.1:port
};

// Starts `essaim-worker --listen 127.0.0.1:0 --quiet --threads T --slice …` and waits (at most 120 s) for
// its "listening on" line.
// <build>/src/cli/essaim-worker beside the benchmark binary `argv0` (<build>/bench/X), or "" when absent.
std::string default_worker_binary(const char* argv0);
std::string default_cli_binary(const char* argv0, const std::string& name);  // the same for <build>/src/cli/NAME
Result<WorkerProcess> start_worker(const std::string& worker_bin, int threads, const std::vector<std::string>& slices);
// Any listener that prints "listening on HOST:PORT" on stdout once it accepts connections (essaim-worker,
// `essaim serve`): args[0] is the binary; waits at most 120 s for the line.
Result<WorkerProcess> start_listening(std::vector<std::string> args);
void stop_workers(const std::vector<WorkerProcess>& procs);  // SIGTERM, then waits for each

// The workers reached through one delay proxy each, rtt_ms per round trip (rtt/2 each way; no proxy at 0),
// and the expert map that names them; the proxies live as long as this.
struct DelayedWorkers {
  std::vector<std::unique_ptr<DelayProxy>> proxies;
  backbone::ExpertMap map;
};
Result<DelayedWorkers> behind_delay(const std::vector<WorkerProcess>& procs, int rtt_ms);

// CPU seconds (user + system) used so far by this process / by another one (/proc/PID/stat). On a machine
// shared with other work, CPU time is the stable measure of what a run costs.
double self_cpu_seconds();
double process_cpu_seconds(pid_t pid);
double workers_cpu_seconds(const std::vector<WorkerProcess>& procs);

}  // namespace essaim::bench
