#include "swarm_harness.h"

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <random>

namespace essaim::bench {

Result<std::unique_ptr<Swarm>> Swarm::start(const SwarmOptions& o) {
  if (o.worker_bin.empty()) return Status::error("no essaim-worker binary given");
  if (o.parts.empty() || o.replicas < 1) return Status::error("a swarm needs at least one part and one replica");
  std::unique_ptr<Swarm> s(new Swarm());
  s->worker_bin_ = o.worker_bin;
  s->replicas_ = o.replicas;
  s->nodes_.resize(o.parts.size() * size_t(o.replicas));
  for (size_t i = 0; i < s->nodes_.size(); ++i) {
    Node& n = s->nodes_[i];
    const int part = int(i) / o.replicas, replica = int(i) % o.replicas;
    n.slices = o.parts[size_t(part)];
    n.speed = o.speed ? o.speed(part, replica) : NodeSpeed{};
    ESSAIM_ASSIGN_OR_RETURN(n.process, start_worker(o.worker_bin, n.speed.threads, n.slices));
    // Every node gets a proxy, even without delay: it is what keeps the node's address across restarts.
    net::NetResult<std::unique_ptr<DelayProxy>> p = DelayProxy::start(
        "127.0.0.1", n.process.port, LinkDelay{.one_way = n.speed.one_way, .jitter = n.speed.jitter,
                                               .seed = o.seed * 1000003u + i});
    if (!p) return Status::error("delay proxy: " + p.error().message);
    n.proxy = std::move(*p);
  }
  return s;
}

Swarm::~Swarm() {
  // SIGTERM, then at most 5 s for each to exit before SIGKILL: a stuck worker never hangs the caller.
  const std::vector<WorkerProcess> live = live_processes();
  for (const WorkerProcess& p : live) ::kill(p.pid, SIGTERM);
  for (const WorkerProcess& p : live) {
    bool gone = false;
    for (int i = 0; i < 100 && !gone; ++i) {
      gone = ::waitpid(p.pid, nullptr, WNOHANG) == p.pid;
      if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!gone) {
      ::kill(p.pid, SIGKILL);
      ::waitpid(p.pid, nullptr, 0);
    }
  }
}

backbone::ExpertMap Swarm::map() const {
  backbone::ExpertMap m;
  for (size_t i = 0; i < nodes_.size(); ++i)
    m.workers.push_back({.address = nodes_[i].proxy->address(),
                         .label = "part " + std::to_string(part_of(i)) + " replica " + std::to_string(int(i) % replicas_),
                         .holdings = std::nullopt});
  return m;
}

std::vector<WorkerProcess> Swarm::live_processes() const {
  std::lock_guard lock(mu_);
  std::vector<WorkerProcess> out;
  for (const Node& n : nodes_)
    if (n.process.pid > 0) out.push_back(n.process);
  return out;
}

Status Swarm::kill(size_t node) {
  std::lock_guard lock(mu_);
  if (node >= nodes_.size()) return Status::error("no node " + std::to_string(node));
  Node& n = nodes_[node];
  if (n.process.pid <= 0) return Status::error("node " + std::to_string(node) + " is already down");
  ::kill(n.process.pid, SIGKILL);
  ::waitpid(n.process.pid, nullptr, 0);
  n.process = WorkerProcess{};
  return Status::ok();
}

Status Swarm::restart(size_t node) {
  std::lock_guard lock(mu_);
  if (node >= nodes_.size()) return Status::error("no node " + std::to_string(node));
  Node& n = nodes_[node];
  if (n.process.pid > 0) return Status::error("node " + std::to_string(node) + " is running");
  ESSAIM_ASSIGN_OR_RETURN(n.process, start_worker(worker_bin_, n.speed.threads, n.slices));
  n.proxy->retarget(n.process.port);
  ++n.restarts;
  return Status::ok();
}

bool Swarm::alive(size_t node) const {
  std::lock_guard lock(mu_);
  return node < nodes_.size() && nodes_[node].process.pid > 0;
}

uint64_t Swarm::restarts(size_t node) const {
  std::lock_guard lock(mu_);
  return node < nodes_.size() ? nodes_[node].restarts : 0;
}

std::vector<ChaosEvent> chaos_schedule(const ChaosPlan& p) {
  std::vector<ChaosEvent> out;
  if (p.kills <= 0 || p.nodes == 0 || p.last <= p.first) return out;
  std::mt19937_64 rng(p.seed);
  const uint64_t slot = std::max<uint64_t>(4, (p.last - p.first) / uint64_t(p.kills));
  std::vector<size_t> pool;  // victims not drawn yet in this round
  for (int k = 0; k < p.kills; ++k) {
    const uint64_t begin = p.first + uint64_t(k) * slot;
    if (pool.empty()) {
      pool = p.victims;
      if (pool.empty())
        for (size_t n = 0; n < p.nodes; ++n) pool.push_back(n);
    }
    const size_t pick = size_t(rng() % pool.size());
    const size_t node = pool[pick];
    pool.erase(pool.begin() + long(pick));
    const uint64_t kill_at = begin + rng() % (slot / 2);
    const uint64_t restart_at = begin + slot / 2 + rng() % std::max<uint64_t>(1, slot / 4);
    out.push_back({.at = kill_at, .node = node, .kind = ChaosEvent::Kind::KILL});
    out.push_back({.at = std::max(restart_at, kill_at + 1), .node = node, .kind = ChaosEvent::Kind::RESTART});
  }
  return out;
}

namespace {
std::vector<ChaosEvent> sorted_by_point(std::vector<ChaosEvent> events) {
  std::stable_sort(events.begin(), events.end(), [](const ChaosEvent& a, const ChaosEvent& b) { return a.at < b.at; });
  return events;
}
}  // namespace

ChaosRunner::ChaosRunner(Swarm& swarm, std::vector<ChaosEvent> events)
    : swarm_(swarm), events_(sorted_by_point(std::move(events))) {
  thread_ = std::thread([this] { run(); });
}

ChaosRunner::~ChaosRunner() { finish(std::chrono::milliseconds(0)); }

void ChaosRunner::progress(uint64_t count) {
  uint64_t seen = progress_.load();
  while (count > seen && !progress_.compare_exchange_weak(seen, count)) {
  }
  cv_.notify_one();
}

void ChaosRunner::finish(std::chrono::milliseconds wait) {
  {
    std::unique_lock lock(mu_);
    // Everything whose point was reached gets applied before the runner stops (bounded by `wait`).
    cv_.wait_for(lock, wait, [&] {
      size_t due = 0;
      for (const ChaosEvent& e : events_) due += e.at <= progress_.load() ? 1 : 0;
      return applied_.size() >= due;
    });
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::vector<ChaosRunner::Applied> ChaosRunner::applied() const {
  std::lock_guard lock(mu_);
  return applied_;
}

void ChaosRunner::run() {
  for (const ChaosEvent& e : events_) {
    {
      std::unique_lock lock(mu_);
      while (!stop_ && progress_.load() < e.at) cv_.wait_for(lock, std::chrono::milliseconds(5));
      if (stop_) return;
    }
    const uint64_t then = progress_.load();
    const Status s = e.kind == ChaosEvent::Kind::KILL ? swarm_.kill(e.node) : swarm_.restart(e.node);
    {
      std::lock_guard lock(mu_);
      applied_.push_back({.event = e, .progress_then = then, .error = s ? std::string() : s.message()});
    }
    cv_.notify_all();
  }
}

}  // namespace essaim::bench
