#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace essaim {
namespace {

TEST(ThreadPool, CoversEveryIndexExactlyOnce) {
  for (size_t threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (size_t n : {0, 1, 2, 7, 1000}) {
      std::vector<std::atomic<int>> hits(n);
      pool.parallel_for(n, [&](size_t b, size_t e) {
        for (size_t i = b; i < e; ++i) hits[i]++;
      });
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << threads << " " << n << " " << i;
    }
  }
}

TEST(ThreadPool, ReusableManyTimes) {
  ThreadPool pool(2);
  std::atomic<long> sum{0};
  for (int rep = 0; rep < 2000; ++rep)
    pool.parallel_for(10, [&](size_t b, size_t e) { for (size_t i = b; i < e; ++i) sum += long(i); });
  EXPECT_EQ(sum.load(), 2000L * 45);
}

// Hand-offs later than any spin budget: the workers and the caller must block and be woken.
TEST(ThreadPool, WakesSleepingWorkersAndCaller) {
  for (size_t threads : {2, 3}) {
    ThreadPool pool(threads);
    std::atomic<long> sum{0};
    for (int rep = 0; rep < 20; ++rep) {
      std::this_thread::sleep_for(std::chrono::milliseconds(rep % 2 ? 2 : 0));  // workers idle past the spin
      pool.parallel_for(threads, [&](size_t b, size_t e) {
        // A worker's chunk far slower than the caller's: the caller waits past its spin.
        if (b != 0 && rep % 3 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
        for (size_t i = b; i < e; ++i) sum += long(i) + 1;
      });
    }
    EXPECT_EQ(sum.load(), 20L * long(threads * (threads + 1) / 2)) << threads;
  }
}

// Back-to-back tiny jobs (the decode pattern): every chunk runs once per job, none is lost or repeated.
TEST(ThreadPool, BackToBackTinyJobs) {
  ThreadPool pool(3);
  std::vector<long> per_index(3, 0);
  for (int rep = 0; rep < 20000; ++rep)
    pool.parallel_for(3, [&](size_t b, size_t e) { for (size_t i = b; i < e; ++i) per_index[i]++; });
  for (long v : per_index) EXPECT_EQ(v, 20000);
}

}  // namespace
}  // namespace essaim
