// Which experts the router picks, drawn from the trained model's measured statistics (models/README.md:
// per-layer pick counts of kjv-moe on its held-out text, stored in data/kjv_moe_router.json) scaled to the
// served model: a layer of n_experts takes the measured layer at the same depth, and expert rank r of n
// gets the share the measured rank curve (descending) has at r/n of its length, so the skew (entropy,
// top-10 % share) carries over; which expert ids are hot is a seeded permutation per layer. Each token
// picks k distinct experts, each a draw by share. Temporal locality (a token reusing its predecessor's
// experts) is not modelled.
//
//   ESSAIM_ASSIGN_OR_RETURN(RoutingModel r, RoutingModel::from_json(text, 48, 256, 8, seed));
//   r.draw(layer, rng, ids);                                 // ids: k distinct experts
#pragma once

#include <cstdint>
#include <random>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace essaim::sim {

class RoutingModel {
 public:
  static Result<RoutingModel> from_json(std::string_view text, int32_t n_layers, int32_t n_experts, int32_t k,
                                        uint64_t seed);
  // Every expert equally likely (a synth model's seeded random router picks close to that).
  static Result<RoutingModel> uniform(int32_t n_layers, int32_t n_experts, int32_t k);
  void draw(int32_t layer, std::mt19937_64& rng, std::vector<int32_t>& ids) const;
  const std::vector<double>& shares(int32_t layer) const { return shares_[size_t(layer)]; }
  int32_t k() const { return k_; }

 private:
  int32_t k_ = 0;
  std::vector<std::vector<double>> shares_;  // [layer][expert], each layer sums to 1
  std::vector<std::discrete_distribution<int32_t>> pick_;
};

// Share of rank r of n from a descending measured curve (linear interpolation), before normalising.
double scaled_rank_share(const std::vector<double>& sorted_desc, int32_t r, int32_t n);

}  // namespace essaim::sim
