// What an expert worker serves: its expert slices, opened and validated, the expert store built from their
// zero-copy views, and the HELLO that announces them (docs/invariants.md "Two roles": the worker's memory is its
// slices plus a small constant; it never maps the full model).
//
//   ESSAIM_ASSIGN_OR_RETURN(WorkerState state, WorkerState::open({"m.L03.E00-15.gguf", "m.L04.E00-15.gguf"}));
//   state.holdings();     // {{3, 0, 16}, {4, 0, 16}}: (layer, first expert, count), announced at handshake
//   state.model();        // the source model's identity; every slice must agree on it
//   state.store();        // moe's ExpertStore over the slices' bytes: what LocalExpertExecutor computes from
//
// Immutable once built, so any number of connections read it concurrently without locks.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "slice/expert_slice.h"
#include "moe/executor.h"
#include "proto/messages.h"

namespace essaim::worker {

// This build's kernel contract and the instruction set its kernels use now (kernels_isa()): what a HELLO
// carries as the build fingerprint. The backbone builds the same from the same two sources.
proto::BuildFingerprint build_fingerprint();

class WorkerState {
 public:
  // Opens every slice (untrusted files: ExpertSlice validates them) and builds the store. Errors name the
  // file: slices cut from different models, overlapping holdings, an unknown expert activation.
  static Result<WorkerState> open(const std::vector<std::string>& slice_paths);
  static Result<WorkerState> from_slices(std::vector<ExpertSlice> slices);

  WorkerState(WorkerState&&) noexcept = default;
  WorkerState& operator=(WorkerState&&) noexcept = default;

  const ExpertStore& store() const { return store_; }
  const proto::ModelId& model() const { return model_; }
  const std::string& source_architecture() const { return source_architecture_; }
  // One entry per (slice, layer), in slice order then layer order.
  const std::vector<proto::Holding>& holdings() const { return holdings_; }
  std::span<const ExpertSlice> slices() const { return slices_; }
  uint64_t slice_bytes() const;  // sum of the slice files' sizes

  // The HELLO this worker sends: role, fingerprint, model, holdings. max_payload_bytes is set by the
  // connection (net::handshake replaces it with the connection's own limit).
  proto::Hello hello(std::string label = {}) const;

 private:
  WorkerState() = default;

  std::vector<ExpertSlice> slices_;
  ExpertStore store_;  // views into slices_' mappings, which stay put when slices_ moves
  proto::ModelId model_{};
  std::string source_architecture_;
  std::vector<proto::Holding> holdings_;
};

}  // namespace essaim::worker
