// A delaying TCP proxy for benchmarks and multi-process tests: injects a round-trip time (fixed, or with
// seeded jitter) between the backbone and a worker on loopback, where netem is not available (no sch_netem
// in the kernel here). Not a production path: only bench/ and tests link it.
//
//   ESSAIM_ASSIGN_OR_RETURN(std::unique_ptr<DelayProxy> p,
//                           DelayProxy::start("127.0.0.1", worker_port, std::chrono::microseconds(10000)));
//   map.workers.push_back({.address = p->address()});      // 127.0.0.1:<proxy port>: +20 ms per round trip
//   auto q = DelayProxy::start("127.0.0.1", port, {.one_way = 2ms, .jitter = 1ms, .seed = 7});
//   q->retarget(restarted_worker_port);                    // new connections go there (a restarted worker)
//
// Every byte read from one side is written to the other side no earlier than `one_way_delay` after it was
// read, in order: one reader and one writer thread per direction, a FIFO of (release time, bytes) between
// them. A request and its answer each cross once, so a round trip costs 2 × one_way_delay more. Bandwidth
// is not limited (unless `bytes_per_s` says): the reader keeps reading while chunks wait (the queue is unbounded; benchmarks send
// bounded amounts), and a chunk is written whole as soon as its time comes. When one side closes, the
// bytes already read are still delivered after their delay, then both sides are closed.
// Jitter: each chunk waits one_way + a seeded uniform extra in [0, jitter], but never leaves before the
// chunk read before it (a TCP link reorders nothing), so the delay of a chunk is its own draw or its
// predecessor's release, whichever is later. The draws of connection c, direction d (0: to the target)
// come from a generator seeded with (seed, c, d): a run with the same traffic gets the same delays.
// With `bytes_per_s`, each direction of each connection is also paced: a chunk is written in pieces of at
// most a tenth of a second's bytes, each piece followed by its share of time (a slow link for one download,
// while the small calls on other connections pass at once).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "net/tcp.h"

namespace essaim::bench {

struct LinkDelay {
  std::chrono::microseconds one_way{0};
  std::chrono::microseconds jitter{0};  // extra per chunk, uniform in [0, jitter]
  uint64_t seed = 0;
  uint64_t bytes_per_s = 0;  // per connection and direction; 0: unlimited
};

class DelayProxy {
 public:
  // Listens on 127.0.0.1 (OS-chosen port) and forwards every accepted connection to target_host:target_port.
  static net::NetResult<std::unique_ptr<DelayProxy>> start(const std::string& target_host, uint16_t target_port,
                                                           std::chrono::microseconds one_way_delay) {
    return start(target_host, target_port, LinkDelay{.one_way = one_way_delay});
  }
  static net::NetResult<std::unique_ptr<DelayProxy>> start(const std::string& target_host, uint16_t target_port,
                                                           LinkDelay delay);
  ~DelayProxy();  // closes every connection and joins every thread
  DelayProxy(const DelayProxy&) = delete;
  DelayProxy& operator=(const DelayProxy&) = delete;

  uint16_t port() const;
  std::string address() const { return "127.0.0.1:" + std::to_string(port()); }
  uint64_t connections() const;  // accepted so far
  // Connections accepted from now on go to target_port (the ones open stay where they are): a worker
  // restarted on another port is reached at the same proxy address. While nothing listens there, an
  // accepted connection is closed at once, as a refused connect would be.
  void retarget(uint16_t target_port);

  struct State;

 private:
  explicit DelayProxy(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace essaim::bench
