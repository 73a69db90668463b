// Progress of one long job (slicing, synthesising, reading a model into memory, a download): bytes done,
// rate and time left, redrawn in place on stderr — only when stderr is a terminal, so pipes, logs and
// tests that capture output never see it. Debian ships no C++ progress-bar library (docs/cli.md), hence
// this small one.
//
//   Progress p("slice", total_bytes);        // total 0 = unknown (a download without Content-Length)
//   for (...) { write(chunk); p.advance(chunk.size()); }
//   p.finish();                              // last line, then a newline (the destructor does it too)
//
// advance() is cheap (one atomic add; a redraw at most every `interval`) and may be called from any thread.
// Code below the CLI takes a `Progress*` that may be null: nothing is reported then.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

namespace essaim {

struct ProgressOptions {
  int fd = 2;                            // where to draw
  std::optional<bool> enabled;           // nullopt: draw iff isatty(fd)
  std::chrono::milliseconds interval{200};
};

class Progress {
 public:
  Progress(std::string label, uint64_t total_bytes, ProgressOptions options = {});
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void advance(uint64_t bytes);
  void set_total(uint64_t total_bytes);  // when it becomes known (or changes)
  void finish();                         // idempotent
  bool enabled() const { return enabled_; }
  uint64_t done() const { return done_.load(std::memory_order_relaxed); }

 private:
  void draw(bool final);

  const std::string label_;
  std::atomic<uint64_t> total_;
  std::atomic<uint64_t> done_{0};
  const ProgressOptions options_;
  const bool enabled_;
  const std::chrono::steady_clock::time_point start_;
  std::atomic<int64_t> next_draw_ns_{0};  // steady-clock ns since start_ of the next allowed redraw
  std::mutex draw_mu_;
  bool drawn_ = false;     // guarded by draw_mu_
  bool finished_ = false;  // guarded by draw_mu_
};

// "1.50 GiB", "812.0 MiB", "17 B" (binary units); "1:02:03" / "4:05" for seconds.
std::string progress_bytes_text(double bytes);
std::string progress_duration_text(double seconds);
// One progress line (no \r): "slice  1.50 GiB / 6.00 GiB  25%  812.0 MiB/s  0:06 left".
std::string progress_line(const std::string& label, uint64_t done, uint64_t total, double seconds, bool final);

}  // namespace essaim
