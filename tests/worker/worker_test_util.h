// Helpers of the worker tests: tiny synth models on disk with their slices, the backbone's reference
// computation (LocalExpertExecutor over the full model's experts), seeded random requests, and a worker
// served in-process over in-memory pipes.
//
//   const TestModel& m = TestModel::get({.types = SynthTypeMix::Q4_K_M});
//   ServedWorker w({m.slice(0, 1, 0, 3)});                      // layer 0, experts 0-2
//   std::unique_ptr<net::FrameConnection> c = w.connect();       // handshake done
//   proto::ExpertRequest r = random_request(m, {.layer = 0, .first = 0, .count = 3}, rng);
//   ... send r, receive the response ...
//   expect_bits_equal(response.outputs, reference_outputs(m, r));
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "gguf/gguf_file.h"
#include "slice/gguf_slice.h"
#include "moe/executor.h"
#include "net/frame_connection.h"
#include "net/pipe.h"
#include "net/stream_server.h"
#include "proto/messages.h"
#include "synth/synth.h"
#include "worker/worker.h"

namespace essaim::worker::testing {

struct ModelSpec {
  SynthArch arch = SynthArch::QWEN3MOE;
  SynthTypeMix types = SynthTypeMix::F32;
  bool fused_gate_up = false;
  uint64_t seed = 1;
};

// A synth model written once per test program (per spec), the full expert store the backbone computes
// from, and slices of it written on demand.
class TestModel {
 public:
  static const TestModel& get(const ModelSpec& spec);

  std::string dir;
  std::string path;
  GgufFile file;
  MoeLayout moe;
  ExpertStore full;  // every expert of every MoE layer, as the backbone's replica holds them

  // Path of the slice of layers [layer_first, +layer_count), experts [expert_first, +expert_count).
  std::string slice(uint32_t layer_first, uint32_t layer_count, uint32_t expert_first, uint32_t expert_count) const;
  uint32_t n_embd() const { return moe.n_embd; }
};

struct Held {
  uint32_t layer = 0;
  uint32_t first = 0;
  uint32_t count = 1;
};

struct RequestShape {
  uint32_t n_rows = 5;
  uint32_t max_k = 3;       // experts per row: min_k..max_k (row 0 has max_k when the holding allows)
  uint32_t min_k = 0;
  bool f32 = false;         // send F32 rows instead of the kernel form
  uint64_t request_id = 1;
};

// Rows of seeded N(0, 1) values; each row selects distinct experts of `held`, in random order.
proto::ExpertRequest random_request(const TestModel& m, const Held& held, std::mt19937_64& rng,
                                    const RequestShape& shape = {});

// What the backbone computes for the request's pairs, in pair order: its own rows quantised by the backbone
// (from the F32 bytes, or the kernel-form bytes as they are), then LocalExpertExecutor over the full model
// with the ids laid out [n_rows][K] padded with -1, as the model's MoE block calls it.
std::vector<float> reference_outputs(const TestModel& m, const proto::ExpertRequest& r);

// Bit patterns equal (so that NaN == NaN and -0 != +0), with the first mismatch reported.
void expect_bits_equal(std::span<const float> got, std::span<const float> want, const std::string& what = "");

proto::Hello backbone_hello(const proto::ModelId& model);

// A worker served by a StreamServer over a PipeHub, as a TCP worker is served, without sockets.
class ServedWorker {
 public:
  explicit ServedWorker(const std::vector<std::string>& slices, WorkerOptions options = {},
                        size_t pipe_capacity = net::kDefaultPipeCapacity);
  ~ServedWorker();

  // A connection with no handshake yet (hostile tests), and one that completed the backbone handshake.
  std::unique_ptr<net::FrameConnection> connect_raw(uint64_t max_payload = proto::kDefaultMaxPayloadBytes);
  std::unique_ptr<net::FrameConnection> connect(uint64_t max_payload = proto::kDefaultMaxPayloadBytes);

  Worker& worker() { return *worker_; }
  const WorkerState& state() const { return *state_; }
  void stop();  // stops the server (closes every connection), idempotent

 private:
  std::unique_ptr<WorkerState> state_;
  std::unique_ptr<Worker> worker_;
  net::PipeHub* hub_ = nullptr;  // owned by server_
  std::unique_ptr<net::StreamServer> server_;
};

// Sends every request, then receives until each has an answer; returns the answers by request order.
// Fails the test (and returns what it has) on a transport error or an ERROR frame.
std::vector<proto::ExpertResponse> exchange_all(net::FrameConnection& c, const std::vector<proto::ExpertRequest>& reqs);

// The worker's stats once `requests` responses have been counted: the worker counts a response after its
// write returns, which may be after the peer has already read it.
WorkerStats stats_after(Worker& w, uint64_t requests);

// Receives one message (5 s deadline), failing the test on a transport error.
proto::Message receive_message(net::FrameConnection& c);

}  // namespace essaim::worker::testing
