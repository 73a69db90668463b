// Compute shared fairly among a worker's connections: a few lanes (threads), each with its own ThreadPool
// for the matrix products of the task it runs, taking tasks round-robin across clients (connections).
//
//   ComputePool pool({.lanes = 1, .threads_per_lane = 4});
//   std::shared_ptr<ComputePool::Client> client = pool.client();         // one per connection
//   pool.submit(*client, [=](ThreadPool* tp) { ... compute, hand the answer to the connection ... });
//   pool.cancel(*client);                                                 // connection gone: drop its queue
//
// Why round-robin by client and not one FIFO: a backbone that floods requests (up to its in-flight limit)
// must not push the requests of another connection to the back of a long line. Why lanes own their
// ThreadPool: ThreadPool::parallel_for is not reentrant, and one request's products parallelise well
// (output rows), so a lane runs one request at a time on all its threads.
//
// Tasks never touch a connection's stream: a stalled reader on the other end can only ever stall that
// connection's own writer thread, never a lane.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/thread_pool.h"

namespace essaim::worker {

struct ComputePoolOptions {
  size_t lanes = 1;             // tasks running at once (>= 1)
  size_t threads_per_lane = 1;  // threads each task's products use (>= 1; 1 = no ThreadPool)
};

class ComputePool {
 public:
  using Task = std::function<void(ThreadPool* pool)>;  // pool is null when threads_per_lane == 1

  class Client {
   private:
    friend class ComputePool;
    std::deque<Task> tasks;  // guarded by the pool's mutex
    bool queued = false;     // in the pool's ready ring
    bool cancelled = false;
  };

  explicit ComputePool(ComputePoolOptions options);
  ~ComputePool();  // runs no further task; waits for running ones
  ComputePool(const ComputePool&) = delete;
  ComputePool& operator=(const ComputePool&) = delete;

  std::shared_ptr<Client> client() { return std::make_shared<Client>(); }
  // False (task dropped unrun) when the client was cancelled or the pool is stopping.
  bool submit(const std::shared_ptr<Client>& client, Task task);
  // Drops the client's queued tasks (destroying them, which releases what they hold) and refuses new ones.
  // A task already running finishes.
  void cancel(Client& client);

  size_t lanes() const { return lanes_.size(); }
  size_t queued() const;  // tasks waiting, over all clients

 private:
  void lane_loop(size_t index);

  ComputePoolOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Client>> ready_;  // clients with queued tasks, in turn order
  size_t queued_ = 0;
  bool stopping_ = false;
  std::vector<std::unique_ptr<ThreadPool>> pools_;  // one per lane (empty when threads_per_lane == 1)
  std::vector<std::thread> lanes_;
};

}  // namespace essaim::worker
