#include "moe/expert_ffn.h"

#include <cstring>
#include <string>
#include <vector>

#include "moe/numerics.h"

namespace essaim {
namespace {

ExpertMatrices view_of(const ExpertLayer::Tensor3d& t, int64_t rows, uint64_t row_offset) {
  const uint64_t row_stride = type_traits(t.type).block_size ? type_traits(t.type).row_bytes(uint64_t(t.cols)) : 0;
  return ExpertMatrices{.type = t.type, .cols = t.cols, .rows = rows, .data = t.data + row_offset * row_stride,
                        .row_stride = row_stride, .expert_stride = row_stride * uint64_t(t.rows)};
}

Status check_matrices(const ExpertMatrices& m, const char* what, int64_t cols, int64_t rows) {
  const TypeTraits& tt = type_traits(m.type);
  if (!tt.computable || tt.block_size == 0)
    return Status::error(std::string("expert ") + what + " weights have type " + std::string(tt.name) +
                         ", which essaim cannot compute");
  if (m.cols != cols || m.rows != rows)
    return Status::error(std::string("expert ") + what + " weights are [" + std::to_string(m.cols) + ", " +
                         std::to_string(m.rows) + "], expected [" + std::to_string(cols) + ", " +
                         std::to_string(rows) + "]");
  if (cols % tt.block_size != 0)
    return Status::error(std::string("expert ") + what + " input width " + std::to_string(cols) +
                         " is not a multiple of the " + std::string(tt.name) + " block size");
  if (m.row_stride != tt.row_bytes(uint64_t(cols)) || m.expert_stride < m.row_stride * uint64_t(rows))
    return Status::error(std::string("expert ") + what + " strides do not cover the rows");
  if (m.data == nullptr) return Status::error(std::string("expert ") + what + " weights have no data");
  return Status::ok();
}

}  // namespace

ExpertLayer ExpertLayer::separate(const Tensor3d& gate, const Tensor3d& up, const Tensor3d& down,
                                  int32_t expert_begin) {
  ExpertLayer l;
  l.n_embd = int32_t(gate.cols);
  l.n_ff = int32_t(gate.rows);
  l.expert_begin = expert_begin;
  l.n_experts = int32_t(gate.n_experts);
  l.gate = view_of(gate, gate.rows, 0);
  l.up = view_of(up, up.rows, 0);
  l.down = view_of(down, down.rows, 0);
  return l;
}

ExpertLayer ExpertLayer::fused(const Tensor3d& gate_up, const Tensor3d& down, int32_t expert_begin) {
  ExpertLayer l;
  l.n_embd = int32_t(gate_up.cols);
  l.n_ff = int32_t(gate_up.rows / 2);
  l.expert_begin = expert_begin;
  l.n_experts = int32_t(gate_up.n_experts);
  l.gate = view_of(gate_up, l.n_ff, 0);
  l.up = view_of(gate_up, l.n_ff, uint64_t(l.n_ff));
  l.down = view_of(down, down.rows, 0);
  return l;
}

Status ExpertLayer::validate() const {
  if (n_embd <= 0 || n_ff <= 0 || n_experts <= 0 || expert_begin < 0)
    return Status::error("expert layer has empty or negative dimensions");
  ESSAIM_RETURN_IF_ERROR(check_matrices(gate, "gate", n_embd, n_ff));
  ESSAIM_RETURN_IF_ERROR(check_matrices(up, "up", n_embd, n_ff));
  ESSAIM_RETURN_IF_ERROR(check_matrices(down, "down", n_ff, n_embd));
  // The activation is quantised once and consumed by both the gate and the up product.
  if (type_traits(gate.type).vec_dot_type != type_traits(up.type).vec_dot_type)
    return Status::error("expert gate (" + std::string(type_name(gate.type)) + ") and up (" +
                         std::string(type_name(up.type)) + ") weights need different activation formats");
  return Status::ok();
}

Status expert_ffn(const ExpertLayer& layer, const uint8_t* act, int64_t n_rows, int32_t k, const int32_t* ids,
                  float* out, ThreadPool* pool) {
  const int64_t n_pairs = n_rows * k;
  // Group (row, slot) pairs by expert, in ascending pair order: counting sort over the held range.
  std::vector<int64_t> count(size_t(layer.n_experts) + 1, 0);
  for (int64_t i = 0; i < n_pairs; ++i) {
    const int32_t e = ids[i];
    if (e == -1) continue;
    if (!layer.holds(e))
      return Status::error("expert " + std::to_string(e) + " is not held (this layer holds experts " +
                           std::to_string(layer.expert_begin) + ".." +
                           std::to_string(layer.expert_begin + layer.n_experts - 1) + ")");
    ++count[size_t(e - layer.expert_begin) + 1];
  }
  for (size_t j = 1; j < count.size(); ++j) count[j] += count[j - 1];
  std::vector<int64_t> pairs(size_t(count.back()));  // pair indices r*k+s, grouped by expert
  {
    std::vector<int64_t> fill(count.begin(), count.end() - 1);
    for (int64_t i = 0; i < n_pairs; ++i)
      if (ids[i] != -1) pairs[size_t(fill[size_t(ids[i] - layer.expert_begin)]++)] = i;
  }

  const uint64_t act_bytes = layer.activation_row_bytes();
  const uint64_t down_act_bytes = activation_row_bytes(layer.down.type, layer.n_ff);
  const size_t F = size_t(layer.n_ff), E = size_t(layer.n_embd);
  std::vector<uint8_t> xq, aq;
  std::vector<float> g, u, y;
  for (int32_t j = 0; j < layer.n_experts; ++j) {
    const int64_t begin = count[size_t(j)], m = count[size_t(j) + 1] - begin;
    if (m == 0) continue;
    // Gather the selected activation rows (bytes, so the quantised form is used exactly as received).
    xq.resize(size_t(m) * act_bytes);
    for (int64_t i = 0; i < m; ++i)
      std::memcpy(xq.data() + size_t(i) * act_bytes, act + size_t(pairs[size_t(begin + i)] / k) * act_bytes,
                  act_bytes);
    g.resize(size_t(m) * F);  // [m][F]
    u.resize(size_t(m) * F);  // [m][F]
    matmul_preq(layer.gate.expert(j), xq.data(), m, g.data(), pool);
    matmul_preq(layer.up.expert(j), xq.data(), m, u.data(), pool);
    for (size_t i = 0; i < g.size(); ++i) g[i] = silu(g[i]) * u[i];  // a = silu(gate) ⊙ up
    aq.resize(size_t(m) * down_act_bytes);
    quantize_activations(layer.down.type, g.data(), m, layer.n_ff, aq.data());
    y.resize(size_t(m) * E);  // [m][E]
    matmul_preq(layer.down.expert(j), aq.data(), m, y.data(), pool);
    for (int64_t i = 0; i < m; ++i)
      std::memcpy(out + size_t(pairs[size_t(begin + i)]) * E, y.data() + size_t(i) * E, E * sizeof(float));
  }
  return Status::ok();
}

}  // namespace essaim
