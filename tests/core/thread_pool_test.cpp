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

// A thread whose range is done takes pieces from the back of another's: here the worker's first piece
// stalls, and the caller, done with its own half, runs the end of the worker's half.
TEST(ThreadPool, AThreadDoneEarlyTakesPiecesOfAnother) {
  ThreadPool pool(2);
  constexpr size_t kN = 1000;
  std::vector<std::atomic<int>> hits(kN);
  std::vector<std::thread::id> ran_by(kN);
  const std::thread::id caller = std::this_thread::get_id();
  pool.parallel_for(kN, [&](size_t b, size_t e) {
    if (b == kN / 2 && std::this_thread::get_id() != caller) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (size_t i = b; i < e; ++i) {
      hits[i]++;
      ran_by[i] = std::this_thread::get_id();
    }
  });
  size_t stolen = 0;
  for (size_t i = 0; i < kN; ++i) {
    ASSERT_EQ(hits[i].load(), 1) << i;
    if (i >= kN / 2 && ran_by[i] == caller) ++stolen;
  }
  EXPECT_GT(stolen, 0u);
}

// Jobs of every size, back to back, some with slow pieces: workers that wake late for a job, or find it
// already done by the others, never run a piece twice, never run a finished job's function, never lose one.
TEST(ThreadPool, LateWorkersNeverRunAFinishedJob) {
  for (size_t threads : {2, 3, 4}) {
    ThreadPool pool(threads);
    for (int rep = 0; rep < 3000; ++rep) {
      const size_t n = size_t(rep % 37);
      std::vector<int> hits(n, 0);  // plain ints: a piece run twice or concurrently would be a data race
      std::atomic<bool> job_open{true};
      pool.parallel_for(n, [&](size_t b, size_t e) {
        ASSERT_TRUE(job_open.load());
        if (rep % 97 == 0 && b > 0) std::this_thread::sleep_for(std::chrono::microseconds(300));
        for (size_t i = b; i < e; ++i) hits[i]++;
      });
      job_open = false;
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i], 1) << threads << " " << rep << " " << i;
    }
  }
}

// More indices than a range word counts: they run in units of several indices, still each exactly once.
TEST(ThreadPool, MoreIndicesThanARangeWordCounts) {
  ThreadPool pool(3);
  constexpr size_t kN = (size_t(1) << 21) + 12345;
  std::vector<std::atomic<uint8_t>> hits(kN);
  pool.parallel_for(kN, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) hits[i].fetch_add(1, std::memory_order_relaxed);
  });
  for (size_t i = 0; i < kN; ++i) ASSERT_EQ(hits[i].load(), 1) << i;
}

}  // namespace
}  // namespace essaim
