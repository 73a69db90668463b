#include "cli/dispatch_flags.h"

#include <cstdio>
#include <sstream>

namespace essaim::cli {

void add_dispatch_flags(CLI::App& cmd, DispatchFlags& f) {
  cmd.add_option("--worker", f.workers, "Expert worker HOST:PORT to dispatch to (repeatable; holdings learned at "
                                        "the handshake; earlier workers are preferred for shared experts)");
  cmd.add_option("--expert-map", f.expert_map, "JSON expert map: workers and, optionally, what to route to each")
      ->check(CLI::ExistingFile);
  cmd.add_option("--worker-timeout-ms", f.timeout_ms,
                 "Deadline of every remote layer call; a missing answer is computed locally (default 2000)")
      ->check(CLI::Range(int64_t(1), int64_t(3'600'000)));
  cmd.add_option("--worker-audit", f.audit_every,
                 "Recompute every Nth worker answer locally and drop a worker that disagrees (0 = off)");
  cmd.add_flag("--worker-log", f.verbose, "Log worker connections and failures to stderr");
}

Result<ExecutorChoice> make_expert_executor(const Model& model, ThreadPool* pool, const DispatchFlags& f,
                                            const char* who) {
  ExecutorChoice choice;
  if (f.workers.empty() && f.expert_map.empty()) {
    choice.executor = std::make_unique<LocalExpertExecutor>(model.expert_store(), pool);
    return choice;
  }
  backbone::ExpertMap map;
  if (!f.expert_map.empty()) {
    ESSAIM_ASSIGN_OR_RETURN(map, backbone::expert_map_load(f.expert_map));
  }
  ESSAIM_ASSIGN_OR_RETURN(backbone::ExpertMap flagged, backbone::expert_map_from_addresses(f.workers));
  for (backbone::WorkerEndpoint& w : flagged.workers) map.workers.push_back(std::move(w));

  backbone::DispatchOptions options;
  options.timeout = std::chrono::milliseconds(f.timeout_ms);
  options.audit_every = f.audit_every;
  if (f.verbose) {
    const std::string prefix = std::string(who) + ": ";
    options.link.log = [prefix](const std::string& line) { std::fprintf(stderr, "%s%s\n", prefix.c_str(), line.c_str()); };
  }
  ESSAIM_ASSIGN_OR_RETURN(std::unique_ptr<backbone::RemoteExpertExecutor> remote,
                          backbone::remote_executor_for_model(model, map, pool, std::move(options)));
  const backbone::DispatchStats s = remote->stats();
  std::fprintf(stderr, "%s: %zu of %zu worker%s connected, deadline %lld ms\n", who, remote->connected(),
               s.workers.size(), s.workers.size() == 1 ? "" : "s", (long long)f.timeout_ms);
  for (const backbone::WorkerReport& w : s.workers)
    if (!w.connected) std::fprintf(stderr, "%s: worker %s is down (%s); its experts are computed locally until it "
                                   "comes back\n", who, w.address.c_str(), w.last_error.c_str());
  choice.remote = remote.get();
  choice.executor = std::move(remote);
  return choice;
}

void print_dispatch_stats(const ExecutorChoice& choice, const char* who) {
  if (choice.remote == nullptr) return;
  std::istringstream lines(choice.remote->stats().to_text());
  for (std::string line; std::getline(lines, line);) std::fprintf(stderr, "%s: %s\n", who, line.c_str());
}

}  // namespace essaim::cli
