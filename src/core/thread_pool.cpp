#include "core/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#if defined(__linux__)
#include <sched.h>
#endif

namespace essaim {
namespace {

// Spin budget bounds per waiter. A decode step's parallel loops are separated by a few microseconds of
// serial work, and their chunks end within a few microseconds of each other when both threads run, so a
// spin of tens of microseconds would catch nearly every hand-off on a quiet machine; a hand-off later than
// that means a thread lost its CPU, and then blocking is cheaper than spinning (the budget halves).
// On the 2-vCPU VM measured (docs/engine.md), qwen3moe tg64 against blocking at once: quiet +8 %; with two
// competing busy processes +30 %; at load 8-10 (builds on top of those) -25 %. ESSAIM_POOL_SPIN_US=0 turns
// it off on a machine shared that heavily.
int64_t max_spin_ns() {
  static const int64_t v = [] {
    if (const char* s = std::getenv("ESSAIM_POOL_SPIN_US")) return int64_t(std::atoll(s)) * 1000;
    return int64_t(50'000);
  }();
  return v;
}
constexpr int64_t kMinSpinNs = 4'000;
// Two clock reads 32 pauses apart (~1-2 us) this far apart mean the spinning thread was descheduled.
constexpr int64_t kPreemptedNs = 20'000;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// The CPU the calling thread runs on, or -1 where the platform does not say.
int current_cpu() {
#if defined(__linux__)
  return sched_getcpu();
#else
  return -1;
#endif
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Spins until ready() or the budget runs out; adapts the budget; returns whether ready() became true.
//
// No sched_yield: a thread that yields or is preempted while spinning stays runnable, so the event it
// waits for wakes nobody and it gets the CPU back only when the scheduler's turn comes (milliseconds on a
// loaded machine), while a thread blocked on a condition variable is woken, and preempts, at once. So a
// spin that finds itself descheduled stops and drops the budget to the minimum (its waiter blocks from
// then on until spins succeed again), and an event seen only after the budget ran out counts as a miss.
template <typename Ready>
bool spin_until(const Ready& ready, int64_t& budget_ns) {
  const int64_t max_ns = max_spin_ns();
  if (max_ns <= 0) return ready();
  const int64_t start = now_ns();
  int64_t last = start;
  for (;;) {
    for (int i = 0; i < 32; ++i) {
      if (ready()) {
        budget_ns = std::min(max_ns, std::max(kMinSpinNs, budget_ns * 2));
        return true;
      }
      cpu_relax();
    }
    const int64_t t = now_ns();
    if (t - last > kPreemptedNs) {
      budget_ns = kMinSpinNs;
      return ready();
    }
    last = t;
    if (t - start >= budget_ns) break;
  }
  budget_ns = std::max(kMinSpinNs, budget_ns / 2);
  return ready();
}

}  // namespace

ThreadPool::ThreadPool(size_t n_threads) {
  if (n_threads == 0) n_threads = std::max(1u, std::thread::hardware_concurrency());
  n_threads_ = n_threads;
  caller_budget_.ns = max_spin_ns();
  for (size_t i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
}

static void chunk_of(size_t n, size_t parts, size_t index, size_t* begin, size_t* end) {
  const size_t base = n / parts, extra = n % parts;
  *begin = index * base + std::min(index, extra);
  *end = *begin + base + (index < extra ? 1 : 0);
}

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn) {
  const size_t parts = std::min(n, n_threads_);
  if (parts <= 1) {
    if (n > 0) fn(0, n);
    return;
  }
  job_ = &fn;
  job_n_ = n;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  started_.store(0, std::memory_order_relaxed);
  caller_cpu_.store(current_cpu(), std::memory_order_relaxed);
  // seq_cst store then seq_cst load of sleepers_, against a worker's seq_cst increment of sleepers_ then
  // load of generation_: either the worker sees the new generation or we see it asleep and wake it.
  generation_.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) != 0) {
    { std::lock_guard<std::mutex> lock(mu_); }
    wake_.notify_all();
  }
  size_t b, e;
  chunk_of(n, n_threads_, 0, &b, &e);
  if (b < e) fn(b, e);
  const auto finished = [&] { return pending_.load(std::memory_order_acquire) == 0; };
  // Spin only while every worker is running its chunk: one that has not started is waiting for a CPU
  // (perhaps this one), and blocking is what lets it run.
  const bool all_running = started_.load(std::memory_order_acquire) == n_threads_ - 1;
  if (!(all_running && spin_until(finished, caller_budget_.ns)) && !finished()) {
    std::unique_lock<std::mutex> lock(mu_);
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    done_.wait(lock, finished);
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
  }
  job_ = nullptr;
}

void ThreadPool::worker_loop(size_t index) {
  uint64_t seen = 0;
  SpinBudget budget{max_spin_ns()};
  for (;;) {
    const auto woken = [&] {
      return stop_.load(std::memory_order_relaxed) || generation_.load(std::memory_order_acquire) != seen;
    };
    // A worker queued on the caller's CPU would only delay the caller by spinning: it blocks at once.
    const int cpu = current_cpu();
    const bool shares_cpu = cpu >= 0 && cpu == caller_cpu_.load(std::memory_order_relaxed);
    if (!(!shares_cpu && spin_until(woken, budget.ns)) && !woken()) {
      std::unique_lock<std::mutex> lock(mu_);
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      wake_.wait(lock, woken);
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = generation_.load(std::memory_order_acquire);
    started_.fetch_add(1, std::memory_order_release);
    size_t b, e;
    chunk_of(job_n_, n_threads_, index, &b, &e);
    if (b < e) (*job_)(b, e);
    // The last worker to finish wakes the caller if it went to sleep (same pattern as the job hand-off).
    if (pending_.fetch_sub(1, std::memory_order_seq_cst) == 1 && sleepers_.load(std::memory_order_seq_cst) != 0) {
      { std::lock_guard<std::mutex> lock(mu_); }
      done_.notify_all();
    }
  }
}

}  // namespace essaim
