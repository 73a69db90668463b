// ComputePool: clients take turns (a flood from one does not push another's task to the back), a cancelled
// client's queued tasks are destroyed unrun, lanes run tasks concurrently.
#include "worker/compute_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <vector>

namespace essaim::worker {
namespace {

using namespace std::chrono_literals;

// Holds the single lane until released, so that the queue can be filled in a known state.
struct Gate {
  std::promise<void> started, release;
};

TEST(ComputePool, ClientsTakeTurns) {
  ComputePool pool({.lanes = 1, .threads_per_lane = 1});
  auto gate = std::make_shared<Gate>();
  auto blocker = pool.client();
  ASSERT_TRUE(pool.submit(blocker, [gate](ThreadPool*) {
    gate->started.set_value();
    gate->release.get_future().wait();
  }));
  gate->started.get_future().wait();

  std::mutex mu;
  std::vector<char> order;
  auto flood = pool.client(), other = pool.client();
  for (int i = 0; i < 5; ++i)
    ASSERT_TRUE(pool.submit(flood, [&](ThreadPool*) { std::lock_guard l(mu); order.push_back('a'); }));
  for (int i = 0; i < 2; ++i)
    ASSERT_TRUE(pool.submit(other, [&](ThreadPool*) { std::lock_guard l(mu); order.push_back('b'); }));
  EXPECT_EQ(pool.queued(), 7u);
  std::promise<void> done;
  ASSERT_TRUE(pool.submit(flood, [&](ThreadPool*) { done.set_value(); }));
  gate->release.set_value();
  ASSERT_EQ(done.get_future().wait_for(5s), std::future_status::ready);
  std::lock_guard l(mu);
  EXPECT_EQ(std::string(order.begin(), order.end()), "ababaaa");
}

TEST(ComputePool, CancelDropsQueuedTasksUnrun) {
  ComputePool pool({.lanes = 1, .threads_per_lane = 2});
  auto gate = std::make_shared<Gate>();
  auto c = pool.client();
  ASSERT_TRUE(pool.submit(c, [gate](ThreadPool* tp) {
    EXPECT_NE(tp, nullptr);  // two threads per lane: a ThreadPool
    gate->started.set_value();
    gate->release.get_future().wait();
  }));
  gate->started.get_future().wait();
  std::atomic<int> ran{0};
  auto held = std::make_shared<int>(0);  // released when the queued tasks are destroyed
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(pool.submit(c, [&ran, held](ThreadPool*) { ++ran; }));
  EXPECT_EQ(held.use_count(), 4);
  pool.cancel(*c);
  EXPECT_EQ(held.use_count(), 1);
  EXPECT_EQ(pool.queued(), 0u);
  EXPECT_FALSE(pool.submit(c, [&ran](ThreadPool*) { ++ran; }));
  gate->release.set_value();
  // A fresh client still runs.
  std::promise<void> done;
  ASSERT_TRUE(pool.submit(pool.client(), [&](ThreadPool*) { done.set_value(); }));
  ASSERT_EQ(done.get_future().wait_for(5s), std::future_status::ready);
  EXPECT_EQ(ran.load(), 0);
}

TEST(ComputePool, LanesRunConcurrently) {
  ComputePool pool({.lanes = 2, .threads_per_lane = 1});
  EXPECT_EQ(pool.lanes(), 2u);
  // Two tasks that each wait for the other: they finish only if both run at once.
  std::promise<void> a, b;
  std::shared_future<void> fa = a.get_future().share(), fb = b.get_future().share();
  std::atomic<int> finished{0};
  ASSERT_TRUE(pool.submit(pool.client(), [&, fb](ThreadPool* tp) {
    EXPECT_EQ(tp, nullptr);
    a.set_value();
    if (fb.wait_for(5s) == std::future_status::ready) ++finished;
  }));
  ASSERT_TRUE(pool.submit(pool.client(), [&, fa](ThreadPool*) {
    b.set_value();
    if (fa.wait_for(5s) == std::future_status::ready) ++finished;
  }));
  for (int i = 0; i < 500 && finished.load() < 2; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(finished.load(), 2);
}

}  // namespace
}  // namespace essaim::worker
