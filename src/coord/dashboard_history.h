// What the dashboard shows over time: coverage (a sample per second at most, kept for the last hour), the
// pairs each worker served and the tokens each backbone ran (rates over the last minute). A view for the
// operator, not market state: it lives in this process's memory, so each coordinator process sharing one
// database shows what it saw, and a restarted one starts an empty strip. Thread-safe.
//
//   DashboardHistory h;
//   if (h.wants_coverage(now_ms)) h.coverage(now_ms, {.slices = 96, .uncovered = 0, .under_replicated = 3});
//   h.pairs(now_ms, "n-0123456789abcdef", 4096);      // from POST /api/work
//   nlohmann::json strip = h.coverage_strip(now_ms);   // oldest first
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>

namespace essaim::coord {

struct CoverageSample {
  int64_t t_ms = 0;
  int64_t slices = 0, uncovered = 0, under_replicated = 0;
};

class DashboardHistory {
 public:
  static constexpr int64_t kKeepMs = 3600 * 1000;    // the strip: the last hour
  static constexpr int64_t kRateMs = 60 * 1000;      // rates: the last minute
  static constexpr int64_t kSampleEveryMs = 1000;

  bool wants_coverage(int64_t now_ms) const;
  void coverage(int64_t now_ms, CoverageSample s);
  void pairs(int64_t now_ms, const std::string& node_id, int64_t n);
  void tokens(int64_t now_ms, const std::string& backbone, int64_t n);

  // [{"t_ms", "slices", "uncovered", "under_replicated"}], oldest first, within the last hour.
  nlohmann::json coverage_strip(int64_t now_ms) const;
  // Per key: what was counted in the last minute / the time it spans (at least 1 s; from the first count
  // when that is more recent than a minute ago, so a young coordinator does not under-report).
  std::map<std::string, double> pairs_per_s(int64_t now_ms) const;
  std::map<std::string, double> tokens_per_s(int64_t now_ms) const;

 private:
  struct Count {
    int64_t t_ms = 0;
    std::string key;
    int64_t n = 0;
  };
  static void prune(std::deque<Count>& q, int64_t now_ms);
  std::map<std::string, double> rates(const std::deque<Count>& q, int64_t now_ms) const;

  mutable std::mutex mu_;
  std::deque<CoverageSample> coverage_;
  std::deque<Count> pairs_, tokens_;
  int64_t first_ms_ = 0;  // of any count
};

}  // namespace essaim::coord
