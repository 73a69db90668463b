#include "sim/sim_report.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>

namespace essaim::sim {

using json = nlohmann::json;

double gini(std::vector<double> a) {
  if (a.empty()) return 0;
  std::sort(a.begin(), a.end());
  const double total = std::accumulate(a.begin(), a.end(), 0.0);
  if (total <= 0) return 0;
  double weighted = 0;
  for (size_t i = 0; i < a.size(); ++i) weighted += double(i + 1) * a[i];
  const double n = double(a.size());
  return (2 * weighted) / (n * total) - (n + 1) / n;
}

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t rank = size_t(std::ceil(std::clamp(q, 0.0, 1.0) * double(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

namespace {

json rewards_json(const SimReport& r) {
  std::vector<double> pairs;
  std::map<std::string, std::pair<double, double>> by_class;  // class -> (pairs, GB)
  for (const SimReport::Earner& e : r.earners) {
    pairs.push_back(double(e.pairs));
    by_class[e.device_class].first += double(e.pairs);
    by_class[e.device_class].second += double(e.budget_bytes) / 1e9;
  }
  json per_gb = json::object();
  for (const auto& [cls, v] : by_class) per_gb[cls] = v.second > 0 ? v.first / v.second : 0.0;
  const auto earning = std::count_if(pairs.begin(), pairs.end(), [](double p) { return p > 0; });
  return {{"gini", gini(pairs)}, {"workers_credited", earning}, {"pairs_per_gb_by_class", per_gb}};
}

json coverage_json(const SimReport& r) {
  json points = json::array();
  for (const CoveragePoint& p : r.coverage) {
    points.push_back({{"t_s", p.t_s}, {"covered", p.covered}, {"replicated", p.replicated}, {"online", p.online},
                      {"holding", p.holding}});
  }
  double min_covered = 1;
  for (const CoveragePoint& p : r.coverage) {
    if (p.t_s > 0) min_covered = std::min(min_covered, p.covered);
  }
  return {{"min_covered", r.coverage.empty() ? 0.0 : min_covered}, {"points", points}};
}

}  // namespace

std::string report_json(const Scenario& s, const SimReport& r, bool with_holdings) {
  const double step_s = r.step_seconds;
  const double per_backbone_tok_s = step_s > 0 ? double(r.tokens) / step_s : 0;
  const uint64_t pairs = r.pairs_remote + r.pairs_hot + r.pairs_fallback + r.pairs_failed;
  const double coord_requests = double(r.heartbeats + r.volunteers);
  json j = {
      {"format", "essaim-sim"},
      {"version", 1},
      {"scenario", json::parse(scenario_json(s))},
      {"simulated_s", r.simulated_s},
      {"wall_s", r.wall_s},
      {"tokens", r.tokens},
      // Every backbone decodes `sequences` sequences; its rate is tokens / time in steps; the swarm's is the
      // mean backbone rate times the backbones (they run their bursts at the same time).
      {"tok_s", per_backbone_tok_s * double(s.backbones)},
      {"tok_s_per_backbone", per_backbone_tok_s},
      {"token_latency_s", {{"p50", quantile(r.token_latency_s, 0.5)}, {"p99", quantile(r.token_latency_s, 0.99)},
                           {"steps", r.token_latency_s.size()}}},
      {"pairs", {{"total", pairs}, {"remote", r.pairs_remote}, {"hot_cache", r.pairs_hot},
                 {"fallback", r.pairs_fallback}, {"failed", r.pairs_failed}, {"hedged", r.pairs_hedged}}},
      {"calls", {{"sent", r.calls}, {"timed_out", r.calls_timed_out}, {"audits", r.audits}}},
      {"wire_bytes", {{"to_workers", r.bytes_up}, {"from_workers", r.bytes_down}}},
      {"coverage", coverage_json(r)},
      {"churn", {{"joins", r.joins}, {"kills", r.kills}, {"leaves", r.leaves}}},
      {"coordinator",
       {{"requests_per_s", r.simulated_s > 0 ? (coord_requests + double(r.map_reads)) / r.simulated_s : 0.0},
        {"heartbeats", r.heartbeats}, {"volunteers", r.volunteers}, {"map_reads", r.map_reads},
        {"decisions", r.decisions}, {"decisions_skipped", r.skipped}, {"assigned", r.assigned}, {"swaps", r.swaps},
        {"drops", r.drops}, {"slice_downloads", r.slice_downloads}, {"slice_bytes", r.slice_bytes}}},
      {"rewards", rewards_json(r)},
  };
  if (with_holdings) {
    json h = json::object();
    for (const auto& [node, slices] : r.final_holdings) {
      if (!slices.empty()) h[node] = slices;
    }
    j["holdings"] = h;
  }
  return j.dump();
}

}  // namespace essaim::sim
