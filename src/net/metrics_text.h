// The Prometheus text exposition format (version 0.0.4), written by hand: prometheus-cpp, the usual
// library, is not packaged in Debian bookworm. Only what /metrics needs: counters, gauges and histograms
// with labels, rendered from a snapshot the caller takes; no registry, no global state.
//
//   MetricsText m;
//   m.family("essaim_serve_requests_total", "counter", "HTTP requests by endpoint and outcome");
//   m.sample("essaim_serve_requests_total", {{"outcome", "ok"}}, 12);
//   Histogram h({1, 2, 4, 8});   h.observe(3);
//   m.histogram("essaim_serve_batch_rows", "Rows per forward step", h);
//   std::string body = m.text();   // served as text/plain; version=0.0.4
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace essaim::net {

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// Cumulative-bucket histogram as Prometheus expects: counts[i] = observations <= bounds[i]; +Inf implied.
// Not thread-safe: the owner keeps it under its own lock and hands out copies.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds = {});
  void observe(double value);
  const std::vector<double>& bounds() const { return bounds_; }
  const std::vector<uint64_t>& counts() const { return counts_; }  // per bucket, not cumulative
  uint64_t count() const { return count_; }
  double sum() const { return sum_; }

 private:
  std::vector<double> bounds_;   // increasing
  std::vector<uint64_t> counts_;  // bounds_.size() + 1 (the last is +Inf)
  uint64_t count_ = 0;
  double sum_ = 0;
};

class MetricsText {
 public:
  // "# HELP" and "# TYPE" lines; call once per metric name, before its samples.
  void family(std::string_view name, std::string_view type, std::string_view help);
  void sample(std::string_view name, const MetricLabels& labels, double value);
  // family + the _bucket/_sum/_count samples.
  void histogram(std::string_view name, std::string_view help, const Histogram& h, const MetricLabels& labels = {});
  // Lines already in the exposition format (e.g. net::AdmissionCounters::to_prometheus).
  void append_raw(std::string_view lines) { out_ += lines; }
  const std::string& text() const { return out_; }

 private:
  std::string out_;
};

// A label value escaped as the format wants (backslash, double quote, newline).
std::string metrics_escape_label(std::string_view value);
// A sample value: integers without exponent, +Inf/-Inf/NaN spelled as the format wants.
std::string metrics_format_value(double value);

}  // namespace essaim::net
