#include "worker/expert_request.h"

#include <climits>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/matmul.h"

namespace essaim::worker {

namespace {

using proto::ErrorCode;
using proto::ExpertError;

std::string held_ranges(const ExpertStore& store, int32_t layer) {
  std::string s;
  for (const ExpertLayer& l : store.ranges(layer)) {
    if (!s.empty()) s += ", ";
    s += std::to_string(l.expert_begin) + "-" + std::to_string(l.expert_begin + l.n_experts - 1);
  }
  return s;
}

std::string held_layers(const ExpertStore& store) {
  std::string s;
  for (int32_t l = 0; l < store.n_layers(); ++l) {
    if (store.ranges(l).empty()) continue;
    if (!s.empty()) s += "; ";
    s += std::to_string(l) + " (experts " + held_ranges(store, l) + ")";
  }
  return s;
}

// Bytes of one activation row of the layer when it travels as `type` (the kernel form, or F32).
uint64_t row_bytes_as(const ExpertLayer& l, GgmlType type) {
  return type == GgmlType::F32 ? uint64_t(l.n_embd) * sizeof(float) : l.activation_row_bytes();
}

}  // namespace

std::optional<ExpertError> check_expert_request(const ExpertStore& store, const proto::ExpertRequest& r,
                                                uint64_t max_response_payload) {
  auto fail = [&](ErrorCode code, std::string message) {
    return ExpertError{.request_id = r.request_id, .code = code, .message = std::move(message)};
  };
  if (r.request_id == proto::kNoRequestId) return fail(ErrorCode::MALFORMED, "request id 0 is reserved");
  const ExpertLayer* l = r.layer <= uint32_t(INT32_MAX) ? store.any(int32_t(r.layer)) : nullptr;
  if (l == nullptr)
    return fail(ErrorCode::WRONG_LAYER, "this worker holds no expert of layer " + std::to_string(r.layer) +
                                            "; it holds layer " + held_layers(store));
  const auto layer = int32_t(r.layer);
  const GgmlType native = l->activation_type();
  if (r.act_type != native && r.act_type != GgmlType::F32)
    return fail(ErrorCode::BAD_ENCODING, "layer " + std::to_string(layer) + " takes " +
                                             std::string(type_name(native)) + " or F32 activations, not " +
                                             std::string(type_name(r.act_type)));
  const uint64_t want = row_bytes_as(*l, r.act_type);
  if (r.act_row_bytes != want)
    return fail(ErrorCode::BAD_SHAPE, "activation rows of " + std::to_string(r.act_row_bytes) + " bytes; layer " +
                                          std::to_string(layer) + " has n_embd " + std::to_string(l->n_embd) +
                                          ", i.e. " + std::to_string(want) + "-byte " +
                                          std::string(type_name(r.act_type)) + " rows");
  for (uint32_t e : r.expert_ids) {
    if (e > uint32_t(INT32_MAX) || store.find(layer, int32_t(e)) == nullptr)
      return fail(ErrorCode::UNKNOWN_EXPERT, "expert " + std::to_string(e) + " of layer " + std::to_string(layer) +
                                                 " is not held here (held: " + held_ranges(store, layer) + ")");
  }
  const uint64_t response = proto::expert_response_payload_bytes(r.n_pairs(), uint64_t(l->n_embd), r.output);
  if (response > max_response_payload)
    return fail(ErrorCode::BAD_SHAPE, "the response to " + std::to_string(r.n_pairs()) + " pairs would take " +
                                          std::to_string(response) + " bytes, over the peer's frame limit of " +
                                          std::to_string(max_response_payload) + "; split the batch");
  return std::nullopt;
}

uint64_t expert_request_cost_bytes(const proto::ExpertRequest& r, const ExpertStore& store) {
  const ExpertLayer* l = r.layer <= uint32_t(INT32_MAX) ? store.any(int32_t(r.layer)) : nullptr;
  const uint64_t n_embd = l ? uint64_t(l->n_embd) : 0;
  const uint64_t act_kernel = l ? l->activation_row_bytes() : 0;
  // The request's buffers, the kernel-form rows expanded per pair, the f32 outputs, and their encoded frame.
  return r.activations.size() + 8 * r.n_pairs() + r.n_pairs() * act_kernel + 2 * r.n_pairs() * n_embd * sizeof(float);
}

Result<proto::ExpertResponse> compute_expert_request(const ExpertStore& store, const proto::ExpertRequest& r,
                                                     ThreadPool* pool, ExpertExecutor* executor) {
  const ExpertLayer* l = store.any(int32_t(r.layer));
  if (l == nullptr) return Status::error("layer " + std::to_string(r.layer) + " is not held");
  const int64_t n_rows = int64_t(r.n_rows());
  const int64_t n_pairs = int64_t(r.n_pairs());
  const int64_t E = l->n_embd;
  const uint64_t act_bytes = l->activation_row_bytes();

  proto::ExpertResponse resp{.request_id = r.request_id, .n_outputs = uint32_t(n_pairs), .n_embd = uint32_t(E),
                             .output = r.output, .outputs = {}};
  if (n_pairs == 0) return resp;

  // Rows in the layer's kernel form: as received, or quantised here per row exactly as the backbone does.
  std::vector<uint8_t> quantised;
  const uint8_t* rows = r.activations.data();
  if (r.act_type != l->activation_type()) {
    std::vector<float> f(size_t(n_rows * E));  // [n_rows][E]; copied, the bytes need not be float-aligned
    std::memcpy(f.data(), r.activations.data(), f.size() * sizeof(float));
    quantised.resize(size_t(n_rows) * act_bytes);
    quantize_activations(l->gate.type, f.data(), n_rows, E, quantised.data());
    rows = quantised.data();
  }

  // The request is CSR (a count of experts per row); the executor takes [rows][k]. One batch row per pair
  // with k = 1 makes the executor's output exactly the response's pair order. The expert FFN is batch
  // invariant (docs/invariants.md invariant 2), so repeating a row changes no bit of its outputs.
  std::vector<int32_t> ids(r.expert_ids.begin(), r.expert_ids.end());  // [n_pairs]
  bool one_per_row = n_rows == n_pairs;
  for (uint32_t c : r.row_expert_counts) one_per_row = one_per_row && c == 1;
  std::vector<uint8_t> expanded;
  if (!one_per_row) {
    expanded.resize(size_t(n_pairs) * act_bytes);  // [n_pairs][act_bytes]
    size_t pair = 0;
    for (int64_t row = 0; row < n_rows; ++row)
      for (uint32_t j = 0; j < r.row_expert_counts[size_t(row)]; ++j, ++pair)
        std::memcpy(expanded.data() + pair * act_bytes, rows + size_t(row) * act_bytes, act_bytes);
    rows = expanded.data();
  }

  resp.outputs.resize(size_t(n_pairs * E));  // [n_pairs][E]
  ExpertBatch batch{.layer = int32_t(r.layer), .n_rows = n_pairs, .k = 1, .act_type = l->activation_type(),
                    .act = {rows, size_t(n_pairs) * act_bytes}, .ids = ids};
  if (executor != nullptr) {
    ESSAIM_RETURN_IF_ERROR(executor->compute(batch, resp.outputs));
  } else {
    LocalExpertExecutor local(store, pool);
    ESSAIM_RETURN_IF_ERROR(local.compute(batch, resp.outputs));
  }
  // The lean wire (v3): rounded here, whichever device computed the f32 rows, with the one rounding the
  // backbone's replica uses (core/expert_output.h), so a fallback or a monolithic run gets the same bits.
  round_expert_outputs(r.output, resp.outputs);
  return resp;
}

}  // namespace essaim::worker
