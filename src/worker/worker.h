// The expert worker core: serves the expert protocol (docs/protocol.md) on any ByteStream — TCP, an
// in-memory pipe, later the relay's WebSocket — from the experts of its slices (docs/worker.md).
//
//   ESSAIM_ASSIGN_OR_RETURN(WorkerState state, WorkerState::open(slice_paths));
//   Worker worker(state, {.threads = 4, .label = "laptop"});
//   net::StreamServer server(std::move(listener), [&](net::ByteStream& s) { worker.serve_connection(s); });
//   ...
//   server.stop();                  // before the worker goes: no connection may outlive it
//   worker.stats().to_json();
//
// One connection, from serve_connection's point of view:
//   handshake (version, kernel ABI, model identity, holdings; a mismatch is refused with its reason)
//   reader (this thread): frames in -> checks -> admitted requests to the shared ComputePool
//   lanes (shared):       compute -> encoded EXPERT_RESPONSE into this connection's outbox
//   writer (own thread):  outbox -> the stream, frames whole, in whatever order they complete
// Several requests are in flight per connection; a request over the per-connection or the worker-wide
// limit is answered OVERLOADED at once (never queued without bound). Typed errors (WRONG_LAYER,
// UNKNOWN_EXPERT, BAD_SHAPE, BAD_ENCODING, a message that does not decode) keep the connection up; a
// framing error (unknown type, oversized, truncated) or a message not valid after the handshake is answered
// with ERROR and closes this connection only. A peer that never reads stalls only its own writer, which
// gives up after write_timeout.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "net/admission.h"
#include "net/byte_stream.h"
#include "proto/handshake.h"
#include "worker/compute_pool.h"
#include "worker/worker_state.h"
#include "worker/worker_stats.h"

namespace essaim::net {
class FrameConnection;
}

namespace essaim::worker {

// A worker's default frame limit: requests and responses of a decode step are ~100 KiB even at 122B
// shapes, and a smaller limit keeps the memory of frames being read within the worker's small constant.
// The backbone splits big prefill batches to fit (docs/protocol.md, "Limits").
inline constexpr uint64_t kWorkerDefaultMaxPayloadBytes = 16ull << 20;

struct WorkerOptions {
  std::string label{};                // a human name, sent in the HELLO for the peer's logs
  size_t threads = 0;                 // compute threads in all; 0 = every core
  size_t lanes = 1;                   // requests computed at once; the threads are split among them
  uint64_t max_payload_bytes = kWorkerDefaultMaxPayloadBytes;  // largest frame accepted (>= 64 KiB)
  size_t max_in_flight = 16;          // per connection: requests queued, computing or being written
  uint64_t max_pending_bytes = 16ull << 20;  // worker-wide memory of requests in flight (one always fits)
  // A peer has this long to complete the handshake; until then it is unauthenticated: its frames are held
  // to proto::kMaxHelloPayloadBytes and it may be evicted by newer connections (net/admission.h).
  std::chrono::milliseconds handshake_timeout{5'000};
  net::AdmissionLimits admission{};
  std::chrono::milliseconds write_timeout{30'000};  // a peer that reads nothing for this long is dropped
  std::chrono::milliseconds idle_timeout{600'000};  // no whole frame for this long: GOODBYE; 0 = never
  proto::HandshakePolicy policy{};
  // Who computes the experts: null = the CPU kernels (a LocalExpertExecutor per request); else an executor
  // with the same contract, e.g. a GPU's (worker/compute_device.h), which must outlive the worker and be
  // safe to call from several lanes. isa_class, when set, replaces the CPU ISA in the HELLO's fingerprint.
  ExpertExecutor* executor = nullptr;
  std::string isa_class{};
  // Output formats this worker answers in (docs/protocol.md, v3 `output_format`): unset = f32 and bf16,
  // as each request asks; set = only that one, other requests get BAD_ENCODING (a worker on a thin link
  // that must never send f32 rows, say).
  std::optional<ExpertOutput> only_output{};
  std::function<void(const std::string&)> log{};    // connection events (refusals, closes); null = silent
};

class Worker {
 public:
  // `state` must outlive the worker.
  explicit Worker(const WorkerState& state, WorkerOptions options = {});
  ~Worker();  // every serve_connection must have returned
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Serves one connection until the peer leaves, breaks the protocol, idles out, or the stream is closed
  // (StreamServer::stop does that); then closes the stream. Call from one thread per connection.
  void serve_connection(net::ByteStream& stream);

  WorkerStats stats() const;
  // For StreamServer's on_refused: a REFUSE BUSY written without waiting, counted as a refusal.
  void refuse_over_capacity(net::ByteStream& stream);
  const WorkerState& state() const { return state_; }
  const WorkerOptions& options() const { return options_; }
  proto::Hello hello() const;  // what serve_connection announces (max_payload_bytes = the frame limit)

 private:
  struct Session;
  struct Outgoing;
  class Admission;
  struct Job;

  void read_loop(net::FrameConnection& c, const std::shared_ptr<Session>& s);
  void write_loop(net::FrameConnection& c, Session& s);
  void handle_request(net::FrameConnection& c, const std::shared_ptr<Session>& s, proto::ExpertRequest req);
  // Queues a frame for the writer. Control frames (errors, pongs) wait for room, so that a peer that sends
  // faster than it reads is slowed down rather than buffered without bound.
  void push_control(Session& s, const proto::Message& m);
  void push_error(Session& s, uint64_t request_id, proto::ErrorCode code, std::string message);
  void release(Session& s, uint64_t bytes);
  void log(const std::string& line) const;

  const WorkerState& state_;
  WorkerOptions options_;
  WorkerCounters counters_;
  net::Admission admission_;
  std::mutex budget_mu_;
  uint64_t pending_bytes_ = 0;  // guarded by budget_mu_
  ComputePool pool_;            // last: its lanes stop before anything they use goes away
};

}  // namespace essaim::worker
