#include "relay/relay_pairing.h"

#include <algorithm>
#include <tuple>

namespace essaim::relay {

using net::WsCloseCode;

void Pairing::refuse(RelayConnection& c, RefusalReason why, WsCloseCode code, const std::string& reason) {
  counters_.refusals[size_t(why)]++;
  log("refused " + c.ws->peer_name() + ": " + reason);
  c.stage = RelayConnection::Stage::REFUSED;
  c.ws->close_with(code, reason);
  c.ws->resume_reading();  // until the close completes: then the session ends
}

bool Pairing::take_node_slot(RelayConnection& c, const std::string& node) {
  std::lock_guard lk(mu_);
  size_t& n = per_node_[node];
  if (n >= opts_.max_connections_per_node) return false;
  ++n;
  c.node = node;
  c.holds_slot = true;
  return true;
}

// A worker: paired at once with the first backbone waiting for its node whose build is equal (those
// before it with another build are refused), else idle until a backbone comes. It reads meanwhile, so a
// close or a protocol error while idle is seen.
void Pairing::add_worker(const std::shared_ptr<RelayConnection>& c) {
  auto pair = std::make_shared<RelayPair>();
  pair->conn[kWorker] = c;
  c->pair = pair;
  c->side = kWorker;
  c->stage = RelayConnection::Stage::REGISTERED;
  bool paired = false;
  {
    std::lock_guard lk(mu_);
    if (auto it = waiting_.find(c->node); it != waiting_.end()) {
      while (!it->second.empty() && !paired) {
        std::shared_ptr<RelayConnection> b = std::move(it->second.front().backbone);
        it->second.pop_front();
        if (b->preamble.build != c->preamble.build) {
          refuse(*b, RefusalReason::FINGERPRINT, WsCloseCode::POLICY,
                 "fingerprint mismatch: the backbone has " + b->preamble.build.text() + ", worker " + c->node + " another build");
          continue;
        }
        match_locked(c, b);
        paired = true;
      }
      if (it->second.empty()) waiting_.erase(it);
    }
    if (!paired) {
      idle_[c->node].push_back(c);
      counters_.idle_workers++;
    }
  }
  if (!paired) log("worker " + c->node + " idle (" + c->ws->peer_name() + ", " + c->preamble.build.text() + ")");
  c->ws->resume_reading();
}

// A backbone: takes the first idle worker connection of the node it names whose build is equal; refused
// at once when only other builds are idle there; else waits up to pair_wait (not reading meanwhile).
void Pairing::add_backbone(const std::shared_ptr<RelayConnection>& c) {
  c->side = kBackbone;
  c->stage = RelayConnection::Stage::REGISTERED;
  const std::string node = c->preamble.node_id;
  uint64_t id = 0;
  {
    std::lock_guard lk(mu_);
    bool mismatch = false;
    if (auto it = idle_.find(node); it != idle_.end()) {
      for (auto w = it->second.begin(); w != it->second.end(); ++w) {
        if ((*w)->preamble.build != c->preamble.build) {
          mismatch = true;
          continue;
        }
        std::shared_ptr<RelayConnection> worker = std::move(*w);
        it->second.erase(w);
        if (it->second.empty()) idle_.erase(it);
        counters_.idle_workers--;
        match_locked(worker, c);
        return;
      }
    }
    if (mismatch) {
      return refuse(*c, RefusalReason::FINGERPRINT, WsCloseCode::POLICY,
                    "fingerprint mismatch: the backbone has " + c->preamble.build.text() + ", worker " + node + " another build");
    }
    id = next_wait_id_++;
    waiting_[node].push_back({c, id});
  }
  c->ws->run_after(opts_.pair_wait, [this, node, id] { expire_wait(node, id); });
}

void Pairing::expire_wait(const std::string& node, uint64_t id) {
  std::lock_guard lk(mu_);
  auto it = waiting_.find(node);
  if (it == waiting_.end()) return;
  for (auto w = it->second.begin(); w != it->second.end(); ++w) {
    if (w->id != id) continue;
    std::shared_ptr<RelayConnection> b = std::move(w->backbone);
    it->second.erase(w);
    if (it->second.empty()) waiting_.erase(it);
    return refuse(*b, RefusalReason::NO_WORKER, WsCloseCode::TRY_AGAIN_LATER, "no worker connected for node " + node);
  }
}

// The backbone is told PAIRED first, and the worker once that is written (or, should the backbone's first
// message come sooner, just before it: the worker's PAIRED always precedes what is forwarded to it). The
// backbone starts reading now.
void Pairing::match_locked(const std::shared_ptr<RelayConnection>& worker, const std::shared_ptr<RelayConnection>& backbone) {
  std::shared_ptr<RelayPair> p = worker->pair;
  backbone->pair = p;
  {
    std::lock_guard pl(p->mu);
    p->conn[kBackbone] = backbone;
    p->active = true;
    counters_.pairs_total++;
    counters_.pairs_active++;
    backbone->ws->send({kPairedMessage}, [this, p](const net::NetStatus& st) { on_paired_sent(p, kBackbone, st); });
  }
  backbone->ws->resume_reading();
  log("paired " + backbone->node + " (" + backbone->ws->peer_name() + ") with worker " + worker->node);
}

void Pairing::on_paired_sent(const std::shared_ptr<RelayPair>& p, int to, const net::NetStatus& st) {
  if (st && to == kBackbone) {
    std::lock_guard pl(p->mu);
    tell_worker_locked(p);
  }
  if (st) return;
  fail_pair(*p, to, std::string(to == kWorker ? "the worker" : "the backbone") + " is gone: " + st.error().message);
}

void Pairing::tell_worker_locked(const std::shared_ptr<RelayPair>& p) {
  if (p->worker_told || p->over) return;
  p->worker_told = true;
  if (std::shared_ptr<RelayConnection> w = p->conn[kWorker].lock()) {
    w->ws->send({kPairedMessage}, [this, p](const net::NetStatus& st) { on_paired_sent(p, kWorker, st); });
  }
}

bool Pairing::forward(RelayConnection& c, std::vector<uint8_t> m) {
  const std::shared_ptr<RelayPair> p = c.pair;
  if (!p) return true;  // (a registered connection reads only once it has its pair)
  const int me = c.side, other = 1 - me;
  std::lock_guard pl(p->mu);
  std::shared_ptr<RelayConnection> to = p->active && !p->over && !p->ended[other] ? p->conn[other].lock() : nullptr;
  if (!to) {
    counters_.drop(DropReason::PEER_GONE, m.size());
    if (!p->active) {
      close_side_locked(*p, me, WsCloseCode::PROTOCOL, "a worker sends nothing before PAIRED");
    } else {
      close_side_locked(*p, me, WsCloseCode::NORMAL, "the peer closed");
    }
    return true;
  }
  if (other == kWorker) tell_worker_locked(p);
  const size_t bytes = m.size();
  p->queued[other] += bytes;
  to->ws->send(std::move(m), [this, p, other, bytes](const net::NetStatus& st) { on_sent(p, other, bytes, st); });
  if (p->queued[other] <= opts_.limits.read_ahead_bytes) return true;
  p->paused[me] = true;
  return false;
}

void Pairing::on_sent(const std::shared_ptr<RelayPair>& p, int to, size_t bytes, const net::NetStatus& st) {
  const int from = 1 - to;
  std::shared_ptr<RelayConnection> resume, culprit;
  bool first_failure = false;  // (every message queued to a stalled peer fails: one log line)
  {
    std::lock_guard pl(p->mu);
    p->queued[to] -= bytes;
    if (st) {
      counters_.bytes_to[to] += bytes;
      counters_.messages_to[to]++;
    } else {
      counters_.drop(st.error().kind == net::NetErrorKind::TIMEOUT ? DropReason::STALLED_PEER : DropReason::PEER_GONE, bytes);
      culprit = p->conn[to].lock();
      first_failure = !p->verdict;
    }
    if (p->paused[from] && p->queued[to] <= opts_.limits.read_ahead_bytes) {
      p->paused[from] = false;
      resume = p->conn[from].lock();
    }
  }
  if (resume) resume->ws->resume_reading();
  if (st) return;
  const bool stalled = st.error().kind == net::NetErrorKind::TIMEOUT;
  if (stalled && culprit && first_failure) log("dropping a pair: " + culprit->ws->peer_name() + " stopped reading");
  fail_pair(*p, to, stalled ? "the peer stopped reading" : "the peer is gone");
}

void Pairing::ended(RelayConnection& c, const net::NetError& why) {
  const std::shared_ptr<RelayPair> p = c.pair;
  const int me = c.side;
  bool was_active = false;
  {
    std::lock_guard lk(mu_);
    if (c.holds_slot && --per_node_[c.node] == 0) per_node_.erase(c.node);
    c.holds_slot = false;
    if (!p) return;  // refused after its token was accepted (no worker, fingerprint)
    if (me == kWorker) leave_idle_locked(c);
    std::lock_guard pl(p->mu);
    p->ended[me] = true;
    was_active = p->active;
  }
  if (!was_active) return;  // an idle worker: nobody to tell
  if (why.kind == net::NetErrorKind::CLOSED && c.ws->peer_close_code() == uint16_t(WsCloseCode::NORMAL)) {
    std::lock_guard pl(p->mu);
    close_side_locked(*p, 1 - me, WsCloseCode::NORMAL, "the peer closed");
    end_pair_locked(*p);
  } else if (why.kind == net::NetErrorKind::TOO_LARGE) {
    counters_.dropped_messages[size_t(DropReason::TOO_BIG)]++;
    fail_pair(*p, me, "the peer sent a message over the limit");
  } else {
    // A protocol error, a peer silent past the idle timeout, a reset: the partner learns at once.
    fail_pair(*p, me, "the peer failed: " + why.message);
  }
}

std::vector<std::shared_ptr<RelayConnection>> Pairing::idle_workers() {
  std::lock_guard lk(mu_);
  std::vector<std::shared_ptr<RelayConnection>> out;
  for (const auto& [node, list] : idle_) out.insert(out.end(), list.begin(), list.end());
  return out;
}

void Pairing::refuse_idle(const std::shared_ptr<RelayConnection>& c, const std::string& reason) {
  {
    std::lock_guard lk(mu_);
    auto it = idle_.find(c->node);
    if (it == idle_.end() || std::find(it->second.begin(), it->second.end(), c) == it->second.end()) return;
    leave_idle_locked(*c);
  }
  refuse(*c, RefusalReason::BAD_TOKEN, WsCloseCode::POLICY, reason);
}

void Pairing::leave_idle_locked(RelayConnection& c) {
  auto it = idle_.find(c.node);
  if (it == idle_.end()) return;
  for (auto w = it->second.begin(); w != it->second.end(); ++w) {
    if (w->get() != &c) continue;
    it->second.erase(w);
    counters_.idle_workers--;
    break;
  }
  if (it->second.empty()) idle_.erase(it);
}

// Side `culprit` stalled or broke the protocol: 1011 to both, the partner first, at once.
void Pairing::fail_pair(RelayPair& p, int culprit, const std::string& why) {
  std::lock_guard pl(p.mu);
  if (!p.verdict) p.verdict.emplace(WsCloseCode::INTERNAL, why);
  close_side_locked(p, 1 - culprit, WsCloseCode::INTERNAL, why);
  close_side_locked(p, culprit, WsCloseCode::INTERNAL, why);
  end_pair_locked(p);
}

// After what is queued to it, a close frame (the pair's verdict, once there is one); it reads until then.
void Pairing::close_side_locked(RelayPair& p, int side, WsCloseCode code, std::string why) {
  if (p.verdict) std::tie(code, why) = *p.verdict;
  if (std::shared_ptr<RelayConnection> c = p.conn[side].lock()) {
    c->ws->close_with(code, why);
    c->ws->resume_reading();
  }
}

void Pairing::end_pair_locked(RelayPair& p) {
  if (p.over) return;
  p.over = true;
  if (p.active) counters_.pairs_active--;
}

void Pairing::clear() {
  std::lock_guard lk(mu_);
  idle_.clear();
  waiting_.clear();
  counters_.idle_workers = 0;
}

}  // namespace essaim::relay
