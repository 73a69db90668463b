// A weight matrix in device memory: the same GGUF block bytes as on the host. Shared by the CUDA kernels'
// launchers (compiled as C++17 by nvcc) and the pipeline (C++20), so it includes nothing else of essaim's.
//
//   DeviceMatrix w{.type = GgmlType::Q4_K, .cols = 3072, .rows = 1024, .data = dev_w, .row_stride = 1728};
#pragma once

#include <cstdint>

#include "core/ggml_type.h"

namespace essaim::gpu {

struct DeviceMatrix {
  GgmlType type = GgmlType::F32;
  int64_t cols = 0;               // input width
  int64_t rows = 0;               // output width
  const uint8_t* data = nullptr;  // device address; row o at data + o * row_stride
  uint64_t row_stride = 0;
};

// One tile of a grouped product: batch rows [row, row + nx) (nx <= kTileRows = 4, dot_device_tiles.h), all routed to expert `expert` of
// the range. A request's tiles cover every selected row once, grouped by expert; one launch computes them
// all (the experts of a request are scheduled together).
struct ExpertTile {
  int64_t row = 0;
  int32_t expert = 0;
  int32_t nx = 0;
};
static_assert(sizeof(ExpertTile) == 16);

}  // namespace essaim::gpu
