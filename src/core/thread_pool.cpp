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

// A range word: tag (the job's generation, 24 bits) | front (20 bits) | back (20 bits), in units.
constexpr int kEdgeBits = 20;
constexpr uint64_t kEdgeMask = (uint64_t(1) << kEdgeBits) - 1;
constexpr uint64_t kTagMask = (uint64_t(1) << (64 - 2 * kEdgeBits)) - 1;
constexpr uint64_t kMaxUnits = kEdgeMask;
inline uint64_t pack(uint64_t tag, uint64_t front, uint64_t back) {
  return (tag & kTagMask) << (2 * kEdgeBits) | front << kEdgeBits | back;
}
inline uint64_t tag_of(uint64_t w) { return w >> (2 * kEdgeBits); }
inline uint64_t front_of(uint64_t w) { return (w >> kEdgeBits) & kEdgeMask; }
inline uint64_t back_of(uint64_t w) { return w & kEdgeMask; }

}  // namespace

ThreadPool::ThreadPool(size_t n_threads) {
  if (n_threads == 0) n_threads = std::max(1u, std::thread::hardware_concurrency());
  n_threads_ = n_threads;
  ranges_ = std::vector<Range>(n_threads_);
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

// Claims a piece of `owner`'s range of the job tagged `tag`: from the front (the owner: an eighth of what
// is left) or from the back (another thread: a sixteenth). False when the range is empty or belongs to
// another job.
bool ThreadPool::claim(size_t owner, uint64_t tag, bool from_front, uint64_t* begin, uint64_t* end) {
  std::atomic<uint64_t>& word = ranges_[owner].word;
  uint64_t w = word.load(std::memory_order_acquire);
  for (;;) {
    const uint64_t f = front_of(w), b = back_of(w);
    if (tag_of(w) != (tag & kTagMask) || f >= b) return false;
    const uint64_t left = b - f;
    const uint64_t take = from_front ? (left + 7) / 8 : (left + 15) / 16;
    const uint64_t nw = from_front ? pack(tag, f + take, b) : pack(tag, f, b - take);
    if (word.compare_exchange_weak(w, nw, std::memory_order_acq_rel, std::memory_order_acquire)) {
      *begin = from_front ? f : b - take;
      *end = from_front ? f + take : b;
      return true;
    }
  }
}

// Runs pieces of the job tagged `tag`: this thread's own range, then what is left of the others'.
void ThreadPool::run_job(size_t self, uint64_t tag, const std::function<void(size_t, size_t)>& fn) {
  const size_t unit = job_unit_.load(std::memory_order_relaxed), n = job_n_.load(std::memory_order_relaxed);
  uint64_t b, e;
  for (size_t k = 0; k < n_threads_; ++k) {
    const size_t owner = (self + k) % n_threads_;
    while (claim(owner, tag, k == 0, &b, &e)) {
      fn(size_t(b) * unit, std::min(n, size_t(e) * unit));
      // The thread that finishes the last unit wakes the caller if it went to sleep (the same pattern as
      // the job hand-off); the caller itself never sleeps while it can still claim.
      if (remaining_.fetch_sub(e - b, std::memory_order_seq_cst) == e - b && self != 0 &&
          sleepers_.load(std::memory_order_seq_cst) != 0) {
        { std::lock_guard<std::mutex> lock(mu_); }
        done_.notify_all();
      }
    }
  }
}

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn) {
  const size_t parts = std::min(n, n_threads_);
  if (parts <= 1) {
    if (n > 0) fn(0, n);
    return;
  }
  const size_t unit = (n + kMaxUnits - 1) / kMaxUnits;
  const size_t units = (n + unit - 1) / unit;
  const uint64_t tag = generation_.load(std::memory_order_relaxed) + 1;
  job_.store(&fn, std::memory_order_relaxed);
  job_n_.store(n, std::memory_order_relaxed);
  job_unit_.store(unit, std::memory_order_relaxed);
  for (size_t i = 0; i < n_threads_; ++i) {
    size_t b, e;
    chunk_of(units, n_threads_, i, &b, &e);
    ranges_[i].word.store(pack(tag, b, e), std::memory_order_relaxed);
  }
  remaining_.store(units, std::memory_order_relaxed);
  caller_cpu_.store(current_cpu(), std::memory_order_relaxed);
  // seq_cst store then seq_cst load of sleepers_, against a worker's seq_cst increment of sleepers_ then
  // load of generation_: either the worker sees the new generation or we see it asleep and wake it.
  generation_.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) != 0) {
    { std::lock_guard<std::mutex> lock(mu_); }
    wake_.notify_all();
  }
  run_job(0, tag, fn);
  // Nothing is left to claim: what remains runs on workers that claimed it, so a short spin usually sees
  // it end.
  const auto finished = [&] { return remaining_.load(std::memory_order_acquire) == 0; };
  if (!spin_until(finished, caller_budget_.ns) && !finished()) {
    std::unique_lock<std::mutex> lock(mu_);
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    done_.wait(lock, finished);
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
  }
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
    // job_ may already belong to a later job than `seen`; then every claim below fails and it never runs.
    const std::function<void(size_t, size_t)>* job = job_.load(std::memory_order_relaxed);
    if (job != nullptr) run_job(index, seen, *job);
  }
}

}  // namespace essaim
