#include "worker/compute_pool.h"

#include <algorithm>

namespace essaim::worker {

ComputePool::ComputePool(ComputePoolOptions options) : options_(options) {
  options_.lanes = std::max<size_t>(options_.lanes, 1);
  options_.threads_per_lane = std::max<size_t>(options_.threads_per_lane, 1);
  for (size_t i = 0; i < options_.lanes; ++i) {
    if (options_.threads_per_lane > 1) pools_.push_back(std::make_unique<ThreadPool>(options_.threads_per_lane));
    lanes_.emplace_back([this, i] { lane_loop(i); });
  }
}

ComputePool::~ComputePool() {
  std::deque<std::shared_ptr<Client>> dropped;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    dropped.swap(ready_);
  }
  cv_.notify_all();
  for (std::thread& t : lanes_) t.join();
  // Queued tasks are destroyed here, outside the lock: their destructors may take other locks.
  for (auto& c : dropped) c->tasks.clear();
}

bool ComputePool::submit(const std::shared_ptr<Client>& client, Task task) {
  {
    std::lock_guard lock(mu_);
    if (stopping_ || client->cancelled) return false;
    client->tasks.push_back(std::move(task));
    ++queued_;
    if (!client->queued) {
      client->queued = true;
      ready_.push_back(client);
    }
  }
  cv_.notify_one();
  return true;
}

void ComputePool::cancel(Client& client) {
  std::deque<Task> dropped;
  {
    std::lock_guard lock(mu_);
    client.cancelled = true;
    queued_ -= client.tasks.size();
    dropped.swap(client.tasks);  // the client stays in ready_ until a lane pops it and finds nothing
  }
}

size_t ComputePool::queued() const {
  std::lock_guard lock(mu_);
  return queued_;
}

void ComputePool::lane_loop(size_t index) {
  ThreadPool* pool = pools_.empty() ? nullptr : pools_[index].get();
  for (;;) {
    Task task;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !ready_.empty(); });
      if (stopping_) return;
      std::shared_ptr<Client> c = std::move(ready_.front());
      ready_.pop_front();
      if (c->tasks.empty()) {  // cancelled meanwhile
        c->queued = false;
        continue;
      }
      task = std::move(c->tasks.front());
      c->tasks.pop_front();
      --queued_;
      // Back of the ring: every other client with work gets a turn before this one's next task.
      if (c->tasks.empty()) c->queued = false;
      else ready_.push_back(std::move(c));
    }
    task(pool);
  }
}

}  // namespace essaim::worker
