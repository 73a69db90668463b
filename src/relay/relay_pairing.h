// The relay's pairing and forwarding (internal to essaim_relay; RelayServer in relay_server.h is the API).
// A RelayConnection is one accepted WebSocket session after its token was accepted: a worker waits idle
// under its node id, a backbone takes one idle worker connection of the node it names whose build
// fingerprint equals its own (waiting up to pair_wait for one), and the two become a RelayPair that
// forwards each side's messages to the other, unchanged.
//
// Everything runs on the listener's I/O threads, each session's callbacks on its own strand; nothing here
// blocks. Flow control: each direction queues at most RelayOptions::limits.read_ahead_bytes beyond one
// message at the destination; past it the sender's session stops reading (TCP pushes back on it) until the
// destination has taken its queue down again. A destination that does not take one message within
// write_stall fails its sends (net/ws_listener.h): its pair is closed with 1011 and every message it never
// took is counted as dropped. No other pair waits on it.
//
// Locks: `Pairing::mu_` (idle workers, waiting backbones, per-node counts) before a pair's `mu`, never the
// other way; session methods only post to their strands, so they may be called under either.
#pragma once

#include <array>
#include <atomic>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "net/ws_listener.h"
#include "relay/preamble.h"
#include "relay/relay_server.h"

namespace essaim::relay {

inline constexpr int kWorker = 0, kBackbone = 1;

// The counters behind RelayStats and /metrics (atomics: every I/O thread updates them).
struct RelayCounters {
  std::atomic<uint64_t> connections_total{0}, pairs_total{0};
  std::atomic<int64_t> pairs_active{0}, idle_workers{0};
  std::array<std::atomic<uint64_t>, 2> bytes_to{}, messages_to{};  // by destination: kWorker, kBackbone
  std::array<std::atomic<uint64_t>, size_t(DropReason::COUNT)> dropped_messages{}, dropped_bytes{};
  std::array<std::atomic<uint64_t>, size_t(RefusalReason::COUNT)> refusals{};
  void drop(DropReason why, size_t bytes) {
    dropped_messages[size_t(why)]++;
    dropped_bytes[size_t(why)] += bytes;
  }
};

struct RelayPair;

struct RelayConnection {
  enum class Stage : uint8_t { PREAMBLE, CHECKING, REFUSED, REGISTERED };
  std::shared_ptr<net::WsSession> ws;
  std::atomic<Stage> stage{Stage::PREAMBLE};
  // Set before the session reads again after its preamble, read on its strand after.
  Preamble preamble;
  std::string node;  // the token's node: its per-node slot is held until the session ends
  bool holds_slot = false;
  std::shared_ptr<RelayPair> pair;  // a worker: from registration; a backbone: once matched
  int side = kWorker;
};

// Both sides of one pair. `conn` holds weak references: the sessions' callbacks own the connections.
struct RelayPair {
  std::mutex mu;
  std::array<std::weak_ptr<RelayConnection>, 2> conn;
  bool active = false;                    // matched: PAIRED queued to the backbone
  bool worker_told = false;               // PAIRED queued to the worker
  std::array<bool, 2> ended{};            // that side's read ended
  std::array<size_t, 2> queued{};         // bytes queued for sending to that side
  std::array<bool, 2> paused{};           // that side stopped reading: the other side's queue is full
  int paired_sent = 0;                    // PAIRED messages written (2: counted as a pair)
  bool counted = false, over = false;     // in pairs_active; no longer forwarding
  // Why the pair ends, decided by the first side that fails (a stall, a protocol error): both sides are
  // closed with it, and a later "the peer closed" cannot replace it.
  std::optional<std::pair<net::WsCloseCode, std::string>> verdict;
};

class Pairing {
 public:
  Pairing(const RelayOptions& opts, RelayCounters& counters) : opts_(opts), counters_(counters) {}

  // Refuses `c` with a close code (counted, logged); its session reads on until the close completes.
  void refuse(RelayConnection& c, RefusalReason why, net::WsCloseCode code, const std::string& reason);
  // A connection whose token was accepted for `node`: takes a per-node slot (false: the node is full).
  bool take_node_slot(RelayConnection& c, const std::string& node);
  void add_worker(const std::shared_ptr<RelayConnection>& c);
  void add_backbone(const std::shared_ptr<RelayConnection>& c);
  // A message from `c` after registration; false: stop reading until resumed (the partner's queue is full).
  bool forward(RelayConnection& c, std::vector<uint8_t> m);
  // `c`'s read side ended: its pair learns (1000 passed on for a clean close, 1011 otherwise); its slot goes.
  void ended(RelayConnection& c, const net::NetError& why);
  // Drops every idle worker and waiting backbone (the listener has stopped).
  void clear();
  // The worker connections idle now (for the periodic re-check of their tokens).
  std::vector<std::shared_ptr<RelayConnection>> idle_workers();
  // An idle worker whose token is no longer accepted: out of the idle list (never paired from now on) and
  // closed with 1008 `reason`. Nothing when it was paired or went away meanwhile.
  void refuse_idle(const std::shared_ptr<RelayConnection>& c, const std::string& reason);

 private:
  struct Waiting {
    std::shared_ptr<RelayConnection> backbone;
    uint64_t id;
  };
  void match_locked(const std::shared_ptr<RelayConnection>& worker, const std::shared_ptr<RelayConnection>& backbone);
  void expire_wait(const std::string& node, uint64_t id);
  void leave_idle_locked(RelayConnection& c);
  void on_paired_sent(const std::shared_ptr<RelayPair>& p, int to, const net::NetStatus& st);
  void tell_worker_locked(const std::shared_ptr<RelayPair>& p);
  void on_sent(const std::shared_ptr<RelayPair>& p, int to, size_t bytes, const net::NetStatus& st);
  void fail_pair(RelayPair& p, int culprit, const std::string& why);
  void close_side_locked(RelayPair& p, int side, net::WsCloseCode code, std::string why);
  void end_pair_locked(RelayPair& p);
  void log(const std::string& line) const {
    if (opts_.log) opts_.log(line);
  }

  const RelayOptions& opts_;
  RelayCounters& counters_;
  std::mutex mu_;
  std::map<std::string, std::list<std::shared_ptr<RelayConnection>>> idle_;  // workers by node id; guarded by mu_
  std::map<std::string, std::list<Waiting>> waiting_;                        // backbones by node wanted; guarded by mu_
  std::map<std::string, size_t> per_node_;                                   // live connections by token's node; guarded by mu_
  uint64_t next_wait_id_ = 0;                                                // guarded by mu_
};

}  // namespace essaim::relay
