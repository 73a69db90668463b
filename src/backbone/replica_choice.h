// Which replica answers: when several live workers may serve an expert, the dispatcher picks one per pair
// by what it has measured of each — its round trip (a moving average over accepted answers) and the load
// this call is already putting on it — so equal replicas share the work and a slow one is asked less; and
// it says when a request is late relative to its worker's own history, so that a hedged duplicate can go
// to a second replica before the deadline (docs/dispatch.md, "Nearest healthy replica").
//
//   ReplicaChooser chooser(n_links, {});
//   std::vector<uint64_t> load(n_links, 0);                   // pairs assigned so far in this call
//   size_t link = chooser.choose(candidates, load);           // candidates: live links holding the expert
//   ++load[link];
//   ...
//   chooser.record(link, seconds, pairs);                     // every accepted answer
//   if (elapsed > chooser.hedge_after(link)) ...              // late: send the duplicate elsewhere
//
// Exactness does not depend on any of this: every replica computes the same bits from the same bytes
// (docs/invariants.md invariant 1), so the choice moves only time, never a result.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <vector>

namespace essaim::backbone {

enum class ReplicaPolicy : uint8_t {
  FIRST,    // the first live worker in map order (M1): deterministic, a primary with its backups
  NEAREST,  // the cheapest by measured round trip and this call's load; ties to the less loaded, then map order
};

struct ReplicaChoiceOptions {
  ReplicaPolicy policy = ReplicaPolicy::FIRST;
  double alpha = 0.25;  // weight of the newest sample in the moving averages
  // A replica that could have served a call but was given nothing has its average moved this much toward
  // the best candidate's, so one slow answer (a scheduling hiccup) is not held against it forever: it is
  // measured again after a few calls, and a really slow one only now and then.
  double decay = 0.25;
  // Hedging: a request unanswered after max(hedge_min, hedge_factor × its link's average round trip) gets a
  // duplicate on another live replica holding all its pairs, if the call's deadline has not passed; so does
  // a request its worker answered with an error or OVERLOADED (another replica before the backbone's own).
  bool hedge = false;
  double hedge_factor = 3.0;
  std::chrono::microseconds hedge_min{2000};
};

class ReplicaChooser {
 public:
  static constexpr uint64_t kHedgeMinSamples = 4;  // answers measured before a link's request can be "late"

  ReplicaChooser(size_t n_links, ReplicaChoiceOptions options) : options_(options), links_(n_links) {}

  const ReplicaChoiceOptions& options() const { return options_; }
  // One of `candidates` (non-empty, in map order). `load[i]`: pairs already given to link i in this call.
  size_t choose(std::span<const size_t> candidates, std::span<const uint64_t> load) const;
  // An accepted answer of `pairs` pairs took `seconds` from send to answer.
  void record(size_t link, double seconds, uint64_t pairs);
  // After a call's choices: links that were candidates (`candidate[i]`) but got no load decay toward the
  // cheapest candidate's average (options.decay).
  void decay_unused(const std::vector<bool>& candidate, std::span<const uint64_t> load);
  // When a request on `link` is late (from its send); max() when hedging is off.
  std::chrono::nanoseconds hedge_after(size_t link) const;

  double mean_round_trip(size_t link) const { return links_[link].rtt; }  // seconds; 0 before any answer
  double estimated_round_trip(size_t link) const { return links_[link].estimate; }  // as choose() sees it
  double mean_pairs(size_t link) const { return links_[link].pairs; }     // per request
  // The expected cost of one more pair on the link, given the load: the quantity choose() minimises.
  double cost(size_t link, uint64_t load) const;

 private:
  struct Averages {
    uint64_t samples = 0;
    double rtt = 0;       // seconds: the measured moving average (reported)
    double estimate = 0;  // what choose() uses: rtt, drifting toward the best while the link is unused
    double pairs = 0;     // pairs per request: the load the round trip was measured at
  };
  ReplicaChoiceOptions options_;
  std::vector<Averages> links_;
};

}  // namespace essaim::backbone
