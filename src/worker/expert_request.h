// One EXPERT_REQUEST against the experts a worker holds, as two pure functions: the worker's checks (each
// failure a typed ERROR the backbone can act on, the connection staying up) and the computation itself,
// which is moe's expert FFN on the slice's bytes and nothing else (docs/invariants.md invariant 4).
//
//   if (std::optional<proto::ExpertError> e = check_expert_request(store, req, peer_limit)) send(*e);
//   else {
//     Result<proto::ExpertResponse> r = compute_expert_request(store, req, &pool);
//     send(r ? Message(*r) : Message(ExpertError{req.request_id, ErrorCode::INTERNAL, r.status().message()}));
//   }
//
// Exactness: the activation bytes reach expert_ffn exactly as they arrived (Q8_K rows for K-quant experts),
// so output pair i is bit-identical to what the backbone's LocalExpertExecutor computes for the same row
// and expert. F32 rows are accepted too and quantised here by the same per-row routine the backbone uses.
#pragma once

#include <cstdint>
#include <optional>

#include "core/status.h"
#include "core/thread_pool.h"
#include "moe/executor.h"
#include "proto/messages.h"

namespace essaim::worker {

// Checks, in this order: request id not 0 (MALFORMED); layer held (WRONG_LAYER); activation type the
// layer's kernels consume, or F32 (BAD_ENCODING); row size = one row of n_embd in that type (BAD_SHAPE);
// every expert id held for the layer (UNKNOWN_EXPERT); the response fits max_response_payload, the peer's
// frame limit (BAD_SHAPE: split the batch). nullopt when the request can be computed.
std::optional<proto::ExpertError> check_expert_request(const ExpertStore& store, const proto::ExpertRequest& r,
                                                       uint64_t max_response_payload);

// Bytes of memory a request holds while in flight: its own buffers plus its response. For admission.
uint64_t expert_request_cost_bytes(const proto::ExpertRequest& r, const ExpertStore& store);

// Computes a request that passed check_expert_request: one f32 row of n_embd per (row, expert) pair, in
// the request's pair order. pool may be null (single-threaded). executor: who computes the experts (same
// contract as LocalExpertExecutor over `store`, e.g. a GPU's); null = LocalExpertExecutor(store, pool).
Result<proto::ExpertResponse> compute_expert_request(const ExpertStore& store, const proto::ExpertRequest& r,
                                                     ThreadPool* pool, ExpertExecutor* executor = nullptr);

}  // namespace essaim::worker
