// What a worker has done, counted as it happens: the raw material of reward accounting (which the backbone
// and coordinator do from their own observations; a worker's own counts are for its operator and tests).
//
//   WorkerStats s = worker.stats();                        // a consistent-enough snapshot, any thread
//   s.requests, s.pairs, s.errors[size_t(ErrorCode::OVERLOADED)], s.bytes_in
//   std::string line = s.to_json();                        // one line, stable key order
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

#include "net/admission.h"
#include "proto/messages.h"

namespace essaim::worker {

inline constexpr size_t kErrorCodeCount = size_t(proto::ErrorCode::COUNT);
inline constexpr size_t kRefuseReasonCount = size_t(proto::RefuseReason::COUNT);

struct WorkerStats {
  uint64_t connections = 0;           // accepted streams handed to serve_connection
  uint64_t handshakes_ok = 0;
  std::array<uint64_t, kRefuseReasonCount> handshakes_refused{};  // by RefuseReason (either side refused)
  uint64_t handshakes_failed = 0;     // timeout, closed, or not a HELLO at all
  uint64_t requests = 0;              // EXPERT_RESPONSEs sent
  uint64_t rows = 0;                  // activation rows of those requests
  uint64_t pairs = 0;                 // (row, expert) products computed and sent
  std::array<uint64_t, kErrorCodeCount> errors{};  // ERROR frames sent, by ErrorCode
  uint64_t closed_on_protocol_error = 0;  // connections closed after a framing error or an unexpected message
  uint64_t bytes_in = 0;              // frame bytes received after the handshake, headers included
  uint64_t bytes_out = 0;             // frame bytes sent after the handshake, headers included
  uint64_t compute_ns = 0;            // time spent computing responses, summed over lanes
  net::AdmissionCounters admission{};  // connections admitted, evicted, refused (net/admission.h)

  uint64_t error_count(proto::ErrorCode c) const { return errors[size_t(c)]; }
  std::string to_json() const;
};

// The live counters behind WorkerStats; relaxed atomics (they count, they order nothing).
struct WorkerCounters {
  std::atomic<uint64_t> connections{0}, handshakes_ok{0}, handshakes_failed{0};
  std::array<std::atomic<uint64_t>, kRefuseReasonCount> handshakes_refused{};
  std::atomic<uint64_t> requests{0}, rows{0}, pairs{0};
  std::array<std::atomic<uint64_t>, kErrorCodeCount> errors{};
  std::atomic<uint64_t> closed_on_protocol_error{0}, bytes_in{0}, bytes_out{0}, compute_ns{0};

  WorkerStats snapshot() const;
};

inline void count(std::atomic<uint64_t>& c, uint64_t n = 1) { c.fetch_add(n, std::memory_order_relaxed); }

}  // namespace essaim::worker
