// A fixed pool of worker threads for data-parallel kernels.
//
//   ThreadPool pool(2);
//   pool.parallel_for(n_rows, [&](size_t begin, size_t end) { for (size_t i = begin; i < end; ++i) ...; });
//
// parallel_for splits [0, n) into contiguous chunks, one per thread, runs them (the caller's thread takes
// one chunk) and returns when all are done. Kernels must compute every output element the same way whatever
// chunk it lands in, so results never depend on the thread count (docs/invariants.md invariant 2).
//
// A decoded token runs a dozen or more parallel loops of a few hundred microseconds each, so how fast a
// sleeping thread wakes matters as much as the loop itself. Waiters (a worker between jobs, the caller
// waiting for the last chunk) first spin a short, adaptive time on pause instructions, and only then block
// on a condition variable. The spin budget of each waiter halves every time its spin ran out without the
// event, drops to the minimum when the spinning thread finds it was descheduled, and doubles back when
// spins succeed, so on a loaded machine (where a late event means a thread lost its CPU) waiters block
// almost at once and are woken like a plain futex pool's, instead of spinning on a CPU the late thread
// needs. A waiter never spins where its spin could only delay the thread it waits for: the caller blocks
// at once if a worker has not yet picked up the job, a worker if it runs on the CPU the caller last
// published from. ESSAIM_POOL_SPIN_US sets the largest budget in microseconds (default 50; 0 blocks at once,
// for a machine shared so heavily that spinning loses). docs/engine.md
// ("Decode as a memory stream") has the measurements.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace essaim {

class ThreadPool {
 public:
  explicit ThreadPool(size_t n_threads);  // 0 means std::thread::hardware_concurrency()
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  size_t size() const { return n_threads_; }

  // fn(begin, end) over contiguous chunks of [0, n). Not reentrant: call from one thread at a time.
  void parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn);

 private:
  // One waiter's adaptive spin budget (nanoseconds), touched only by its own thread.
  struct SpinBudget {
    int64_t ns;
  };
  void worker_loop(size_t index);

  size_t n_threads_;
  std::vector<std::thread> threads_;
  // Job hand-off: job_ and job_n_ are written before generation_ is released and read after it is acquired.
  const std::function<void(size_t, size_t)>* job_ = nullptr;
  size_t job_n_ = 0;
  alignas(64) std::atomic<uint64_t> generation_{0};
  alignas(64) std::atomic<size_t> pending_{0};  // worker chunks of the current job not yet finished
  alignas(64) std::atomic<size_t> started_{0};   // workers that picked up the current job
  std::atomic<int> caller_cpu_{-1};              // the caller's CPU when it published the job
  alignas(64) std::atomic<uint32_t> sleepers_{0};  // threads blocked (or about to block) on wake_ / done_
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable wake_;  // workers: a new generation or stop
  std::condition_variable done_;  // caller: pending_ reached 0
  SpinBudget caller_budget_;
};

// Runs fn over [0, n) on pool if given, else inline on the calling thread.
inline void parallel_for(ThreadPool* pool, size_t n, const std::function<void(size_t, size_t)>& fn) {
  if (pool && pool->size() > 1 && n > 1) pool->parallel_for(n, fn);
  else if (n > 0) fn(0, n);
}

}  // namespace essaim
