// The routed MoE block as the backbone runs it (docs/reference.md 4.3), shared by every MoE architecture:
// route once (authoritative), quantise each row once to the experts' activation format, get the unweighted
// expert outputs from an ExpertExecutor, combine them here in slot order.
//
//   MoeBlock b{.layer = il, .router = weight_matrix(*gate_inp), .n_expert_used = K,
//              .expert_weight_type = gate_exps->type, .n_embd = E};
//   ESSAIM_RETURN_IF_ERROR(moe_block_forward(b, f, n, executor, pool, out));   // out: [n][E]
//
// The combine is a left fold in slot order, each term weighted first:
//     out = ((y_0·w_0 + y_1·w_1) + y_2·w_2) + …       (element-wise, each product rounded)
// It never happens in an executor, so where the experts ran cannot change the sum (docs/invariants.md invariant 1).
#pragma once

#include <cstdint>
#include <span>

#include "core/ggml_type.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "kernels/matmul.h"
#include "moe/executor.h"

namespace essaim {

struct MoeBlock {
  int32_t layer = 0;
  WeightMatrix router;                           // [n_embd -> n_expert], F32 in real files
  int32_t n_expert_used = 0;                     // K
  GgmlType expert_weight_type = GgmlType::F32;  // type of the gate/up expert weights
  int32_t n_embd = 0;
};

// Per-call routing record (optional): ids and weights [n][K] as the router chose them.
struct MoeRouting {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

// with_router: other products of f (a shared expert's gate and up) computed in the router's task set, so
// a decode step wakes the threads once for all of them (matmul_set; same bits as separate products).
Status moe_block_forward(const MoeBlock& block, const float* f, int64_t n_rows, ExpertExecutor& executor,
                         ThreadPool* pool, float* out, MoeRouting* routing = nullptr,
                         std::span<const MatmulOut> with_router = {});

}  // namespace essaim
