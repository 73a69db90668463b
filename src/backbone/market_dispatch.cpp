#include "backbone/market_dispatch.h"

#include <algorithm>

#include "backbone/expert_map.h"
#include "backbone/hot_expert_cache.h"
#include "model/model.h"

namespace essaim::backbone {
namespace {

using Clock = std::chrono::steady_clock;

// What makes two maps the same for dispatch: worker addresses, their order and declared holdings (labels
// and the coordinator's generation counter do not change who is asked for what).
std::string map_key(const ExpertMap& m) {
  std::string k;
  for (const WorkerEndpoint& w : m.workers) {
    k += w.address + "[";
    if (w.holdings) {
      for (const proto::Holding& h : *w.holdings) {
        k += std::to_string(h.layer) + ":" + std::to_string(h.first_expert) + "+" + std::to_string(h.expert_count) + ",";
      }
    } else {
      k += "*";
    }
    k += "]";
  }
  return k;
}

void add_stats(DispatchStats& into, const DispatchStats& s) {
  into.layer_calls += s.layer_calls;
  into.pairs += s.pairs;
  into.pairs_remote += s.pairs_remote;
  into.pairs_local += s.pairs_local;
  into.pairs_fallback += s.pairs_fallback;
  into.pairs_cached += s.pairs_cached;
  into.calls_from_cache += s.calls_from_cache;
  into.requests += s.requests;
  into.responses += s.responses;
  into.audits += s.audits;
  into.pairs_retried += s.pairs_retried;
  into.calls_failed += s.calls_failed;
  for (size_t i = 0; i < kFallbackReasonCount; ++i) {
    into.fallback_requests[i] += s.fallback_requests[i];
    into.fallback_pairs[i] += s.fallback_pairs[i];
  }
  if (into.layers.size() < s.layers.size()) into.layers.resize(s.layers.size());
  for (size_t l = 0; l < s.layers.size(); ++l) {
    into.layers[l].calls += s.layers[l].calls;
    into.layers[l].requests += s.layers[l].requests;
    into.layers[l].bytes_sent += s.layers[l].bytes_sent;
    into.layers[l].bytes_received += s.layers[l].bytes_received;
  }
  for (const WorkerReport& w : s.workers) {
    auto it = std::find_if(into.workers.begin(), into.workers.end(),
                           [&](const WorkerReport& x) { return x.address == w.address; });
    if (it == into.workers.end()) {
      into.workers.push_back(w);
      continue;
    }
    it->label = w.label.empty() ? it->label : w.label;
    it->connected = w.connected;
    it->sessions += w.sessions;
    it->requests += w.requests;
    it->pairs_served += w.pairs_served;
    it->failures += w.failures;
    it->audits += w.audits;
    it->audits_failed += w.audits_failed;
    if (!w.last_error.empty()) it->last_error = w.last_error;
  }
  into.seconds += s.seconds;
  into.max_call_seconds = std::max(into.max_call_seconds, s.max_call_seconds);
}

}  // namespace

MarketExpertExecutor::MarketExpertExecutor(const Model& model, ThreadPool* pool, MarketHooks hooks,
                                           MarketDispatchOptions options)
    : model_(model), pool_(pool), hooks_(std::move(hooks)), options_(std::move(options)),
      local_(model.expert_store(), pool, options_.dispatch.expert_output) {  // the mode holds before any map too
  options_.dispatch.hot_cache = options_.hot_cache.get();
}

Result<std::unique_ptr<MarketExpertExecutor>> MarketExpertExecutor::create(const Model& model, ThreadPool* pool,
                                                                           MarketHooks hooks,
                                                                           MarketDispatchOptions options) {
  if (!hooks.fetch_map) return Status::error("the market executor needs a way to fetch the expert map");
  std::unique_ptr<MarketExpertExecutor> ex(new MarketExpertExecutor(model, pool, std::move(hooks), std::move(options)));
  ESSAIM_ASSIGN_OR_RETURN(std::string text, ex->hooks_.fetch_map());
  ESSAIM_RETURN_IF_ERROR(ex->take_map(text));
  ex->refresher_ = std::thread([p = ex.get()] { p->refresh_loop(); });
  return ex;
}

MarketExpertExecutor::~MarketExpertExecutor() {
  {
    std::lock_guard lock(wake_mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (refresher_.joinable()) refresher_.join();
  (void)flush_reports();
}

Status MarketExpertExecutor::take_map(const std::string& text) {
  {
    std::lock_guard lock(state_mu_);
    fetched_text_ = text;
  }
  ESSAIM_ASSIGN_OR_RETURN(ExpertMap map, expert_map_parse(text));
  const std::string key = map_key(map);
  {
    std::lock_guard lock(state_mu_);
    if (key == (swap_pending_ ? pending_text_ : current_text_) && maps_taken_ > 0) return Status::ok();
  }
  std::unique_ptr<RemoteExpertExecutor> next;
  if (!map.workers.empty()) {
    ESSAIM_ASSIGN_OR_RETURN(next, remote_executor_for_model(model_, map, pool_, options_.dispatch));
  }
  if (hooks_.log) {
    hooks_.log("expert map: " + std::to_string(map.workers.size()) + " worker(s)" +
               (next ? ", " + std::to_string(next->connected()) + " connected" : ""));
  }
  std::lock_guard lock(state_mu_);
  if (pending_) retired_executors_.push_back(std::move(pending_));  // never used: nothing to fold
  pending_ = std::move(next);  // null for an empty map: the swap then installs "no executor" (all local)
  pending_text_ = key;
  if (maps_taken_ == 0) {
    current_ = std::move(pending_);
    current_text_ = key;
    pending_text_.clear();
    maps_taken_ = 1;
  } else {
    swap_pending_ = true;
  }
  return Status::ok();
}

void MarketExpertExecutor::fold(const DispatchStats& s) { add_stats(retired_, s); }

Status MarketExpertExecutor::compute(const ExpertBatch& b, std::span<float> out) {
  std::lock_guard call_lock(call_mu_);
  {
    std::lock_guard lock(state_mu_);
    if (swap_pending_) {
      if (current_) {
        fold(current_->stats());
        retired_executors_.push_back(std::move(current_));
      }
      current_ = std::move(pending_);
      current_text_ = pending_text_;
      pending_text_.clear();
      swap_pending_ = false;
      ++maps_taken_;
    }
    if (options_.n_experts > 0 && b.layer >= 0) {
      if (usage_.size() <= size_t(b.layer)) usage_.resize(size_t(b.layer) + 1);
      std::vector<uint64_t>& u = usage_[size_t(b.layer)];
      if (u.empty()) u.assign(options_.n_experts, 0);
      for (int32_t id : b.ids)
        if (id >= 0 && uint32_t(id) < options_.n_experts) ++u[size_t(id)];
    }
  }
  // current_ changes only here, under call_mu_: safe to use without state_mu_.
  if (current_) return current_->compute(b, out);
  return local_.compute(b, out);
}

bool MarketExpertExecutor::may_fail() const { return model_.expert_store().shape_only(); }

std::optional<std::string> MarketExpertExecutor::ask_current(
    const std::function<std::optional<std::string>(const RemoteExpertExecutor*)>& f) const {
  std::lock_guard lock(state_mu_);  // the executors are retired (and destroyed) under it
  return f(swap_pending_ ? pending_.get() : current_.get());  // the map the next call takes
}

DispatchStats MarketExpertExecutor::stats() const {
  std::lock_guard lock(state_mu_);
  DispatchStats s = retired_;
  if (current_) {
    DispatchStats now = current_->stats();
    for (WorkerReport& w : s.workers) w.connected = false;  // the current executor says who is up
    add_stats(s, now);
  }
  if (options_.hot_cache) s.hot = options_.hot_cache->report();
  return s;
}

std::string MarketExpertExecutor::map_text() const {
  std::lock_guard lock(state_mu_);
  return fetched_text_;
}

bool MarketExpertExecutor::wait_for_workers(size_t workers, std::chrono::milliseconds timeout) {
  const auto until = Clock::now() + timeout;
  while (true) {
    {
      std::lock_guard lock(state_mu_);
      const RemoteExpertExecutor* ex = swap_pending_ ? pending_.get() : current_.get();
      if (ex != nullptr && ex->stats().workers.size() >= workers && ex->connected() >= workers) return true;
    }
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

Status MarketExpertExecutor::flush_reports() {
  std::lock_guard report_lock(report_mu_);
  std::vector<UsageReport> usage;
  std::vector<WorkDelta> work;
  {
    std::lock_guard lock(state_mu_);
    for (size_t l = 0; l < usage_.size(); ++l) {
      if (usage_[l].empty()) continue;
      usage.push_back({uint32_t(l), std::move(usage_[l])});
      usage_[l].clear();
    }
  }
  const DispatchStats s = stats();
  for (const WorkerReport& w : s.workers) {
    WorkDelta& seen = reported_[w.address];
    WorkDelta d{w.address, w.pairs_served - std::min(w.pairs_served, seen.pairs_accepted),
                w.audits - std::min(w.audits, seen.audits), w.audits_failed - std::min(w.audits_failed, seen.audits_failed)};
    if (d.pairs_accepted == 0 && d.audits == 0 && d.audits_failed == 0) continue;
    work.push_back(d);
  }
  Status result = Status::ok();
  if (!usage.empty() && hooks_.report_usage) {
    if (Status st = hooks_.report_usage(usage); !st) {
      result = st;
      std::lock_guard lock(state_mu_);  // kept for the next report
      for (UsageReport& u : usage) {
        if (usage_.size() <= u.layer) usage_.resize(u.layer + 1);
        if (usage_[u.layer].empty()) usage_[u.layer].assign(u.counts.size(), 0);
        for (size_t e = 0; e < u.counts.size() && e < usage_[u.layer].size(); ++e) usage_[u.layer][e] += u.counts[e];
      }
    }
  }
  if (!work.empty() && hooks_.report_work) {
    if (Status st = hooks_.report_work(work); !st) {
      result = st;
    } else {
      for (const WorkDelta& d : work) {
        WorkDelta& seen = reported_[d.address];
        seen.pairs_accepted += d.pairs_accepted;
        seen.audits += d.audits;
        seen.audits_failed += d.audits_failed;
      }
    }
  }
  if (!result && hooks_.log) hooks_.log("market report: " + result.message());
  return result;
}

void MarketExpertExecutor::refresh_loop() {
  auto next_report = Clock::now() + options_.report;
  while (true) {
    {
      std::unique_lock lock(wake_mu_);
      if (wake_.wait_for(lock, options_.refresh, [&] { return stopping_; })) return;
    }
    Result<std::string> text = hooks_.fetch_map();
    if (!text) {
      if (hooks_.log) hooks_.log("expert map: " + text.status().message() + " (keeping the current one)");
    } else if (*text != map_text()) {
      if (Status st = take_map(*text); !st && hooks_.log) hooks_.log("expert map refused: " + st.message());
    }
    if (Clock::now() >= next_report) {
      (void)flush_reports();
      next_report = Clock::now() + options_.report;
    }
    std::vector<std::unique_ptr<RemoteExpertExecutor>> gone;
    {
      std::lock_guard lock(state_mu_);
      gone.swap(retired_executors_);
    }
    gone.clear();  // joins their link threads, off the inference thread
  }
}

}  // namespace essaim::backbone
