#include "sim/cost_model.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

namespace essaim::sim {

Result<CostModel> CostModel::from_json(std::string_view text) {
  const nlohmann::json doc = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("points") || !doc["points"].is_array())
    return Status::error("expert cost calibration: expected {\"points\": [...]}");
  CostModel m;
  for (const auto& p : doc["points"]) {
    if (!p.is_object() || !p.contains("down_type") || !p["down_type"].is_string() || !p.contains("rows_per_expert") ||
        !p["rows_per_expert"].is_number() || !p.contains("seconds_per_expert") || !p["seconds_per_expert"].is_number())
      return Status::error("expert cost calibration: a point needs down_type, rows_per_expert, seconds_per_expert");
    const std::string t = p["down_type"].get<std::string>();
    const GgmlType type = ggml_type_from_name(t).value_or(GgmlType::COUNT);
    const double rows = p["rows_per_expert"].get<double>(), s = p["seconds_per_expert"].get<double>();
    if (type == GgmlType::COUNT || !(rows >= 1) || !(s > 0) || !std::isfinite(s))
      return Status::error("expert cost calibration: bad point (" + t + ")");
    m.points_[type].push_back({rows, s});
  }
  if (m.points_.empty()) return Status::error("expert cost calibration: no points");
  for (auto& [type, pts] : m.points_) {
    std::sort(pts.begin(), pts.end(), [](const Point& a, const Point& b) { return a.rows < b.rows; });
  }
  return m;
}

double CostModel::expert_seconds(int64_t rows, GgmlType down) const {
  auto it = points_.find(down);
  const std::vector<Point>& pts = it != points_.end() ? it->second : points_.begin()->second;
  const double r = double(std::max<int64_t>(1, rows));
  if (r <= pts.front().rows || pts.size() == 1) return pts.front().seconds * std::max(1.0, r / pts.front().rows);
  if (r >= pts.back().rows) return pts.back().seconds * r / pts.back().rows;
  size_t i = 1;
  while (pts[i].rows < r) ++i;
  const Point &a = pts[i - 1], &b = pts[i];
  const double f = (std::log(r) - std::log(a.rows)) / (std::log(b.rows) - std::log(a.rows));
  return a.seconds + (b.seconds - a.seconds) * f;
}

}  // namespace essaim::sim
