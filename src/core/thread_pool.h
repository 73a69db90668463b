// A fixed pool of worker threads for data-parallel kernels.
//
//   ThreadPool pool(2);
//   pool.parallel_for(n_rows, [&](size_t begin, size_t end) { for (size_t i = begin; i < end; ++i) ...; });
//
// parallel_for splits [0, n) into one contiguous range per thread (the caller's thread takes the first) and
// returns when every index has run. A thread takes its own range from the front, a piece at a time
// (guided: an eighth of what is left, so its weight stream stays contiguous), and a thread whose range is
// done takes small pieces from the back of another's (a sixteenth of what is left). A worker that wakes late,
// or not at all before the others finish, thus delays the job by at most one piece instead of its whole
// range. So fn may run several times per thread, on any contiguous sub-ranges of [0, n), and more than
// one thread may run pieces of one range; kernels must compute every output element the same way whatever
// piece it lands in, so results never depend on the thread count (docs/invariants.md invariant 2).
//
// A decoded token runs a dozen or more parallel loops of a few hundred microseconds each, so how fast a
// sleeping thread wakes matters as much as the loop itself. Waiters (a worker between jobs, the caller
// waiting for the last piece) first spin a short, adaptive time on pause instructions, and only then block
// on a condition variable. The spin budget of each waiter halves every time its spin ran out without the
// event, drops to the minimum when the spinning thread finds it was descheduled, and doubles back when
// spins succeed, so on a loaded machine (where a late event means a thread lost its CPU) waiters block
// almost at once and are woken like a plain futex pool's, instead of spinning on a CPU the late thread
// needs. A worker never spins where its spin could only delay the thread it waits for: it blocks at once
// if it runs on the CPU the caller last published from. (The caller waits only once nothing is left to
// claim, that is, for pieces that workers are running.) ESSAIM_POOL_SPIN_US sets the largest budget in
// microseconds (default 50; 0 blocks at once, for a machine shared so heavily that spinning loses).
// docs/engine.md ("Decode as a memory stream", "A pool that shares out the tail") has the measurements.
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
  // One thread's range of the current job, in units: the job's tag | front | back, packed so that one
  // compare-and-swap claims a piece and proves the job is still the one the claimer read.
  struct alignas(64) Range {
    std::atomic<uint64_t> word{0};
  };
  bool claim(size_t owner, uint64_t tag, bool from_front, uint64_t* begin, uint64_t* end);
  void run_job(size_t self, uint64_t tag, const std::function<void(size_t, size_t)>& fn);

  // Job hand-off: job_, job_n_, job_unit_ and the ranges are written before generation_ is released and
  // read after it is acquired. A worker that read a stale job_ can never run it: its claims carry the tag
  // of the generation it saw, and a finished job has no units left to claim.
  // (A worker stopped for 2^24 jobs between reading generation_ and claiming could be fooled by a tag that
  // wrapped around; nothing else can.)
  std::atomic<const std::function<void(size_t, size_t)>*> job_{nullptr};
  std::atomic<size_t> job_n_{0};
  std::atomic<size_t> job_unit_{1};  // indices per unit (1 unless n exceeds what a range word can count)
  std::vector<Range> ranges_;
  alignas(64) std::atomic<uint64_t> generation_{0};
  alignas(64) std::atomic<uint64_t> remaining_{0};  // units of the current job not yet finished
  std::atomic<int> caller_cpu_{-1};              // the caller's CPU when it published the job
  alignas(64) std::atomic<uint32_t> sleepers_{0};  // threads blocked (or about to block) on wake_ / done_
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable wake_;  // workers: a new generation or stop
  std::condition_variable done_;  // caller: remaining_ reached 0
  SpinBudget caller_budget_;
};

// Runs fn over [0, n) on pool if given, else inline on the calling thread.
inline void parallel_for(ThreadPool* pool, size_t n, const std::function<void(size_t, size_t)>& fn) {
  if (pool && pool->size() > 1 && n > 1) pool->parallel_for(n, fn);
  else if (n > 0) fn(0, n);
}

}  // namespace essaim
