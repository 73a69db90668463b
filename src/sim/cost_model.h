// Compute time of the expert FFN, calibrated by bench/expert_bench on the development machine (one thread,
// per CPU-second: data/expert_cost.json holds the figures and the command that made them) and scaled by a
// device's stated speed relative to that core. Between measured row counts the time per expert is
// interpolated linearly in log(rows); beyond the largest it grows linearly with rows (compute-bound).
//
//   ESSAIM_ASSIGN_OR_RETURN(CostModel c, CostModel::from_json(text));
//   double s = c.expert_seconds(rows, GgmlType::Q6_K) / device_speed;
#pragma once

#include <cstdint>
#include <map>
#include <string_view>
#include <vector>

#include "core/ggml_type.h"
#include "core/status.h"

namespace essaim::sim {

class CostModel {
 public:
  static Result<CostModel> from_json(std::string_view text);
  // One expert over `rows` rows (>= 1) on one calibrating core.
  double expert_seconds(int64_t rows, GgmlType down) const;

 private:
  struct Point {
    double rows = 0, seconds = 0;
  };
  std::map<GgmlType, std::vector<Point>> points_;  // by down type, rows ascending
};

}  // namespace essaim::sim
