#include <cmath>

#include "sim/sim_world.h"

namespace essaim::sim {

IdlePool::IdlePool(World& w)
    : w_(w), phase_(w.workers.size(), 0), mu_(sg4::Mutex::create()), changed_(sg4::ConditionVariable::create()) {
  for (size_t i = 0; i < w.workers.size(); ++i) wake_.push_back(sg4::Semaphore::create(0));
  w.market->set_on_change([this] { changed_->notify_one(); });
}

bool IdlePool::wait(size_t i, double next_tick, double until) {
  const double hb = double(w_.sc.heartbeat_s);
  phase_[i] = std::fmod(next_tick, hb);
  by_phase_.insert({phase_[i], i});
  changed_->notify_one();
  const bool timed_out = wake_[i]->acquire_timeout(std::max(0.0, until - World::now_s()));
  if (timed_out) by_phase_.erase({phase_[i], i});
  // The heartbeats (each with a volunteer call: an idle node has room) it made meanwhile, all told nothing.
  const double last = World::now_s() - (timed_out ? 0.0 : 1e-9);
  const double ticks = last >= next_tick ? std::floor((last - next_tick) / hb) + 1 : 0;
  w_.market->count_idle_requests(uint64_t(ticks), uint64_t(ticks));
  return !timed_out;
}

void IdlePool::dispatch() {
  const double hb = double(w_.sc.heartbeat_s);
  std::unique_lock lock(*mu_);
  while (World::now_s() < w_.end_s) {
    const double left = w_.end_s - World::now_s();
    if (by_phase_.empty() || w_.market->nothing_needed(World::now_ms())) {
      double timeout = left;
      if (!by_phase_.empty()) timeout = std::min(left, double(w_.market->needed_valid_until() - World::now_ms()) / 1e3);
      changed_->wait_for(lock, std::max(1e-3, timeout));
      continue;
    }
    // Something is needed: the idle node whose heartbeat comes first is the one that asks. Until its tick,
    // a change (or another node going idle) makes the pool look again.
    const double now_phase = std::fmod(World::now_s(), hb);
    auto it = by_phase_.lower_bound({now_phase - 1e-6, 0});
    if (it == by_phase_.end()) it = by_phase_.begin();
    const double wait = std::fmod(it->first - now_phase + 2 * hb, hb);
    if (wait > 1e-6 && wait < hb - 1e-6) {
      changed_->wait_for(lock, wait);
      continue;
    }
    const size_t i = it->second;
    by_phase_.erase(it);
    wake_[i]->release();
    sg4::this_actor::yield();  // it heartbeats and volunteers before the next look
  }
}

}  // namespace essaim::sim
