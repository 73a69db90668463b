// How a backbone reaches its experts, and the executor that follows: with no worker the model's own
// LocalExpertExecutor (nothing changes); with workers or an expert map the RemoteExpertExecutor; with a
// coordinator the MarketExpertExecutor on its live map, with the hot-expert cache on its slice server
// (docs/dispatch.md, docs/market.md). run/eval/perplexity/serve fill a SwarmSetup from their swarm flags
// (cli/dispatch_flags.h); benchmarks build their backbone the same way (bench/fabric_bench).
//
//   SwarmSetup setup{.workers = {"10.0.0.7:9000"}};
//   ESSAIM_ASSIGN_OR_RETURN(ExecutorChoice ex, make_expert_executor(*model, &pool, setup, "essaim run"));
//   model->forward({... .experts = ex.executor.get() ...});
//   print_dispatch_stats(ex, "essaim run");                   // stderr, only when workers were given
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backbone/market_dispatch.h"
#include "backbone/remote_executor.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "moe/executor.h"

namespace essaim::backbone {

// What run/eval/perplexity/serve's swarm flags say (the flag of each field in its comment or name).
struct SwarmSetup {
  std::vector<std::string> workers;  // HOST:PORT or ws[s]://RELAY:PORT/node/NODE_ID (--worker, repeatable)
  std::string expert_map;            // JSON file (docs/dispatch.md)
  int64_t timeout_ms = kDefaultWorkerTimeout.count();
  bool verbose = false;              // log worker sessions to stderr
  uint32_t audit_every = 0;
  bool require_workers = false;      // a worker down or a layer uncovered at start is an error
  // The coverage market (docs/market.md): the expert map comes from the coordinator and is refreshed.
  std::string coordinator;           // https://HOST[:PORT] (http:// on loopback, or with insecure_http)
  bool insecure_http = false;        // --insecure-http
  std::string token;                 // this node's token: the market's, and the relay's for ws[s]:// workers
  int64_t map_refresh_ms = 1000;
  bool no_audit = false;             // with --coordinator: no adaptive audits (to measure their cost)
  std::string expert_output = "f32";  // f32 | bf16: the lean wire (docs/dispatch.md), local and remote alike
  std::string replica_choice = "nearest";  // nearest | first (map order)
  double hedge_factor = 3.0;               // hedge a request late by this × its worker's mean round trip; 0 = off
  std::string ca_file;               // an extra CA to trust for wss:// relays and an https:// coordinator
  // Any source of workers: the experts can be dispatched (what --backbone-file needs).
  bool has_swarm() const { return !workers.empty() || !expert_map.empty() || !coordinator.empty(); }
  // With --coordinator: the hot-expert cache's budget in MiB (0 = off), fetched from its slice server.
  double expert_cache_mb = 0;
  uint32_t expert_cache_window = 64;  // layer calls counted per layer
};

struct ExecutorChoice {
  std::unique_ptr<ExpertExecutor> executor;
  RemoteExpertExecutor* remote = nullptr;  // set when workers were given
  MarketExpertExecutor* market = nullptr;  // set with --coordinator
  bool dispatching() const { return remote != nullptr || market != nullptr; }
  std::vector<std::string> map_labels;     // the map's label of each worker (map order), may be ""
};

// The swarm at start, in a few lines: workers that did not connect, and the MoE layers with experts no
// connected worker may serve (computed on the backbone). Empty when everything is covered.
struct CoverageReport {
  std::vector<std::string> lines;
  bool complete = true;
};
CoverageReport swarm_coverage(const Model& model, const RemoteExpertExecutor& remote);

// Local when no worker, map or coordinator is given (with expert_output's rounding); otherwise connects to
// the workers (waiting up to the connect timeout for each), prints on stderr how many are up, which did not
// connect and which layers no worker covers (once, at start), and returns the dispatcher — or, with
// require_workers, an error when anything is missing. `who` prefixes every line it prints.
Result<ExecutorChoice> make_expert_executor(const Model& model, ThreadPool* pool, const SwarmSetup& setup,
                                            const char* who);

// The dispatcher's summary (requests, fallbacks by reason, bytes, per-worker pairs, named by the HELLO's
// label or else the map's) on stderr.
void print_dispatch_stats(const ExecutorChoice& choice, const char* who);
DispatchStats labelled_stats(const ExecutorChoice& choice);

}  // namespace essaim::backbone
