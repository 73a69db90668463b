// A delaying TCP proxy for benchmarks: injects a fixed round-trip time between the backbone and a worker on
// loopback, where netem is not available (no sch_netem in the kernel here). Not a production path: only
// bench/ and tests link it.
//
//   ESSAIM_ASSIGN_OR_RETURN(std::unique_ptr<DelayProxy> p,
//                           DelayProxy::start("127.0.0.1", worker_port, std::chrono::microseconds(10000)));
//   map.workers.push_back({.address = p->address()});      // 127.0.0.1:<proxy port>: +20 ms per round trip
//
// Every byte read from one side is written to the other side no earlier than `one_way_delay` after it was
// read, in order: one reader and one writer thread per direction, a FIFO of (release time, bytes) between
// them. A request and its answer each cross once, so a round trip costs 2 × one_way_delay more. Bandwidth
// is not limited: the reader keeps reading while chunks wait (the queue is unbounded; benchmarks send
// bounded amounts), and a chunk is written whole as soon as its time comes. When one side closes, the
// bytes already read are still delivered after their delay, then both sides are closed.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "net/tcp.h"

namespace essaim::bench {

class DelayProxy {
 public:
  // Listens on 127.0.0.1 (OS-chosen port) and forwards every accepted connection to target_host:target_port.
  static net::NetResult<std::unique_ptr<DelayProxy>> start(const std::string& target_host, uint16_t target_port,
                                                           std::chrono::microseconds one_way_delay);
  ~DelayProxy();  // closes every connection and joins every thread
  DelayProxy(const DelayProxy&) = delete;
  DelayProxy& operator=(const DelayProxy&) = delete;

  uint16_t port() const;
  std::string address() const { return "127.0.0.1:" + std::to_string(port()); }
  uint64_t connections() const;  // accepted so far

  struct State;

 private:
  explicit DelayProxy(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace essaim::bench
