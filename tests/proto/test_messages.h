// Seeded sample messages for the proto tests: one of every type, with contents that vary per seed.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "proto/messages.h"

namespace essaim::proto::testing {

inline Hello sample_hello(std::mt19937_64& rng, Role role) {
  Hello h;
  h.role = role;
  h.fingerprint = {.kernel_abi = 3, .isa_class = "avx2"};
  for (uint8_t& b : h.model) b = static_cast<uint8_t>(rng());
  h.max_payload_bytes = kDefaultMaxPayloadBytes;
  h.label = "node-" + std::to_string(rng() % 1000);
  if (role == Role::WORKER) {
    for (uint32_t l = 0; l < 3; ++l) {
      h.holdings.push_back({l, uint32_t(rng() % 128), uint32_t(1 + rng() % 64)});
      for (uint8_t& b : h.holdings.back().sha256) b = uint8_t(rng());
    }
  }
  return h;
}

// n_rows rows of Q8_K activations (292-byte blocks) for an n_embd of 512, 1..4 experts per row.
inline ExpertRequest sample_request(std::mt19937_64& rng, uint32_t n_rows) {
  ExpertRequest r;
  r.request_id = 1 + rng() % 1000000;
  r.layer = uint32_t(rng() % 48);
  r.act_type = GgmlType::Q8_K;
  r.act_row_bytes = 2 * 292;
  for (uint32_t i = 0; i < n_rows; ++i) {
    uint32_t k = 1 + uint32_t(rng() % 4);
    r.row_expert_counts.push_back(k);
    for (uint32_t j = 0; j < k; ++j) r.expert_ids.push_back(uint32_t(rng() % 256));
  }
  r.activations.resize(n_rows * r.act_row_bytes);
  for (uint8_t& b : r.activations) b = static_cast<uint8_t>(rng());
  return r;
}

inline ExpertResponse sample_response(std::mt19937_64& rng, uint32_t n_outputs, uint32_t n_embd) {
  ExpertResponse r{.request_id = 1 + rng() % 1000000, .n_outputs = n_outputs, .n_embd = n_embd, .outputs = {}};
  std::normal_distribution<float> normal(0.f, 1.f);
  r.outputs.resize(size_t(n_outputs) * n_embd);
  for (float& v : r.outputs) v = normal(rng);
  return r;
}

// One message of every type, in frame-type order.
inline std::vector<Message> sample_messages(uint64_t seed) {
  std::mt19937_64 rng(seed);
  return {
      sample_hello(rng, Role::WORKER),
      HelloAck{},
      Refuse{RefuseReason::MODEL, "peer serves another model"},
      sample_request(rng, 3),
      sample_response(rng, 5, 64),
      ExpertError{.request_id = rng(), .code = ErrorCode::UNKNOWN_EXPERT, .message = "expert 300 not held"},
      Ping{rng()},
      Pong{rng()},
      Goodbye{"shutting down"},
  };
}

}  // namespace essaim::proto::testing
