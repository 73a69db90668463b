#include "moe/routing_stats.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace essaim {

Status RoutingRecorder::compute(const ExpertBatch& batch, std::span<float> out) {
  if (batch.layer < 0 || batch.k <= 0 || batch.ids.size() != size_t(batch.n_rows) * size_t(batch.k))
    return Status::error("routing recorder: malformed batch");
  if (size_t(batch.layer) >= layers_.size()) {
    layers_.resize(size_t(batch.layer) + 1);
    layer_started_.resize(size_t(batch.layer) + 1, 0);
  }
  if (new_sequence_) std::fill(layer_started_.begin(), layer_started_.end(), 0);
  new_sequence_ = false;
  LayerPicks& l = layers_[size_t(batch.layer)];
  l.k = batch.k;
  l.ids.insert(l.ids.end(), batch.ids.begin(), batch.ids.end());
  for (int64_t r = 0; r < batch.n_rows; ++r) {
    l.sequence_start.push_back(layer_started_[size_t(batch.layer)] ? 0 : 1);
    layer_started_[size_t(batch.layer)] = 1;
  }
  return inner_.compute(batch, out);
}

namespace {

double entropy_bits(const std::vector<uint64_t>& picks, uint64_t total) {
  double h = 0;
  for (uint64_t c : picks)
    if (c > 0) {
      const double p = double(c) / double(total);
      h -= p * std::log2(p);
    }
  return h;
}

double top_share(std::vector<uint64_t> picks, int32_t top, uint64_t total) {
  std::sort(picks.begin(), picks.end(), std::greater<>());
  uint64_t sum = 0;
  for (int32_t i = 0; i < top && size_t(i) < picks.size(); ++i) sum += picks[size_t(i)];
  return double(sum) / double(total);
}

double reuse(const LayerPicks& l) {
  const size_t k = size_t(l.k), tokens = l.sequence_start.size();
  uint64_t shared = 0, pairs = 0;
  for (size_t t = 1; t < tokens; ++t) {
    if (l.sequence_start[t]) continue;
    const int32_t* now = l.ids.data() + t * k;
    const int32_t* before = now - k;
    for (size_t a = 0; a < k; ++a) shared += std::find(before, before + k, now[a]) != before + k ? 1 : 0;
    ++pairs;
  }
  return pairs == 0 ? 0.0 : double(shared) / double(pairs * k);
}

}  // namespace

Result<std::vector<LayerRoutingStats>> routing_stats(std::span<const LayerPicks> layers, int32_t n_experts) {
  if (n_experts <= 0) return Status::error("routing stats: no experts");
  std::vector<LayerRoutingStats> out;
  for (size_t il = 0; il < layers.size(); ++il) {
    const LayerPicks& l = layers[il];
    if (l.sequence_start.empty()) continue;
    LayerRoutingStats s;
    s.layer = int32_t(il);
    s.tokens = l.sequence_start.size();
    s.picks.assign(size_t(n_experts), 0);
    for (int32_t id : l.ids) {
      if (id < 0 || id >= n_experts)
        return Status::error("routing stats: layer " + std::to_string(il) + " picked expert " + std::to_string(id) +
                             " of " + std::to_string(n_experts));
      ++s.picks[size_t(id)];
    }
    const uint64_t total = l.ids.size();
    s.entropy_bits = entropy_bits(s.picks, total);
    s.max_entropy_bits = std::log2(double(n_experts));
    s.top_experts = (n_experts + 9) / 10;
    s.top_share = top_share(s.picks, s.top_experts, total);
    s.reuse = reuse(l);
    s.reuse_if_random = double(l.k) / double(n_experts);
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace essaim
