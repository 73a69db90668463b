// The median the benchmarks report: the upper middle of the values (no averaging of the two middle ones, so
// the figure is one that was measured), 0 for none.
//
//   const double us = bench::median(samples_us);
#pragma once

#include <algorithm>
#include <vector>

namespace essaim::bench {

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace essaim::bench
