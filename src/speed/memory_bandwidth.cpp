#include "speed/memory_bandwidth.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <vector>

namespace essaim {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Sum of n floats with the widest loads the CPU has: a plain read stream. Wide loads matter — on the
// machines measured, a baseline-SSE loop read about half as fast as an AVX-512 one.
#if defined(__x86_64__)
__attribute__((target("avx512f"))) float read_sum_avx512(const float* a, size_t n) {
  typedef float v16 __attribute__((vector_size(64)));
  v16 s0 = {}, s1 = {};
  for (size_t i = 0; i + 32 <= n; i += 32) {
    v16 x0, x1;
    std::memcpy(&x0, a + i, sizeof(x0));
    std::memcpy(&x1, a + i + 16, sizeof(x1));
    s0 += x0;
    s1 += x1;
  }
  return (s0 + s1)[0];
}
__attribute__((target("avx2"))) float read_sum_avx2(const float* a, size_t n) {
  typedef float v8 __attribute__((vector_size(32)));
  v8 s0 = {}, s1 = {}, s2 = {}, s3 = {};
  for (size_t i = 0; i + 32 <= n; i += 32) {
    v8 x0, x1, x2, x3;
    std::memcpy(&x0, a + i, sizeof(x0));
    std::memcpy(&x1, a + i + 8, sizeof(x1));
    std::memcpy(&x2, a + i + 16, sizeof(x2));
    std::memcpy(&x3, a + i + 24, sizeof(x3));
    s0 += x0;
    s1 += x1;
    s2 += x2;
    s3 += x3;
  }
  return ((s0 + s1) + (s2 + s3))[0];
}
#endif

float read_sum(const float* a, size_t n) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) return read_sum_avx512(a, n);
  if (__builtin_cpu_supports("avx2")) return read_sum_avx2(a, n);
#endif
  float s = 0;
  for (size_t i = 0; i < n; i += 16) s += a[i];  // touches every cache line
  return s;
}

}  // namespace

Bandwidth measure_bandwidth(const BandwidthOptions& o, ThreadPool* pool) {
  const size_t n = size_t(std::max<int64_t>(o.bytes, 1 << 20)) / sizeof(float);
  std::vector<float> a(n), b;
  for (size_t i = 0; i < n; ++i) a[i] = float(i & 1023);
  if (o.copy) b.assign(n, 1.0f);
  constexpr size_t kParts = 64;
  const size_t chunk = n / kParts;
  std::vector<double> copy_s, read_s;
  std::vector<float> partial(kParts);
  for (int r = 0; r < o.reps + 1; ++r) {
    if (o.copy) {
      const auto t0 = Clock::now();
      parallel_for(pool, kParts, [&](size_t begin, size_t end) {
        std::memcpy(b.data() + begin * chunk, a.data() + begin * chunk, (end - begin) * chunk * sizeof(float));
      });
      if (r > 0) copy_s.push_back(since(t0));
    }
    const auto t0 = Clock::now();
    parallel_for(pool, kParts, [&](size_t begin, size_t end) {
      for (size_t c = begin; c < end; ++c) partial[c] = read_sum(a.data() + c * chunk, chunk);
    });
    if (r > 0) read_s.push_back(since(t0));
  }
  volatile float sink = partial[0];
  (void)sink;
  const double gb = double(chunk * kParts * sizeof(float)) / 1e9;
  Bandwidth bw;
  bw.buffer_bytes = int64_t(n * sizeof(float));
  bw.threads = pool != nullptr ? pool->size() : 1;
  bw.read_gb_per_s = gb / median(read_s);
  bw.read_gb_per_s_best = gb / *std::min_element(read_s.begin(), read_s.end());
  bw.copy_gb_per_s = o.copy ? 2 * gb / median(copy_s) : 0.0;
  return bw;
}

std::string cpu_model_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

}  // namespace essaim
