#include "core/progress.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>

namespace essaim {
namespace {

void write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // progress is best effort: a closed terminal must not fail the job
    off += size_t(n);
  }
}

}  // namespace

std::string progress_bytes_text(double bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  size_t u = 0;
  while (bytes >= 1024.0 && u + 1 < std::size(kUnits)) {
    bytes /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", bytes, kUnits[u]);
  return buf;
}

std::string progress_duration_text(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const long long s = (long long)std::llround(seconds);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%lld:%02lld", s / 60, s % 60);
  return buf;
}

std::string progress_line(const std::string& label, uint64_t done, uint64_t total, double seconds, bool final) {
  const double rate = seconds > 0 ? double(done) / seconds : 0.0;
  std::string line = label + "  " + progress_bytes_text(double(done));
  if (total > 0) {
    char pct[16];
    std::snprintf(pct, sizeof pct, "%3.0f%%", 100.0 * double(done) / double(total));
    line += " / " + progress_bytes_text(double(total)) + "  " + pct;
  }
  line += "  " + progress_bytes_text(rate) + "/s";
  if (final) line += "  in " + progress_duration_text(seconds);
  else if (total > 0 && rate > 0 && done <= total) line += "  " + progress_duration_text(double(total - done) / rate) + " left";
  return line;
}

Progress::Progress(std::string label, uint64_t total_bytes, ProgressOptions options)
    : label_(std::move(label)),
      total_(total_bytes),
      options_(options),
      enabled_(options.enabled.value_or(::isatty(options.fd) == 1)),
      start_(std::chrono::steady_clock::now()) {}

Progress::~Progress() { finish(); }

void Progress::set_total(uint64_t total_bytes) { total_.store(total_bytes, std::memory_order_relaxed); }

void Progress::advance(uint64_t bytes) {
  done_.fetch_add(bytes, std::memory_order_relaxed);
  if (!enabled_) return;
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_).count();
  int64_t due = next_draw_ns_.load(std::memory_order_relaxed);
  if (now < due) return;
  // One thread wins the right to draw this interval; the others go on.
  const int64_t next = now + std::chrono::duration_cast<std::chrono::nanoseconds>(options_.interval).count();
  if (!next_draw_ns_.compare_exchange_strong(due, next, std::memory_order_relaxed)) return;
  draw(false);
}

void Progress::finish() {
  if (!enabled_) return;
  draw(true);
}

void Progress::draw(bool final) {
  std::lock_guard lock(draw_mu_);
  if (finished_ || (final && !drawn_)) return;  // a job that never advanced leaves no line
  finished_ = final;
  drawn_ = true;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  // \r back to the line start, \x1b[K erases what a longer previous line left.
  std::string out = "\r" + progress_line(label_, done(), total_.load(std::memory_order_relaxed), seconds, final) + "\x1b[K";
  if (final) out += "\n";
  write_all(options_.fd, out);
}

}  // namespace essaim
