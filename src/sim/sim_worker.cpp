// A worker's life in the simulation: online periods and departures (kill -9 or a graceful leave) drawn
// from its class's online/offline times; while online, the market loop of `essaim worker --coordinator`
// (worker/joined_worker.cpp: heartbeat; volunteer when told, when it has room, on its first round and every 5th;
// after a change, heartbeat and volunteer again, up to 4 times; downloads over its downlink from the slice
// server, heartbeating meanwhile; a swap takes first, heartbeats both, then gives up) and a server answering expert calls with the
// calibrated compute time. Its slices stay on its disk while it is away.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "sim/sim_world.h"

namespace essaim::sim {

namespace {

void serve_expert_calls(World& w, size_t i) {
  WorkerNode& n = w.workers[i];
  const double started = World::now_s();
  n.inbox->set_receiver(sg4::Actor::self());
  sg4::this_actor::on_exit([&n](bool) { n.inbox->set_receiver(nullptr); });
  for (;;) {
    ExpertCall* c = n.inbox->get<ExpertCall>();
    if (c->sent_s < started) {  // sent to this node's previous life: that connection is gone
      delete c;
      continue;
    }
    w.start_compute(n.host, w.call_seconds(c->layer, c->expert_rows) * kCoreFlops)->wait();
    int64_t pairs = 0;
    for (const auto& er : c->expert_rows) pairs += er.second;
    const uint64_t bytes = w.shape.response_bytes(uint64_t(pairs), w.sc.bf16_wire);
    w.report.bytes_down += bytes;
    w.backbone_inbox[c->backbone]->put_init(new ExpertAnswer{c->id, i}, bytes)->detach();
    delete c;
  }
}

class MarketLoop {
 public:
  MarketLoop(World& w, size_t i) : w_(w), n_(w.workers[i]), i_(i) {}

  void run_until(double until) {
    int rounds = 0;
    bool first = true;
    while (World::now_s() < until && World::now_s() < w_.end_s) {
      const bool told = heartbeat();
      if (first || told || has_room() || rounds % 5 == 4) {
        for (int again = 0; again < 4 && volunteer_round(); ++again) heartbeat();
        first = false;
      }
      ++rounds;
      const double stop = std::min(until, w_.end_s), left = stop - World::now_s();
      if (left <= 0) break;
      if (idle()) {
        w_.idle->wait(i_, World::now_s() + double(w_.sc.heartbeat_s), stop);
        continue;
      }
      sg4::this_actor::sleep_for(std::min(double(w_.sc.heartbeat_s), left));
    }
  }

  void leave() { w_.market->heartbeat(n_.id, {}, n_.budget_bytes, /*leaving=*/true, World::now_ms()); }

 private:
  bool heartbeat() { return w_.market->heartbeat(n_.id, n_.held, n_.budget_bytes, false, World::now_ms()); }

  int64_t held_bytes() const {
    int64_t b = 0;
    for (size_t s : n_.held) b += w_.cat.slices[s].bytes;
    return b;
  }
  bool holds(size_t s) const { return std::find(n_.held.begin(), n_.held.end(), s) != n_.held.end(); }
  // Some catalogue slice not held fits what is left (worker/joined_worker.cpp's has_room, counted over the
  // sorted slice sizes instead of scanning the catalogue).
  bool has_room() const {
    const int64_t left = n_.budget_bytes - held_bytes();
    const auto& sizes = w_.sorted_slice_bytes;
    const int64_t fitting = std::upper_bound(sizes.begin(), sizes.end(), left) - sizes.begin();
    int64_t held_fitting = 0;
    for (size_t s : n_.held) held_fitting += w_.cat.slices[s].bytes <= left;
    return fitting > held_fitting;
  }

  bool take(size_t s, int64_t budget) {
    if (holds(s) || held_bytes() + w_.cat.slices[s].bytes > budget) return false;
    sg4::CommPtr download = sg4::Comm::sendto_async(w_.slice_server, n_.host, uint64_t(w_.cat.slices[s].bytes));
    if (!w_.sc.heartbeat_while_downloading) {
      download->wait();  // the worker as it was: its market thread heartbeated again after the round
    } else {
      // The worker heartbeats what it holds while a download runs (wait_any_for leaves the download running
      // when the heartbeat period is up).
      const std::vector<sg4::CommPtr> pending = {download};
      while (sg4::Comm::wait_any_for(pending, double(w_.sc.heartbeat_s)) < 0) heartbeat();
    }
    ++w_.report.slice_downloads;
    w_.report.slice_bytes += uint64_t(w_.cat.slices[s].bytes);
    n_.held.push_back(s);
    std::sort(n_.held.begin(), n_.held.end());
    return true;
  }
  void forget(size_t s) { n_.held.erase(std::remove(n_.held.begin(), n_.held.end(), s), n_.held.end()); }

  bool volunteer_round() {
    const coord::VolunteerChoice c = w_.market->volunteer(n_.id, n_.held, n_.budget_bytes, World::now_ms());
    bool changed = false;
    for (size_t d : c.drop) {
      if (holds(d)) {
        forget(d);
        changed = true;
      }
    }
    for (size_t s : c.assign) changed |= take(s, n_.budget_bytes);
    for (const coord::SwapOrder& s : c.swap) {
      if (!holds(s.give_up) || !take(s.take, n_.budget_bytes + w_.cat.slices[s.give_up].bytes)) continue;
      heartbeat();
      forget(s.give_up);
      changed = true;
    }
    return changed;
  }

  // Holding and reserving nothing while nothing is needed: every heartbeat would be told nothing.
  bool idle() { return w_.sc.idle_pool && n_.held.empty() && !w_.market->has_reservation(n_.id) && w_.market->nothing_needed(World::now_ms()); }

  World& w_;
  WorkerNode& n_;
  size_t i_;
};

double exponential(std::mt19937_64& rng, double mean_s) {
  return std::exponential_distribution<double>(1.0 / mean_s)(rng);
}

// Diurnal: away longer at night. The factor on offline times peaks at 03:00 and is lowest at 15:00.
double night_factor(double t_s) {
  const double hour = std::fmod(t_s / 3600.0, 24.0);
  return 1.0 + 0.8 * std::cos((hour - 3.0) / 24.0 * 2.0 * M_PI);
}

}  // namespace

void worker_life(World& w, size_t i) {
  WorkerNode& n = w.workers[i];
  const DeviceClass& c = w.sc.classes[n.device_class];
  std::mt19937_64 rng(w.sc.seed * 0x100000001b3ull + i);
  // Everyone starts within the first heartbeat period or two (no thundering herd at t = 0).
  sg4::this_actor::sleep_for(std::uniform_real_distribution<double>(0, 2.0 * double(w.sc.heartbeat_s))(rng));
  while (World::now_s() < w.end_s) {
    n.online = true;
    n.joined_s = World::now_s();
    ++w.report.joins;
    w.market->add_node(n.id, World::now_ms());
    n.server = sg4::Actor::create("serve-" + n.id, n.host, [&w, i] { serve_expert_calls(w, i); });
    n.server->daemonize();
    const double online =
        c.online_hours > 0 ? exponential(rng, c.online_hours * 3600) : std::numeric_limits<double>::infinity();
    MarketLoop loop(w, i);
    loop.run_until(World::now_s() + online);
    if (World::now_s() >= w.end_s) break;
    const bool kill = std::uniform_real_distribution<double>(0, 1)(rng) < c.kill_share;
    if (kill) {
      ++w.report.kills;  // silent: the coordinator counts its holdings until 3 heartbeats pass
    } else {
      ++w.report.leaves;
      loop.leave();
    }
    n.server->kill();
    n.server = nullptr;
    n.online = false;
    const double away = exponential(rng, c.offline_hours * 3600) * (w.sc.diurnal ? night_factor(World::now_s()) : 1.0);
    sg4::this_actor::sleep_for(std::min(away, std::max(0.0, w.end_s - World::now_s())));
  }
}

void fixed_worker_life(World& w, size_t i) {
  WorkerNode& n = w.workers[i];
  std::mt19937_64 rng(w.sc.seed * 0x100000001b3ull + i);
  sg4::this_actor::sleep_for(std::uniform_real_distribution<double>(0, double(w.sc.heartbeat_s))(rng));
  n.online = true;
  n.joined_s = World::now_s();
  n.held = w.fixed_held[i];
  ++w.report.joins;
  w.market->add_node(n.id, World::now_ms());
  n.server = sg4::Actor::create("serve-" + n.id, n.host, [&w, i] { serve_expert_calls(w, i); });
  n.server->daemonize();
  // Started with its slices (as the harness starts essaim-worker --slice ...): it only heartbeats them, so
  // the backbone's map lists it.
  while (World::now_s() < w.end_s) {
    w.market->heartbeat(n.id, n.held, n.budget_bytes, false, World::now_ms());
    sg4::this_actor::sleep_for(std::min(double(w.sc.heartbeat_s), std::max(1e-3, w.end_s - World::now_s())));
  }
}

}  // namespace essaim::sim
