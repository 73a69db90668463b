// What the backbone's dispatcher did: requests, (row, expert) pairs by where they were computed, fallbacks
// by reason, bytes on the wire per layer, and the pairs each worker served — the backbone's own
// observation of the work, which rewards are credited from (docs/invariants.md "Coverage market"), never a
// worker's claim.
//
//   DispatchStats s = executor.stats();
//   s.fallback_pairs[size_t(FallbackReason::TIMEOUT)];   // pairs recomputed locally after a timeout
//   std::fputs(s.to_text().c_str(), stderr);             // the summary `essaim run` prints
//   std::string j = s.to_json();                          // one JSON object, stable key order
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace essaim::backbone {

// Why pairs that belonged to a worker were computed from the backbone's replica instead.
enum class FallbackReason : uint8_t {
  UNAVAILABLE,     // every worker holding the expert was down (or never connected) when the layer ran
  TIMEOUT,         // no answer before the deadline
  DISCONNECTED,    // the connection broke (worker killed, reset, GOODBYE) before the answer
  PROTOCOL,        // the worker's bytes did not decode, or it sent a message not valid now
  ERROR_RESPONSE,  // the worker answered a typed ERROR (unknown expert, wrong layer, ...)
  BAD_RESPONSE,    // a well-formed response of the wrong shape (pair count, width)
  AUDIT_MISMATCH,  // an audited response differed from the replica's bits
  OVERLOADED,      // the worker answered OVERLOADED, or the batch needed more requests than allowed in flight
  TOO_LARGE,       // one row's request or response does not fit the frame limits
  COUNT,
};
inline constexpr size_t kFallbackReasonCount = size_t(FallbackReason::COUNT);
std::string_view fallback_reason_name(FallbackReason r);  // "timeout", "disconnected", ...

struct LayerWire {
  uint64_t calls = 0;           // executor calls for this layer
  uint64_t requests = 0;        // EXPERT_REQUESTs sent
  uint64_t bytes_sent = 0;      // request frames, headers included
  uint64_t bytes_received = 0;  // accepted response frames, headers included
};

struct WorkerReport {
  std::string address;
  std::string label;            // the worker's HELLO label (or the map's), may be empty
  bool connected = false;       // a handshaken session is up now
  uint64_t sessions = 0;        // successful handshakes so far
  uint64_t requests = 0;        // requests sent to it
  uint64_t pairs_served = 0;    // (row, expert) outputs it computed and the backbone accepted
  uint64_t failures = 0;        // requests that fell back (any reason)
  uint64_t audits = 0;          // its answers recomputed from the replica and compared
  uint64_t audits_failed = 0;   // of those, answers that differed (the worker is then dropped)
  double mean_round_trip_ms = 0;  // moving average of its accepted answers' round trips (replica choice)
  std::string last_error;       // why the last session or connect attempt ended, if one did
};

// The hot-expert cache (backbone/hot_expert_cache.h), when the backbone has one.
struct HotCacheReport {
  bool enabled = false;
  uint64_t budget_bytes = 0;
  uint64_t bytes_held = 0;      // verified expert bytes in RAM now
  uint64_t experts_held = 0;
  uint64_t hits = 0;            // (row, expert) pairs computed from the cache instead of sent
  uint64_t fetches = 0;         // downloads verified and inserted
  uint64_t fetch_bytes = 0;     // their bytes
  uint64_t refusals = 0;        // downloads refused: digest or shape not the expected one, malformed header
  uint64_t fetch_failures = 0;  // downloads that did not complete (connection, HTTP status)
  uint64_t evictions = 0;
  std::string last_refusal;     // why the last refused download was refused
};

struct DispatchStats {
  uint64_t layer_calls = 0;
  uint64_t pairs = 0;                  // (row, expert) pairs asked for
  uint64_t pairs_remote = 0;           // answered by a worker and used
  uint64_t pairs_local = 0;            // owned by no worker: the backbone's own share
  uint64_t pairs_fallback = 0;         // a worker's share recomputed locally (by reason below)
  uint64_t pairs_cached = 0;           // computed from the hot-expert cache, never sent
  uint64_t calls_from_cache = 0;       // layer calls the cache served without any request (no round trip)
  uint64_t requests = 0;               // EXPERT_REQUESTs sent
  uint64_t responses = 0;              // accepted EXPERT_RESPONSEs
  uint64_t audits = 0;                 // responses re-computed locally and compared
  uint64_t hedges = 0;                 // duplicates sent to a second replica for a late request
  uint64_t hedge_wins = 0;             // of which the duplicate's answer was the one used
  // Without a local copy of the experts (a backbone file, docs/dispatch.md): pairs whose first answer failed
  // and that another live replica then served, and layer calls that failed because no replica answered.
  uint64_t pairs_retried = 0;
  uint64_t calls_failed = 0;
  std::array<uint64_t, kFallbackReasonCount> fallback_requests{};  // requests, by reason (0 for UNAVAILABLE)
  std::array<uint64_t, kFallbackReasonCount> fallback_pairs{};     // pairs, by reason
  std::vector<LayerWire> layers;       // indexed by layer
  std::vector<WorkerReport> workers;   // map order
  HotCacheReport hot;                  // filled in by whoever owns the cache (enabled = false without one)
  double seconds = 0;                  // wall time inside the executor
  double max_call_seconds = 0;         // the slowest layer call (bounded by the deadline + local compute)

  uint64_t bytes_sent() const;
  uint64_t bytes_received() const;
  uint64_t fallbacks() const;          // pairs recomputed, all reasons
  std::string to_json() const;
  std::string to_text() const;         // a few human lines
};

}  // namespace essaim::backbone
