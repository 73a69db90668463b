#include "backbone/replica_choice.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace essaim::backbone {

double ReplicaChooser::cost(size_t link, uint64_t load) const {
  // A round trip measured at `pairs` pairs per request, scaled by how many such requests' worth of pairs
  // this call already put on the link: twice the usual load is twice the usual wait. A link with no
  // answer yet costs 0, so it is tried and measured.
  const Averages& a = links_[link];
  return a.estimate * (1.0 + double(load) / std::max(a.pairs, 1.0));
}

size_t ReplicaChooser::choose(std::span<const size_t> candidates, std::span<const uint64_t> load) const {
  if (options_.policy == ReplicaPolicy::FIRST || candidates.size() == 1) return candidates.front();
  size_t best = candidates.front();
  double best_cost = std::numeric_limits<double>::infinity();
  for (size_t c : candidates) {
    const double k = cost(c, load[c]);
    // Strictly cheaper wins; an equal cost goes to the less loaded link, then to the earlier one in map order.
    if (k < best_cost || (k == best_cost && load[c] < load[best])) {
      best = c;
      best_cost = k;
    }
  }
  return best;
}

void ReplicaChooser::record(size_t link, double seconds, uint64_t pairs) {
  Averages& a = links_[link];
  if (a.samples++ == 0) {
    a.rtt = a.estimate = seconds;
    a.pairs = double(pairs);
    return;
  }
  a.rtt += options_.alpha * (seconds - a.rtt);
  a.estimate = a.rtt;  // a fresh measurement replaces whatever drift
  a.pairs += options_.alpha * (double(pairs) - a.pairs);
}

void ReplicaChooser::decay_unused(const std::vector<bool>& candidate, std::span<const uint64_t> load) {
  if (options_.policy != ReplicaPolicy::NEAREST) return;
  double best = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < links_.size(); ++i)
    if (candidate[i] && links_[i].samples > 0) best = std::min(best, links_[i].estimate);
  if (best == std::numeric_limits<double>::infinity()) return;
  for (size_t i = 0; i < links_.size(); ++i)
    if (candidate[i] && load[i] == 0 && links_[i].samples > 0)
      links_[i].estimate += options_.decay * (best - links_[i].estimate);
}

std::chrono::nanoseconds ReplicaChooser::hedge_after(size_t link) const {
  // No history, no lateness: a link is judged against its own round trips once it has a few.
  if (!options_.hedge || links_[link].samples < kHedgeMinSamples) return std::chrono::nanoseconds::max();
  const auto history = std::chrono::nanoseconds(std::llround(options_.hedge_factor * links_[link].rtt * 1e9));
  return std::max<std::chrono::nanoseconds>(history, options_.hedge_min);
}

}  // namespace essaim::backbone
