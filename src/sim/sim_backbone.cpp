// A backbone in the simulation: bursts of decode steps over `sequences` sequences; each of the model's layers
// runs the dense path (a stated or calibrated cost), draws the router's picks, and dispatches as RemoteExpertExecutor
// does: experts in the hot-expert cache computed here, the others sent to one live replica each
// (ReplicaChooser over the expert map the coordinator lists), a late request hedged to another replica
// holding all its experts (ReplicaChooser::hedge_after), answers collected until the deadline, whatever
// did not answer computed from the backbone's own copy (or failed without one), answers audited by
// AuditPolicy (recomputed here; the cost counts, every worker is honest).
#include <algorithm>
#include <chrono>
#include <set>

#include "backbone/audit_policy.h"
#include "backbone/hot_expert_cache.h"
#include "backbone/replica_choice.h"
#include "sim/sim_world.h"

namespace essaim::sim {

namespace {

struct Outgoing {
  size_t worker = 0;
  std::vector<std::pair<int32_t, int64_t>> expert_rows;
  int64_t rows = 0;  // distinct tokens: each travels once, with the experts it picked from this worker
  int64_t pairs = 0;
  double sent_s = 0;
  bool hedged = false;
};

class BackboneSim {
 public:
  BackboneSim(World& w, size_t b)
      : w_(w), b_(b), rng_(w.sc.seed * 7919 + b),
        chooser_(w.workers.size(), {.policy = w.sc.nearest ? backbone::ReplicaPolicy::NEAREST : backbone::ReplicaPolicy::FIRST,
                                    .hedge = w.sc.hedge}),
        audit_(w.workers.size(), {.adaptive = w.sc.audit}), window_(64), load_(w.workers.size(), 0),
        failed_until_(w.workers.size(), 0), holders_(w.cat.slices.size()) {}

  void run() {
    w_.backbone_inbox[b_]->set_receiver(sg4::Actor::self());
    sg4::this_actor::sleep_for(w_.sc.warmup_s);
    while (World::now_s() < w_.end_s) {
      const double burst = World::now_s();
      for (int64_t step = 0; step < w_.sc.probe_steps && World::now_s() < w_.end_s; ++step) decode_step();
      const double next = burst + w_.sc.probe_every_s;
      if (next > World::now_s()) sg4::this_actor::sleep_for(std::min(next, w_.end_s) - World::now_s());
    }
    w_.backbone_inbox[b_]->set_receiver(nullptr);
  }

 private:
  void decode_step() {
    const double t0 = World::now_s();
    for (int32_t layer = 0; layer < w_.shape.n_layers; ++layer) layer_call(layer);
    const double dt = World::now_s() - t0;
    w_.report.token_latency_s.push_back(dt);
    w_.report.step_seconds += dt;
    w_.report.tokens += uint64_t(w_.sc.sequences);
    if (w_.sc.hot_cache_bytes > 0 && ++steps_ % 4 == 0) replan_hot();
  }

  void refresh_map() {
    if (World::now_s() < map_at_ + w_.sc.map_refresh_s && map_at_ >= 0) return;
    map_at_ = World::now_s();
    for (auto& h : holders_) h.clear();
    for (const coord::MapWorker& m : w_.market->expert_map(World::now_ms())) {
      const size_t worker = w_.worker_index.at(m.node_id);
      for (size_t s : m.slices) holders_[s].push_back(worker);
    }
  }

  void replan_hot() {
    std::vector<backbone::HotCandidate> cands;
    for (const auto& [key, count] : window_.counts()) {
      cands.push_back({key, count, uint64_t(w_.shape.expert_bytes[size_t(key.layer)]), hot_.count(key) > 0});
    }
    const std::vector<backbone::ExpertKey> chosen =
        backbone::choose_hot_set(std::move(cands), {.budget_bytes = uint64_t(w_.sc.hot_cache_bytes)});
    hot_ = std::set<backbone::ExpertKey>(chosen.begin(), chosen.end());
  }

  // The live candidates for a slice, in map order.
  void candidates(size_t slice, std::vector<size_t>& out) const {
    out.clear();
    for (size_t wkr : holders_[slice]) {
      if (failed_until_[wkr] <= World::now_s() && !audit_.dropped(wkr)) out.push_back(wkr);
    }
  }

  void send(uint64_t id, Outgoing& o, int32_t layer) {
    o.pairs = 0;
    for (const auto& er : o.expert_rows) o.pairs += er.second;
    const uint64_t bytes = w_.shape.request_bytes(uint64_t(o.rows), uint64_t(o.pairs));
    w_.report.bytes_up += bytes;
    o.sent_s = World::now_s();
    w_.workers[o.worker].inbox->put_init(new ExpertCall{id, layer, b_, o.expert_rows, o.sent_s}, bytes)->detach();
    ++w_.report.calls;
  }

  void layer_call(int32_t layer);
  void collect(int32_t layer, std::map<uint64_t, Outgoing>& out, double& local_s);

  World& w_;
  size_t b_;
  std::mt19937_64 rng_;
  backbone::ReplicaChooser chooser_;
  backbone::AuditPolicy audit_;
  backbone::ExpertUsageWindow window_;
  std::set<backbone::ExpertKey> hot_;
  std::vector<uint64_t> load_;
  std::vector<double> failed_until_;
  std::vector<std::vector<size_t>> holders_;  // [slice] -> workers listed by the map
  double map_at_ = -1;
  uint64_t next_id_ = 1, steps_ = 0;
};

void BackboneSim::layer_call(int32_t layer) {
  const Scenario& sc = w_.sc;
  sg4::Host* host = w_.backbones[b_];
  w_.start_compute(host, w_.backbone_flops(sc.backbone_layer_ms / 1e3 + sc.backbone_row_us / 1e6 * double(sc.sequences)))
      ->wait();
  refresh_map();
  std::map<int32_t, std::vector<int32_t>> tokens_of;  // expert -> the tokens (rows) picking it
  std::vector<int32_t> ids, all;
  for (int32_t t = 0; t < int32_t(sc.sequences); ++t) {
    w_.routing.draw(layer, rng_, ids);
    for (int32_t e : ids) tokens_of[e].push_back(t);
    all.insert(all.end(), ids.begin(), ids.end());
  }
  window_.record(layer, all);
  double local_s = 0;  // calibrated seconds computed here
  std::map<size_t, Outgoing> per_worker;
  std::vector<size_t> cands;
  std::vector<bool> was_candidate(w_.workers.size(), false);
  std::map<size_t, std::vector<bool>> rows_to;  // worker -> which tokens it is sent
  for (const auto& [e, tokens] : tokens_of) {
    const int64_t rows = int64_t(tokens.size());
    const std::vector<std::pair<int32_t, int64_t>> one = {{e, rows}};
    if (hot_.count({layer, e})) {
      local_s += w_.call_seconds(layer, one);
      w_.report.pairs_hot += uint64_t(rows);
      continue;
    }
    candidates(w_.slice_of[size_t(layer)][size_t(e)], cands);
    if (cands.empty()) {
      if (sc.backbone_copy) local_s += w_.call_seconds(layer, one);
      (sc.backbone_copy ? w_.report.pairs_fallback : w_.report.pairs_failed) += uint64_t(rows);
      continue;
    }
    for (size_t c : cands) was_candidate[c] = true;
    const size_t pick = chooser_.choose(cands, load_);
    load_[pick] += uint64_t(rows);
    Outgoing& o = per_worker[pick];
    o.worker = pick;
    o.expert_rows.push_back({e, rows});
    std::vector<bool>& sent = rows_to[pick];
    sent.resize(size_t(sc.sequences), false);
    for (int32_t t : tokens) {
      if (!sent[size_t(t)]) ++o.rows;
      sent[size_t(t)] = true;
    }
  }
  std::map<uint64_t, Outgoing> out;
  for (auto& [worker, o] : per_worker) {
    const uint64_t id = next_id_++;
    send(id, o, layer);
    out.emplace(id, std::move(o));
  }
  // The own share (hot experts, experts no worker lists) runs while the answers come, as in the executor;
  // fallbacks and audits after the answers. A host of speed backbone_speed takes local_s / speed.
  sg4::ExecPtr own = w_.start_compute(host, std::max(local_s, 1e-9) * kCoreFlops);
  double after_s = 0;
  collect(layer, out, after_s);
  own->wait();
  chooser_.decay_unused(was_candidate, load_);
  for (const auto& [worker, o] : per_worker) load_[worker] = 0;
  if (after_s > 0) w_.start_compute(host, after_s * kCoreFlops)->wait();
}

void BackboneSim::collect(int32_t layer, std::map<uint64_t, Outgoing>& out, double& local_s) {
  const Scenario& sc = w_.sc;
  const double deadline = World::now_s() + sc.deadline_ms / 1e3;
  std::map<uint64_t, uint64_t> duplicate_of;  // hedge id -> original id
  std::vector<size_t> cands;
  while (!out.empty()) {
    double wake = deadline;
    for (const auto& [id, o] : out) {
      if (o.hedged) continue;
      const auto after = chooser_.hedge_after(o.worker);
      if (after != std::chrono::nanoseconds::max()) wake = std::min(wake, o.sent_s + double(after.count()) / 1e9);
    }
    ExpertAnswer* a = nullptr;
    try {
      a = w_.backbone_inbox[b_]->get<ExpertAnswer>(std::max(0.0, wake - World::now_s()));
    } catch (const simgrid::TimeoutException&) {
      if (World::now_s() >= deadline - 1e-9) break;
      // Late ones: a duplicate to another live replica holding all of the request's experts.
      std::vector<std::pair<uint64_t, Outgoing>> hedges;
      for (auto& [id, o] : out) {
        const auto after = chooser_.hedge_after(o.worker);
        if (o.hedged || after == std::chrono::nanoseconds::max() || World::now_s() < o.sent_s + double(after.count()) / 1e9)
          continue;
        o.hedged = true;
        std::vector<size_t> both;
        for (size_t k = 0; k < o.expert_rows.size(); ++k) {
          candidates(w_.slice_of[size_t(layer)][size_t(o.expert_rows[k].first)], cands);
          if (k == 0) both = cands;
          else std::erase_if(both, [&](size_t x) { return std::find(cands.begin(), cands.end(), x) == cands.end(); });
        }
        std::erase(both, o.worker);
        if (both.empty()) continue;
        Outgoing d{.worker = chooser_.choose(both, load_), .expert_rows = o.expert_rows, .rows = o.rows, .hedged = true};
        hedges.push_back({id, std::move(d)});
      }
      for (auto& [orig, d] : hedges) {
        const uint64_t id = next_id_++;
        send(id, d, layer);
        w_.report.pairs_hedged += uint64_t(d.pairs);
        duplicate_of[id] = orig;
        out.emplace(id, std::move(d));
      }
      continue;
    }
    const uint64_t id = a->id;
    delete a;
    auto it = out.find(id);
    if (it == out.end()) continue;  // a late answer of an earlier call, or the loser of a hedge
    const Outgoing& o = it->second;
    chooser_.record(o.worker, World::now_s() - o.sent_s, uint64_t(o.pairs));
    w_.workers[o.worker].pairs_credited += uint64_t(o.pairs);
    w_.report.pairs_remote += uint64_t(o.pairs);
    if (audit_.enabled() && audit_.should_audit(o.worker)) {
      audit_.record(o.worker, true);
      ++w_.report.audits;
      local_s += w_.call_seconds(layer, o.expert_rows);
    }
    // The answered request and its twin (original or duplicate) are done.
    const uint64_t orig = duplicate_of.count(id) ? duplicate_of[id] : id;
    for (auto jt = out.begin(); jt != out.end();) {
      const uint64_t root = duplicate_of.count(jt->first) ? duplicate_of[jt->first] : jt->first;
      jt = root == orig ? out.erase(jt) : std::next(jt);
    }
  }
  // Past the deadline: what did not answer is computed here (or fails), its worker marked failed until it
  // reconnects (a second, as a link's first backoff).
  std::set<uint64_t> done_roots;
  for (const auto& [id, o] : out) {
    failed_until_[o.worker] = World::now_s() + 1.0;
    ++w_.report.calls_timed_out;
    const uint64_t root = duplicate_of.count(id) ? duplicate_of[id] : id;
    if (!done_roots.insert(root).second) continue;
    if (sc.backbone_copy) local_s += w_.call_seconds(layer, o.expert_rows);
    (sc.backbone_copy ? w_.report.pairs_fallback : w_.report.pairs_failed) += uint64_t(o.pairs);
  }
}

}  // namespace

void backbone_main(World& w, size_t b) { BackboneSim(w, b).run(); }

}  // namespace essaim::sim
