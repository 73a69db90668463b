// A fixed pool of worker threads for data-parallel kernels.
//
//   ThreadPool pool(2);
//   pool.parallel_for(n_rows, [&](size_t begin, size_t end) { for (size_t i = begin; i < end; ++i) ...; });
//
// parallel_for splits [0, n) into contiguous chunks, one per thread, runs them (the caller's thread takes
// one chunk) and returns when all are done. Kernels must compute every output element the same way whatever
// chunk it lands in, so results never depend on the thread count (docs/invariants.md invariant 2).
#pragma once

#include <condition_variable>
#include <cstddef>
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
  void worker_loop(size_t index);

  size_t n_threads_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(size_t, size_t)>* job_ = nullptr;
  size_t job_n_ = 0;
  size_t generation_ = 0;
  size_t pending_ = 0;
  bool stop_ = false;
};

// Runs fn over [0, n) on pool if given, else inline on the calling thread.
inline void parallel_for(ThreadPool* pool, size_t n, const std::function<void(size_t, size_t)>& fn) {
  if (pool && pool->size() > 1 && n > 1) pool->parallel_for(n, fn);
  else if (n > 0) fn(0, n);
}

}  // namespace essaim
