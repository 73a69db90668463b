// The many-node harness, shared by tests and benchmarks: N `essaim-worker` processes on loopback, each behind
// its own DelayProxy (a per-link round trip with seeded jitter), replicas of different speeds, a seeded
// schedule of SIGKILLs and restarts applied while the backbone serves, and (swarm_requests.h) concurrent
// requests through the serve scheduler. Not a production path: only bench/ and tests link it.
//
//   SwarmOptions o{.worker_bin = bin, .parts = model.split_experts(3), .replicas = 2,
//                  .speed = [](int part, int replica) { return NodeSpeed{.one_way = 1ms * (1 + 3 * replica)}; }};
//   ESSAIM_ASSIGN_OR_RETURN(std::unique_ptr<Swarm> swarm, Swarm::start(o));
//   auto ex = remote_executor_for_model(model, swarm->map(), &pool, options);   // the proxies' addresses
//   ChaosRunner chaos(*swarm, chaos_schedule({.seed = 7, .kills = 3, .nodes = 6, .replicas = 2, ...}));
//   chaos.progress(tokens_so_far);   // events fire when the traffic reaches their seeded point
//
// A node keeps its proxy address for the whole run: a restarted worker listens on a new OS-chosen port and
// its proxy is retargeted there (DelayProxy::retarget), so the backbone reconnects to the address it has,
// as it would to a machine that came back under the same name. The restart is a new process started from
// the same slices: it announces the same holdings and passes the same weights check.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backbone/expert_map.h"
#include "core/status.h"
#include "delay_proxy.h"
#include "worker_processes.h"

namespace essaim::bench {

// How fast one node is: its link's one-way delay and jitter (applied both ways), its worker's threads.
struct NodeSpeed {
  std::chrono::microseconds one_way{0};
  std::chrono::microseconds jitter{0};
  int threads = 1;
};

struct SwarmOptions {
  std::string worker_bin;                          // essaim-worker
  std::vector<std::vector<std::string>> parts;     // the slices of each part (an expert range of every layer)
  int replicas = 1;                                // workers per part
  std::function<NodeSpeed(int part, int replica)> speed;  // null: no delay, 1 thread
  uint64_t seed = 1;                               // the links' jitter draws
};

class Swarm {
 public:
  // Node i = part i / replicas, replica i % replicas; all started (each waits for its "listening on").
  static Result<std::unique_ptr<Swarm>> start(const SwarmOptions& options);
  ~Swarm();  // SIGTERM to every live worker and wait; proxies closed (close the backbone's links first)
  Swarm(const Swarm&) = delete;
  Swarm& operator=(const Swarm&) = delete;

  size_t size() const { return nodes_.size(); }
  int part_of(size_t node) const { return int(node) / replicas_; }
  // The proxies' addresses in node order, labelled "part P replica R" (holdings: what each announces).
  backbone::ExpertMap map() const;
  std::vector<WorkerProcess> live_processes() const;  // for CPU accounting

  Status kill(size_t node);     // SIGKILL and reap; the proxy refuses new connections until restart
  Status restart(size_t node);  // a new process on a new port, the proxy pointed at it
  bool alive(size_t node) const;
  uint64_t restarts(size_t node) const;

 private:
  struct Node {
    std::vector<std::string> slices;
    NodeSpeed speed;
    std::unique_ptr<DelayProxy> proxy;
    WorkerProcess process;  // pid -1 while down
    uint64_t restarts = 0;
  };
  Swarm() = default;
  std::string worker_bin_;
  int replicas_ = 1;
  mutable std::mutex mu_;
  std::vector<Node> nodes_;  // guarded by mu_ (the vector itself is fixed after start)
};

// One fault: at `at` (a point of the traffic: the caller's progress count, e.g. generated tokens) kill or
// restart `node`.
struct ChaosEvent {
  enum class Kind : uint8_t { KILL, RESTART };
  uint64_t at = 0;
  size_t node = 0;
  Kind kind = Kind::KILL;
};

struct ChaosPlan {
  uint64_t seed = 1;
  int kills = 3;         // each followed by the restart of the same node
  size_t nodes = 0;
  int replicas = 1;      // nodes of a part are consecutive (Swarm's order)
  uint64_t first = 0;    // the events fall in [first, last) of the progress count
  uint64_t last = 100;
  std::vector<size_t> victims;  // the nodes that may be killed; empty: any
};

// Seeded: kill k falls in the k-th of `kills` equal slots of [first, last), at a drawn point of its first
// half, and its restart at a drawn point of the slot's third quarter, so one node at most is down at any
// time and a part with 2+ replicas always has a live one. Victims are drawn without replacement among
// `victims` (all nodes when empty), the pool refilled once every one was hit, so faults spread out.
std::vector<ChaosEvent> chaos_schedule(const ChaosPlan& plan);

// Applies a schedule from its own thread as progress() reports the traffic passing each event's point
// (kills and restarts take milliseconds, so the serving thread never waits for them). Bounded: the thread
// re-checks every 5 ms and leaves on finish() or destruction.
class ChaosRunner {
 public:
  ChaosRunner(Swarm& swarm, std::vector<ChaosEvent> events);
  ~ChaosRunner();  // finish()
  void progress(uint64_t count);  // any thread; monotone
  // Waits (at most `wait`) until every event whose point was reached has been applied, then stops.
  void finish(std::chrono::milliseconds wait = std::chrono::milliseconds(30000));

  struct Applied {
    ChaosEvent event;
    uint64_t progress_then = 0;  // the count when it was applied
    std::string error;           // empty: done
  };
  std::vector<Applied> applied() const;

 private:
  void run();
  Swarm& swarm_;
  const std::vector<ChaosEvent> events_;  // sorted by `at`
  std::atomic<uint64_t> progress_{0};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<Applied> applied_;  // guarded by mu_
  std::thread thread_;
};

}  // namespace essaim::bench
