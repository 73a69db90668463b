// The backbone on the coverage market: an ExpertExecutor that dispatches through a RemoteExpertExecutor
// built from the coordinator's live expert map, and takes a new one whenever the map changes — between
// layer calls, so every call is served by one consistent set of workers and stays exact (pairs of a worker
// that vanished fall back to the replica, as always). It also reports, from its own counters, the router's
// picks (POST /api/expert-usage) and the pairs each worker's answers were accepted for, with the audits
// run on them (POST /api/work).
//
//   MarketHooks hooks{.fetch_map = [&] { return client.expert_map(); },
//                     .report_usage = [&](auto& u) { return client.report_usage(u); },
//                     .report_work = [&](auto& w) { return client.report_work(w); }};
//   ESSAIM_ASSIGN_OR_RETURN(auto ex, MarketExpertExecutor::create(*model, &pool, hooks, {.n_experts = 128}));
//   model->forward({... .experts = ex.get() ...});
//   ex->flush_reports();                       // the last counts (the destructor does it too)
//
// The map is fetched in the background every `refresh`; a changed map's executor is built (and its links
// given up to the connect timeout) off the inference thread, then swapped in at the next layer call.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backbone/remote_executor.h"
#include "core/status.h"

namespace essaim::backbone {

struct UsageReport {  // router picks of one layer since the last report
  uint32_t layer = 0;
  std::vector<uint64_t> counts;  // n_experts entries
};

struct WorkDelta {  // per worker address, since the last report
  std::string address;
  uint64_t pairs_accepted = 0;
  uint64_t audits = 0;
  uint64_t audits_failed = 0;
};

struct MarketHooks {
  std::function<Result<std::string>()> fetch_map;  // the expert-map JSON text
  std::function<Status(const std::vector<UsageReport>&)> report_usage;
  std::function<Status(const std::vector<WorkDelta>&)> report_work;
  std::function<void(const std::string&)> log;     // map changes, report failures; may be null
};

struct MarketDispatchOptions {
  uint32_t n_experts = 0;                     // router width (usage vectors); from the catalogue
  std::chrono::milliseconds refresh{1000};    // how often the map is fetched
  std::chrono::milliseconds report{5000};     // how often usage and work are reported
  DispatchOptions dispatch;                   // for each executor built from a map
  // The hot-expert cache every executor built from a map shares (its dispatch.hot_cache is set to it), owned
  // here so it outlives them all and keeps its counts across map changes; stats() carries its report.
  std::shared_ptr<HotExpertCache> hot_cache;
};

class MarketExpertExecutor final : public ExpertExecutor {
 public:
  // Fetches the map once (an error if the coordinator cannot be reached or the map is malformed), builds
  // the first executor, then starts refreshing.
  static Result<std::unique_ptr<MarketExpertExecutor>> create(const Model& model, ThreadPool* pool, MarketHooks hooks,
                                                              MarketDispatchOptions options);
  ~MarketExpertExecutor() override;  // stops refreshing, reports the last counts

  Status compute(const ExpertBatch& batch, std::span<float> out) override;
  // As RemoteExpertExecutor's (every map's executor and the local one share the model's store).
  bool may_fail() const override;

  // Every executor's counters summed: layer totals, and per worker address (first-seen order).
  DispatchStats stats() const;
  uint64_t maps_taken() const { return maps_taken_.load(); }  // executors swapped in, the first included
  std::string map_text() const;                                // the map now dispatched to
  // Blocks until a map with at least `workers` workers is dispatched to, all connected, or the deadline.
  bool wait_for_workers(size_t workers, std::chrono::milliseconds timeout);
  Status flush_reports();
  HotExpertCache* hot_cache() const { return options_.hot_cache.get(); }
  // f's answer for the executor of the map the next layer call dispatches to (null while the map is empty),
  // called while it cannot be retired (/health's reason, cli/cmd_serve.cpp).
  std::optional<std::string> ask_current(
      const std::function<std::optional<std::string>(const RemoteExpertExecutor*)>& f) const;

 private:
  MarketExpertExecutor(const Model& model, ThreadPool* pool, MarketHooks hooks, MarketDispatchOptions options);
  void refresh_loop();
  Status take_map(const std::string& text);  // builds the executor for a map text (not under call_mu_)
  void fold(const DispatchStats& s);         // adds a retired executor's counters to retired_

  const Model& model_;
  ThreadPool* pool_;
  MarketHooks hooks_;
  MarketDispatchOptions options_;
  LocalExpertExecutor local_;  // while the map is empty (declared after options_: built from its output mode)

  std::mutex call_mu_;  // one layer call at a time; guards current_
  std::unique_ptr<RemoteExpertExecutor> current_;
  mutable std::mutex state_mu_;  // guards the fields below
  std::unique_ptr<RemoteExpertExecutor> pending_;
  std::string pending_text_, current_text_, fetched_text_;
  bool swap_pending_ = false;  // pending_ (possibly null: an empty map) replaces current_ at the next call
  std::vector<std::unique_ptr<RemoteExpertExecutor>> retired_executors_;  // destroyed on the refresh thread
  DispatchStats retired_;                                   // counters of executors swapped out
  std::vector<std::vector<uint64_t>> usage_;                // [layer][expert] since last report
  std::map<std::string, WorkDelta> reported_;               // per address: totals already reported
  std::atomic<uint64_t> maps_taken_{0};

  std::mutex report_mu_;  // one report at a time
  std::mutex wake_mu_;
  std::condition_variable wake_;
  bool stopping_ = false;  // guarded by wake_mu_
  std::thread refresher_;
};

}  // namespace essaim::backbone
