#include "swarm_requests.h"

#include <condition_variable>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

namespace essaim::bench {

using Clock = std::chrono::steady_clock;

std::vector<serve::SequenceRequest> greedy_requests(const Model& m, int n, int prompt_tokens, int max_tokens,
                                                    uint64_t seed) {
  std::vector<serve::SequenceRequest> out;
  const uint32_t vocab = uint32_t(m.info().n_vocab);
  for (int i = 0; i < n; ++i) {
    std::mt19937_64 rng(seed * 7919u + uint64_t(i));
    serve::SequenceRequest r;
    for (int t = 0; t < prompt_tokens; ++t) r.prompt.push_back(TokenId(rng() % vocab));
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    out.push_back(std::move(r));
  }
  return out;
}

namespace {

// What the sinks write, shared with them: the Scheduler's destructor may still deliver CANCELLED events.
struct Collect {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<ServedRequest> results;
  std::vector<Clock::time_point> submitted;
  std::vector<bool> done;
  size_t remaining = 0;
  uint64_t generated = 0;
  Clock::time_point last_done;
};

}  // namespace

Result<ServedRun> serve_concurrently(const Model& m, ExpertExecutor* experts, ThreadPool* pool,
                                     const std::vector<serve::SequenceRequest>& requests,
                                     serve::SchedulerOptions options, std::chrono::milliseconds give_up,
                                     const std::function<void(uint64_t)>& on_tokens) {
  auto c = std::make_shared<Collect>();
  c->results.resize(requests.size());
  c->submitted.resize(requests.size());
  c->done.assign(requests.size(), false);
  c->remaining = requests.size();
  serve::Scheduler sched(m, experts, pool, options);
  std::vector<std::shared_ptr<serve::SequenceHandle>> handles;
  const Clock::time_point t0 = Clock::now();
  for (size_t i = 0; i < requests.size(); ++i) {
    {
      std::lock_guard lock(c->mu);
      c->submitted[i] = Clock::now();
    }
    serve::SubmitResult r = sched.submit(requests[i], [c, i, on_tokens](const serve::SequenceEvent& e) {
      uint64_t total = 0;
      {
        std::lock_guard lock(c->mu);
        ServedRequest& out = c->results[i];
        const auto now = Clock::now();
        if (out.tokens.empty() && !e.tokens.empty())
          out.first_token_s = std::chrono::duration<double>(now - c->submitted[i]).count();
        out.tokens.insert(out.tokens.end(), e.tokens.begin(), e.tokens.end());
        c->generated += e.tokens.size();
        total = c->generated;
        if (e.done && !c->done[i]) {
          c->done[i] = true;
          out.reason = e.reason;
          out.error = e.error;
          out.latency_s = std::chrono::duration<double>(now - c->submitted[i]).count();
          c->last_done = now;
          --c->remaining;
          c->cv.notify_all();
        }
      }
      if (on_tokens && !e.tokens.empty()) on_tokens(total);
    });
    if (!r.handle) return Status::error("request " + std::to_string(i) + " refused: " + r.message);
    handles.push_back(r.handle);
  }
  ServedRun run;
  {
    std::unique_lock lock(c->mu);
    if (!c->cv.wait_for(lock, give_up, [&] { return c->remaining == 0; })) {
      const size_t left = c->remaining;
      lock.unlock();
      for (auto& h : handles) h->cancel();
      return Status::error(std::to_string(left) + " of " + std::to_string(requests.size()) +
                           " requests were not done after " + std::to_string(give_up.count()) + " ms");
    }
    run.requests = c->results;
    run.generated = c->generated;
    run.wall_s = std::chrono::duration<double>(c->last_done - t0).count();
  }
  // The last step's counters are published after its final events: wait (bounded) for the step to end.
  const auto until = Clock::now() + std::chrono::seconds(5);
  run.scheduler = sched.stats();
  while ((run.scheduler.active > 0 || run.scheduler.queued > 0) && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    run.scheduler = sched.stats();
  }
  return run;
}

}  // namespace essaim::bench
