// What a router really does on a text: which experts it picks per layer, how evenly, and how often a token
// picks again an expert the token before it picked (the temporal locality a hot-expert cache lives on).
//
//   RoutingRecorder rec(inner_executor);              // an ExpertExecutor that records, then forwards
//   rec.start_sequence();  model->forward({.experts = &rec, ...});   // once per sequence, in token order
//   std::vector<LayerRoutingStats> s = routing_stats(rec.picks(), n_experts);
//
// Per layer: usage entropy H = -Σ p_e log2 p_e over the share p_e of all picks that went to expert e (log2 X
// when every expert is picked equally often); the share of picks taken by the ceil(X / 10) most picked experts
// (0.1 when even); and reuse, the mean over consecutive tokens of one sequence of |picks(t) ∩ picks(t-1)| / K
// (K / X for a router that ignores the previous token).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "moe/executor.h"

namespace essaim {

// The picks of one layer: for each token in order, its K expert ids; sequence_start[i] marks token i as the
// first of a sequence (no previous token to compare with).
struct LayerPicks {
  int32_t k = 0;
  std::vector<int32_t> ids;             // [tokens][k]
  std::vector<uint8_t> sequence_start;  // [tokens]
};

class RoutingRecorder final : public ExpertExecutor {
 public:
  explicit RoutingRecorder(ExpertExecutor& inner) : inner_(inner) {}
  // The next rows of every layer begin a new sequence.
  void start_sequence() { new_sequence_ = true; }
  Status compute(const ExpertBatch& batch, std::span<float> out) override;
  bool may_fail() const override { return inner_.may_fail(); }
  const std::vector<LayerPicks>& picks() const { return layers_; }  // index = layer

 private:
  ExpertExecutor& inner_;
  std::vector<LayerPicks> layers_;
  std::vector<uint8_t> layer_started_;  // per layer: the current sequence already has rows there
  bool new_sequence_ = true;
};

struct LayerRoutingStats {
  int32_t layer = 0;
  uint64_t tokens = 0;
  std::vector<uint64_t> picks;   // [n_experts] times each expert was picked
  double entropy_bits = 0;       // of the pick shares
  double max_entropy_bits = 0;   // log2(n_experts)
  int32_t top_experts = 0;       // ceil(n_experts / 10)
  double top_share = 0;          // share of picks taken by the top_experts most picked
  double reuse = 0;              // mean |picks(t) ∩ picks(t-1)| / K over consecutive tokens of a sequence
  double reuse_if_random = 0;    // K / n_experts
};

// Layers with no recorded token are left out. Ids outside [0, n_experts) are an error.
Result<std::vector<LayerRoutingStats>> routing_stats(std::span<const LayerPicks> layers, int32_t n_experts);

}  // namespace essaim
