// The machine's memory bandwidth, measured the way decode uses memory: a STREAM-like copy and a pure read
// stream over buffers far larger than the caches, split over a thread pool like the kernels split rows.
// Decode of a big MoE model streams its weights once per token, so `read_gb_per_s` is its roofline.
//
//   ThreadPool pool(2);
//   Bandwidth bw = measure_bandwidth({.bytes = 512 << 20, .reps = 5}, &pool);   // bw.read_gb_per_s
#pragma once

#include <cstdint>
#include <string>

#include "core/thread_pool.h"

namespace essaim {

struct BandwidthOptions {
  int64_t bytes = int64_t(1) << 30;  // per buffer (the copy uses two)
  int reps = 5;                      // timed repetitions, medians reported; one more warms up
  bool copy = true;                  // also time the copy (needs a second buffer)
};

struct Bandwidth {
  int64_t buffer_bytes = 0;
  size_t threads = 0;
  double read_gb_per_s = 0;  // bytes read / s, widest vector loads the CPU has (median of the repetitions)
  double read_gb_per_s_best = 0;  // the fastest repetition: on a shared machine, the least disturbed one
  double copy_gb_per_s = 0;  // (read + written) / s, as STREAM counts them; 0 when not measured
};

Bandwidth measure_bandwidth(const BandwidthOptions& o, ThreadPool* pool);

// "model name" of /proc/cpuinfo, or "unknown".
std::string cpu_model_name();

}  // namespace essaim
