// Launchers of the device matrix products (cuda_matmul.h). Thread x of a block takes weight row r, grid row
// y takes a tile of up to kTileRows activation rows, so a warp reads the same activation rows (broadcasts)
// against 32 weight rows. A plain layout (no shared-memory staging, no tensor cores, which have no exact
// integer-to-float path of the reference's shape); docs/worker.md ("GPU workers") compares it with the
// roofline.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "gpu/cuda_matmul.h"
#include "gpu/dot_device.h"
#include "gpu/dot_device_tiles.h"
#include "kernels/matmul.h"

namespace essaim::gpu {
namespace {

using DotFn = float (*)(int64_t, const void*, const void*);

struct DotF32 { __device__ static float dot(int64_t n, const void* w, const void* x) { return dot_f32(n, w, x); } };
struct DotF16 { __device__ static float dot(int64_t n, const void* w, const void* x) { return dot_f16(n, w, x); } };
struct DotBF16 { __device__ static float dot(int64_t n, const void* w, const void* x) { return dot_bf16(n, w, x); } };

// Tile kernels: y[j] = dot(w, x + j * x_stride), j < nx <= kTileRows.
struct TileF32 {
  __device__ static void dot(int64_t n, const void* w, const void* x, uint64_t xs, int nx, float* y) { dot_f32_tile(n, w, x, xs, nx, y); }
};
struct TileF16 {
  __device__ static void dot(int64_t n, const void* w, const void* x, uint64_t xs, int nx, float* y) { dot_f16_tile(n, w, x, xs, nx, y); }
};
struct TileBF16 {
  __device__ static void dot(int64_t n, const void* w, const void* x, uint64_t xs, int nx, float* y) { dot_bf16_tile(n, w, x, xs, nx, y); }
};
struct TileQ8_0 {
  __device__ static void dot(int64_t n, const void* w, const void* x, uint64_t xs, int nx, float* y) { dot_q8_0_tile(n, w, x, xs, nx, y); }
};
struct TileQ4K {
  __device__ static void dot(int64_t n, const void* w, const void* x, uint64_t xs, int nx, float* y) { dot_q45k_tile<BlockQ4K>(n, w, x, xs, nx, y); }
};
struct TileQ5K {
  __device__ static void dot(int64_t n, const void* w, const void* x, uint64_t xs, int nx, float* y) { dot_q45k_tile<BlockQ5K>(n, w, x, xs, nx, y); }
};
struct TileQ6K {
  __device__ static void dot(int64_t n, const void* w, const void* x, uint64_t xs, int nx, float* y) { dot_q6k_tile(n, w, x, xs, nx, y); }
};

constexpr int kThreads = 128;
constexpr int64_t kMaxGridY = 65535;

template <typename Dot>
__global__ void matmul_kernel(const uint8_t* __restrict__ w, uint64_t w_stride, int64_t rows, int64_t cols,
                              const uint8_t* __restrict__ x, uint64_t x_stride, int64_t n_rows,
                              float* __restrict__ y) {
  const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  for (int64_t t = blockIdx.y; t < n_rows; t += gridDim.y)
    y[t * rows + r] = Dot::dot(cols, w + uint64_t(r) * w_stride, x + uint64_t(t) * x_stride);
}

template <typename Tile>
__global__ void matmul_tile_kernel(const uint8_t* __restrict__ w, uint64_t w_stride, int64_t rows, int64_t cols,
                                   const uint8_t* __restrict__ x, uint64_t x_stride, int64_t n_rows,
                                   float* __restrict__ y) {
  const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  for (int64_t t0 = int64_t(blockIdx.y) * kTileRows; t0 < n_rows; t0 += int64_t(gridDim.y) * kTileRows) {
    const int nx = int(n_rows - t0 < kTileRows ? n_rows - t0 : kTileRows);
    float out[kTileRows];
    Tile::dot(cols, w + uint64_t(r) * w_stride, x + uint64_t(t0) * x_stride, x_stride, nx, out);
    for (int j = 0; j < kTileRows; ++j)
      if (j < nx) y[(t0 + j) * rows + r] = out[j];
  }
}

template <typename Tile>
void launch_tiles(const CudaMatrix& w, const uint8_t* xq, int64_t n_rows, float* y, cudaStream_t stream) {
  const int64_t tiles = (n_rows + kTileRows - 1) / kTileRows;
  const dim3 grid(unsigned((w.rows + kThreads - 1) / kThreads), unsigned(std::min(tiles, kMaxGridY)));
  matmul_tile_kernel<Tile><<<grid, kThreads, 0, stream>>>(w.data, w.row_stride, w.rows, w.cols, xq,
                                                          activation_row_bytes(w.type, w.cols), n_rows, y);
}

// Every tile of a request against every weight row of its expert (cuda_matmul_experts).
template <typename Tile>
__global__ void matmul_experts_kernel(const uint8_t* __restrict__ w0, uint64_t expert_stride, uint64_t w_stride,
                                      int64_t rows, int64_t cols, const ExpertTile* __restrict__ tiles, int64_t n_tiles,
                                      const uint8_t* __restrict__ x, uint64_t x_stride, float* __restrict__ y) {
  const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  for (int64_t i = blockIdx.y; i < n_tiles; i += gridDim.y) {
    const ExpertTile t = tiles[i];
    float out[kTileRows];
    Tile::dot(cols, w0 + uint64_t(t.expert) * expert_stride + uint64_t(r) * w_stride, x + uint64_t(t.row) * x_stride,
              x_stride, t.nx, out);
    for (int j = 0; j < kTileRows; ++j)
      if (j < t.nx) y[(t.row + j) * rows + r] = out[j];
  }
}

template <typename Tile>
void launch_experts(const CudaMatrix& w, uint64_t expert_stride, const ExpertTile* tiles, int64_t n_tiles,
                    const uint8_t* x, float* y, cudaStream_t stream) {
  const dim3 grid(unsigned((w.rows + kThreads - 1) / kThreads), unsigned(std::min(n_tiles, kMaxGridY)));
  matmul_experts_kernel<Tile><<<grid, kThreads, 0, stream>>>(w.data, expert_stride, w.row_stride, w.rows, w.cols, tiles,
                                                             n_tiles, x, activation_row_bytes(w.type, w.cols), y);
}

template <typename Dot>
void launch(const CudaMatrix& w, const uint8_t* xq, int64_t n_rows, float* y, cudaStream_t stream) {
  const dim3 grid(unsigned((w.rows + kThreads - 1) / kThreads), unsigned(std::min(n_rows, kMaxGridY)));
  matmul_kernel<Dot><<<grid, kThreads, 0, stream>>>(w.data, w.row_stride, w.rows, w.cols, xq,
                                                    activation_row_bytes(w.type, w.cols), n_rows, y);
}

}  // namespace

bool cuda_matmul_type_supported(GgmlType type) {
  switch (type) {
    case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: case GgmlType::Q8_0:
    case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K:
      return true;
    default:
      return false;
  }
}

Status cuda_matmul_experts(const CudaMatrix& w, uint64_t expert_stride, const ExpertTile* tiles, int64_t n_tiles,
                           const uint8_t* x, float* y, void* stream_ptr) {
  if (n_tiles <= 0 || w.rows <= 0) return Status::ok();
  const auto stream = static_cast<cudaStream_t>(stream_ptr);
  switch (w.type) {
    case GgmlType::F32: launch_experts<TileF32>(w, expert_stride, tiles, n_tiles, x, y, stream); break;
    case GgmlType::F16: launch_experts<TileF16>(w, expert_stride, tiles, n_tiles, x, y, stream); break;
    case GgmlType::BF16: launch_experts<TileBF16>(w, expert_stride, tiles, n_tiles, x, y, stream); break;
    case GgmlType::Q8_0: launch_experts<TileQ8_0>(w, expert_stride, tiles, n_tiles, x, y, stream); break;
    case GgmlType::Q4_K: launch_experts<TileQ4K>(w, expert_stride, tiles, n_tiles, x, y, stream); break;
    case GgmlType::Q5_K: launch_experts<TileQ5K>(w, expert_stride, tiles, n_tiles, x, y, stream); break;
    case GgmlType::Q6_K: launch_experts<TileQ6K>(w, expert_stride, tiles, n_tiles, x, y, stream); break;
    default:
      return Status::error(std::string("the CUDA kernels cannot compute ") + std::string(type_name(w.type)) + " weights");
  }
  return cuda_status(cudaGetLastError(), std::string("launching the ") + std::string(type_name(w.type)) + " expert products");
}

Status cuda_status(int error, const std::string& what) {
  if (error == cudaSuccess) return Status::ok();
  const auto e = cudaError_t(error);
  return Status::error(what + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

Status cuda_matmul_preq(const CudaMatrix& w, const uint8_t* xq, int64_t n_rows, float* y, void* stream_ptr) {
  if (n_rows <= 0 || w.rows <= 0) return Status::ok();
  const auto stream = static_cast<cudaStream_t>(stream_ptr);
  switch (w.type) {
    case GgmlType::F32: launch<DotF32>(w, xq, n_rows, y, stream); break;
    case GgmlType::F16: launch<DotF16>(w, xq, n_rows, y, stream); break;
    case GgmlType::BF16: launch<DotBF16>(w, xq, n_rows, y, stream); break;
    case GgmlType::Q8_0: launch_tiles<TileQ8_0>(w, xq, n_rows, y, stream); break;
    case GgmlType::Q4_K: launch_tiles<TileQ4K>(w, xq, n_rows, y, stream); break;
    case GgmlType::Q5_K: launch_tiles<TileQ5K>(w, xq, n_rows, y, stream); break;
    case GgmlType::Q6_K: launch_tiles<TileQ6K>(w, xq, n_rows, y, stream); break;
    default:
      return Status::error(std::string("the CUDA kernels cannot compute ") + std::string(type_name(w.type)) + " weights");
  }
  return cuda_status(cudaGetLastError(), std::string("launching the ") + std::string(type_name(w.type)) + " matmul");
}

}  // namespace essaim::gpu
