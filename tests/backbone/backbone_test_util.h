// Helpers of the dispatch tests: tiny synth models loaded as the backbone loads them, with slices cut on
// demand; evaluation and greedy generation through any ExpertExecutor; expert workers served in-process
// over in-memory pipes (the real worker core), or as `essaim-worker` processes over TCP; and a worker that
// can go down and come back, for reconnection.
//
//   const SwarmModel& m = SwarmModel::get({.types = SynthTypeMix::Q4_K_M});
//   PipeWorker w({m.slice(0, 0, 3), m.slice(1, 0, 3)});               // layers 0-1, experts 0-2
//   auto ex = RemoteExpertExecutor::create(m.model->expert_store(), m.identity, {w.endpoint("w")}, &pool, opts);
//   ex->wait_connected(net::deadline_in(10s));
//   expect_same_bits(eval_logits(m, tokens, *ex), m.mono_logits(tokens));
#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "backbone/remote_executor.h"
#include "child_process.h"
#include "slice/gguf_slice.h"
#include "model/model.h"
#include "net/pipe.h"
#include "net/stream_server.h"
#include "synth/synth.h"
#include "worker/worker.h"

namespace essaim::backbone::testing {

using namespace std::chrono_literals;

struct ModelSpec {
  SynthArch arch = SynthArch::QWEN3MOE;
  SynthTypeMix types = SynthTypeMix::Q4_K_M;
  uint32_t nextn = 0;  // MTP blocks (qwen35moe)
  std::string file;    // a given model (e.g. the trained one of models/) instead of a synth one
};
std::string spec_name(const ModelSpec& s);  // "qwen3moe_q4km", "kjv_moe_q4_k_m": gtest parameter names
inline void PrintTo(const ModelSpec& s, std::ostream* os) { *os << spec_name(s); }

// The three models of the exactness tests: qwen3moe q4_k_m and f32, qwen35moe q4_k_m.
std::vector<ModelSpec> exactness_specs();

// A synth model written once per test program, loaded as `essaim run` loads it.
class SwarmModel {
 public:
  static const SwarmModel& get(const ModelSpec& spec);

  ModelSpec spec;
  std::string dir;
  std::string path;
  std::unique_ptr<Model> model;
  ModelIdentity identity{};
  std::vector<uint32_t> moe_layers;  // layers with routed experts
  uint32_t n_expert = 0;

  // One-layer slice of experts [first, first + count) of `layer`, written on first use.
  std::string slice(uint32_t layer, uint32_t first, uint32_t count) const;
  // Every MoE layer cut into `parts` contiguous expert ranges: result[p] = the slices of part p.
  std::vector<std::vector<std::string>> split_experts(uint32_t parts) const;
  // A fixed token sequence of length n (seeded, in the vocabulary).
  std::vector<int32_t> tokens(size_t n, uint64_t seed = 7) const;
};

// `m` loaded from its backbone file (`essaim slice --backbone`: every tensor but the routed experts, docs/dispatch.md
// "A backbone without the experts"): a shape-only expert store, so a pair no live worker answers fails the call
// instead of being computed locally. Tests of coverage and churn dispatch from it (docs/invariants.md, invariant 5).
std::unique_ptr<Model> backbone_only_model(const SwarmModel& m);
std::string backbone_file_path(const SwarmModel& m);  // that file, written on each call (for `--backbone-file`)

// Teacher-forced logits [n][n_vocab] through `experts`, in chunks of `batch` tokens (0 = all at once).
std::vector<float> eval_logits(const SwarmModel& m, std::span<const int32_t> tokens, ExpertExecutor& experts,
                               size_t batch = 0);
std::vector<float> mono_logits(const SwarmModel& m, std::span<const int32_t> tokens, size_t batch = 0);

// Greedy continuation (argmax, lowest id on ties) of n tokens; `after_token(i)` runs after token i is
// chosen and before it is fed back (kill a worker mid-generation there).
std::vector<int32_t> greedy(const SwarmModel& m, std::span<const int32_t> prompt, int n, ExpertExecutor& experts,
                            const std::function<void(int)>& after_token = {});

// memcmp-equal, with the first differing index reported.
void expect_same_bits(std::span<const float> got, std::span<const float> want, const std::string& what = "");

// The real worker core served over a PipeHub, reached through a Connector. down() stops it (every
// connection closed, new connects refused); up() serves again, as a restarted worker would.
class PipeWorker {
 public:
  explicit PipeWorker(std::vector<std::string> slices, worker::WorkerOptions options = {});
  ~PipeWorker();
  DispatchEndpoint endpoint(std::string name, std::optional<std::vector<proto::Holding>> declared = std::nullopt);
  void down();
  void up();
  worker::WorkerStats stats() const { return worker_->stats(); }

 private:
  struct Slot;
  std::unique_ptr<worker::WorkerState> state_;
  std::unique_ptr<worker::Worker> worker_;
  std::shared_ptr<Slot> slot_;  // shared with the connectors handed out
};

using test_support::ListeningProcess;  // tests/support/child_process.h

// An `essaim-worker` process on 127.0.0.1 with port 0, serving `slices`.
class WorkerProcess : public ListeningProcess {
 public:
  // `launcher` goes in front of the binary (e.g. {"env", "ESSAIM_ISA=neon", "qemu-aarch64"} for an ARM64
  // worker under emulation); its first word is looked up on PATH.
  explicit WorkerProcess(const std::vector<std::string>& slices, const std::string& binary = worker_binary(),
                         const std::vector<std::string>& launcher = {});
  static std::string worker_binary();  // <build>/src/cli/essaim-worker
};

// `n` worker processes serving the model's experts split in n parts, and the map that reaches them.
struct WorkerSwarm {
  std::vector<std::unique_ptr<WorkerProcess>> processes;
  ExpertMap map;
  bool ok() const;  // every process listening
};
WorkerSwarm start_worker_swarm(const SwarmModel& m, uint32_t n);

// Dispatch options for exactness tests: a deadline long enough that a loaded CI machine never falls back.
DispatchOptions patient_options();

}  // namespace essaim::backbone::testing
