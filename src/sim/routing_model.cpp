#include "sim/routing_model.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>

namespace essaim::sim {

double scaled_rank_share(const std::vector<double>& sorted_desc, int32_t r, int32_t n) {
  const double x = (double(r) + 0.5) / double(n) * double(sorted_desc.size()) - 0.5;
  const double lo = std::clamp(std::floor(x), 0.0, double(sorted_desc.size() - 1));
  const double hi = std::min(lo + 1, double(sorted_desc.size() - 1));
  const double f = std::clamp(x - lo, 0.0, 1.0);
  return sorted_desc[size_t(lo)] * (1 - f) + sorted_desc[size_t(hi)] * f;
}

Result<RoutingModel> RoutingModel::from_json(std::string_view text, int32_t n_layers, int32_t n_experts, int32_t k,
                                             uint64_t seed) {
  const nlohmann::json doc = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("layers") || !doc["layers"].is_array() ||
      doc["layers"].empty())
    return Status::error("router statistics: expected {\"layers\": [{\"picks\": [...]}, ...]}");
  std::vector<std::vector<double>> measured;
  for (const auto& l : doc["layers"]) {
    if (!l.is_object() || !l.contains("picks") || !l["picks"].is_array() || l["picks"].size() < 2)
      return Status::error("router statistics: every layer needs at least 2 pick counts");
    std::vector<double> p;
    for (const auto& v : l["picks"]) {
      if (!v.is_number() || v.get<double>() < 0) return Status::error("router statistics: pick counts are >= 0");
      p.push_back(v.get<double>());
    }
    std::sort(p.begin(), p.end(), std::greater<>());
    if (p[0] <= 0) return Status::error("router statistics: a layer with no picks");
    measured.push_back(std::move(p));
  }
  if (n_layers < 1 || n_experts < k || k < 1) return Status::error("router statistics: bad model shape");
  RoutingModel m;
  m.k_ = k;
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  for (int32_t l = 0; l < n_layers; ++l) {
    const std::vector<double>& src = measured[size_t(int64_t(l) * int64_t(measured.size()) / n_layers)];
    std::vector<double> share(static_cast<size_t>(n_experts), 0.0);
    for (int32_t r = 0; r < n_experts; ++r) share[size_t(r)] = scaled_rank_share(src, r, n_experts);
    std::shuffle(share.begin(), share.end(), rng);  // which ids are hot
    const double total = std::accumulate(share.begin(), share.end(), 0.0);
    for (double& s : share) s /= total;
    m.pick_.emplace_back(share.begin(), share.end());
    m.shares_.push_back(std::move(share));
  }
  return m;
}

Result<RoutingModel> RoutingModel::uniform(int32_t n_layers, int32_t n_experts, int32_t k) {
  if (n_layers < 1 || n_experts < k || k < 1) return Status::error("uniform routing: bad model shape");
  RoutingModel m;
  m.k_ = k;
  const std::vector<double> share(static_cast<size_t>(n_experts), 1.0 / double(n_experts));
  for (int32_t l = 0; l < n_layers; ++l) {
    m.pick_.emplace_back(share.begin(), share.end());
    m.shares_.push_back(share);
  }
  return m;
}

void RoutingModel::draw(int32_t layer, std::mt19937_64& rng, std::vector<int32_t>& ids) const {
  ids.clear();
  auto& pick = const_cast<std::discrete_distribution<int32_t>&>(pick_[size_t(layer)]);  // stateless draws
  while (int32_t(ids.size()) < k_) {
    const int32_t e = pick(rng);
    if (std::find(ids.begin(), ids.end(), e) == ids.end()) ids.push_back(e);
  }
}

}  // namespace essaim::sim
