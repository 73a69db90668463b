// Matrix products on an NVIDIA GPU, bit-identical to kernels/matmul.h's matmul_preq: weights and
// activation rows already on the device, in the same bytes the CPU kernels read (GGUF blocks; activation
// rows in the weights' vec_dot format, e.g. Q8_K for K-quants). CUDA builds only (ESSAIM_CUDA=ON).
//
//   CudaMatrix w{.type = GgmlType::Q4_K, .cols = 3072, .rows = 1024, .data = dev_w, .row_stride = 1728};
//   ESSAIM_RETURN_IF_ERROR(cuda_matmul_preq(w, dev_xq, n_rows, dev_y, stream));   // y: [n_rows][1024] f32
//
// One device thread computes y[t][r] = dot(weight row r, activation row t) for one weight row and a tile of
// up to four activation rows: gpu/dot_device_tiles.h for Q4_K, Q5_K, Q6_K and Q8_0 (dp4a, weights decoded
// once per tile), gpu/dot_device.h for the float formats — each the scalar reference's canonical order with
// explicitly rounded f32 operations — so no bit depends on the launch shape, the batch or the row's
// position in it (docs/invariants.md invariant 2). Q4_K and Q5_K read their activation rows in lanes4 order:
// prepare_activations (expert_pipeline.h) rewrites rows into the layout the kernel reads (same size).
#pragma once

#include <cstdint>
#include <string>

#include "core/ggml_type.h"
#include "core/status.h"
#include "gpu/device_matrix.h"

namespace essaim::gpu {

using CudaMatrix = DeviceMatrix;  // device pointer; row o at data + o * row_stride

// True for the weight types the device kernels compute (F32 F16 BF16 Q8_0 Q4_K Q5_K Q6_K: every type
// kernels/ computes).
bool cuda_matmul_type_supported(GgmlType type);

// Enqueues y = xq · wᵀ on `stream` (a cudaStream_t; nullptr = the default stream). xq: n_rows activation
// rows of activation_row_bytes(w.type, w.cols) each, prepared by prepare_activations, device memory; y: n_rows * w.rows floats, device memory.
// Returns the launch error, if any; errors of the kernel itself surface at the next synchronisation.
Status cuda_matmul_preq(const CudaMatrix& w, const uint8_t* xq, int64_t n_rows, float* y, void* stream);

// The grouped product of a request: for every tile (device array `tiles`, n_tiles entries),
// y[row + j] = x[row + j] · W_expertᵀ for j < nx, W_e being w advanced by e * expert_stride. One launch for
// all the experts of a request: thread x takes a weight row, grid row y a tile. x rows prepared as above.
Status cuda_matmul_experts(const CudaMatrix& w, uint64_t expert_stride, const ExpertTile* tiles, int64_t n_tiles,
                           const uint8_t* x, float* y, void* stream);

// Wraps a CUDA runtime error code as a Status ("what: cudaErrorXxx: text"); ok for cudaSuccess.
Status cuda_status(int error, const std::string& what);

}  // namespace essaim::gpu
