#include "coord/dashboard_history.h"

#include <algorithm>

namespace essaim::coord {

bool DashboardHistory::wants_coverage(int64_t now_ms) const {
  std::lock_guard lock(mu_);
  return coverage_.empty() || now_ms - coverage_.back().t_ms >= kSampleEveryMs;
}

void DashboardHistory::coverage(int64_t now_ms, CoverageSample s) {
  std::lock_guard lock(mu_);
  if (!coverage_.empty() && now_ms - coverage_.back().t_ms < kSampleEveryMs) return;
  s.t_ms = now_ms;
  coverage_.push_back(s);
  while (!coverage_.empty() && now_ms - coverage_.front().t_ms > kKeepMs) coverage_.pop_front();
}

void DashboardHistory::prune(std::deque<Count>& q, int64_t now_ms) {
  while (!q.empty() && now_ms - q.front().t_ms > kRateMs) q.pop_front();
}

void DashboardHistory::pairs(int64_t now_ms, const std::string& node_id, int64_t n) {
  std::lock_guard lock(mu_);
  if (first_ms_ == 0) first_ms_ = now_ms;
  pairs_.push_back({now_ms, node_id, n});
  prune(pairs_, now_ms);
}

void DashboardHistory::tokens(int64_t now_ms, const std::string& backbone, int64_t n) {
  std::lock_guard lock(mu_);
  if (first_ms_ == 0) first_ms_ = now_ms;
  tokens_.push_back({now_ms, backbone, n});
  prune(tokens_, now_ms);
}

nlohmann::json DashboardHistory::coverage_strip(int64_t now_ms) const {
  std::lock_guard lock(mu_);
  nlohmann::json out = nlohmann::json::array();
  for (const CoverageSample& s : coverage_) {
    if (now_ms - s.t_ms > kKeepMs) continue;
    out.push_back({{"t_ms", s.t_ms}, {"slices", s.slices}, {"uncovered", s.uncovered},
                   {"under_replicated", s.under_replicated}});
  }
  return out;
}

std::map<std::string, double> DashboardHistory::rates(const std::deque<Count>& q, int64_t now_ms) const {
  const int64_t from = std::max(now_ms - kRateMs, first_ms_);
  const double span_s = std::max(1.0, double(now_ms - from) / 1000.0);
  std::map<std::string, double> out;
  for (const Count& c : q) {
    if (now_ms - c.t_ms <= kRateMs) out[c.key] += double(c.n) / span_s;
  }
  return out;
}

std::map<std::string, double> DashboardHistory::pairs_per_s(int64_t now_ms) const {
  std::lock_guard lock(mu_);
  return rates(pairs_, now_ms);
}

std::map<std::string, double> DashboardHistory::tokens_per_s(int64_t now_ms) const {
  std::lock_guard lock(mu_);
  return rates(tokens_, now_ms);
}

}  // namespace essaim::coord
