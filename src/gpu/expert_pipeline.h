// The GPU executor's per-request pipeline for one expert range, written against a small device interface
// so that the very same code runs on a CUDA device (cuda_expert_executor.cpp) and, in tests, on a host
// "device" whose products run the device kernels' arithmetic compiled for the CPU (HostTileDevice). Plain
// C++: built in every configuration; only CUDA builds put a GPU under it.
//
//   PipelineScratch scratch;
//   ESSAIM_RETURN_IF_ERROR(expert_pipeline_run(layer, {.gate = g, .up = u, .down = d}, batch, out.data(),
//                                              device, scratch, &pool));
//
// Steps (docs/worker.md, "GPU workers"): group the range's (row, slot) pairs by expert with moe's counting
// sort; gather their rows; rewrite them into the layout each kernel reads (lanes4 for Q4_K / Q5_K);
// gate and up products on the device, each one launch over every expert of the request; back on the host,
// a = silu(g) ⊙ u with libm's expf and the per-row quantisation of a (moe's exact steps); down products on
// the device; rows copied to their slots. Every host step is expert_ffn's, so each output row is
// bit-identical to LocalExpertExecutor's when the device products are.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "gpu/device_matrix.h"
#include "moe/executor.h"

namespace essaim::gpu {

// What the pipeline needs from a device. Addresses returned by scratch() and passed to matmul() are the
// device's; the copies are ordered with the products (one stream), and sync() waits for all of them.
class PipelineDevice {
 public:
  enum Slot { X_GATE, X_UP, G, U, HIDDEN, Y, TILES, SLOT_COUNT };
  virtual ~PipelineDevice() = default;
  // A device buffer of at least `bytes` for one step; grows, keeps its contents undefined.
  virtual Result<uint8_t*> scratch(Slot slot, size_t bytes) = 0;
  virtual Status to_device(void* dst, const void* src, size_t bytes) = 0;
  virtual Status to_host(void* dst, const void* src, size_t bytes) = 0;
  // For every tile: y[row + j][w.rows] = x[row + j] · W_expertᵀ (j < nx), where W_e = w with data advanced
  // by e * expert_stride; x rows (activation_row_bytes apart) in the layout activation_layout_prepared
  // says. `tiles` is the device copy of `tiles_host` (n_tiles entries).
  virtual Status matmul_experts(const DeviceMatrix& w, uint64_t expert_stride, const ExpertTile* tiles,
                                const ExpertTile* tiles_host, int64_t n_tiles, const uint8_t* x, float* y) = 0;
  virtual Status sync() = 0;
};

// Device addresses of expert 0 of a range's three views (same strides as the host views).
struct DeviceRangeViews {
  const uint8_t* gate = nullptr;
  const uint8_t* up = nullptr;
  const uint8_t* down = nullptr;
};

// True when the device kernel for `type` reads lanes4-prepared rows (Q4_K, Q5_K) instead of the plain
// vec_dot format.
bool activation_layout_prepared(GgmlType weight_type);
// Host: n_rows vec_dot-format rows -> the layout the device kernel of weight_type reads (a copy when
// plain). out may not alias xq.
void prepare_activations(GgmlType weight_type, const uint8_t* xq, int64_t n_rows, int64_t cols, uint8_t* out);

// Host buffers of a request, kept between requests.
struct PipelineScratch {
  std::vector<uint8_t> xq, xp, aq, ap;
  std::vector<float> g, u, y;
  std::vector<int64_t> count, pairs, fill;
  std::vector<ExpertTile> tiles;
};

// Computes the slots of `batch` whose ids `l` holds (others untouched). The batch must have passed
// validate_expert_batch against `l`. pool may be null.
Status expert_pipeline_run(const ExpertLayer& l, const DeviceRangeViews& dev, const ExpertBatch& batch, float* out,
                           PipelineDevice& device, PipelineScratch& s, ThreadPool* pool);

// A PipelineDevice in host memory whose products run the device kernels' code compiled for the CPU
// (dot_device.h, dot_device_tiles.h: one weight row against tiles of up to four rows, as a device thread
// does). For tests on machines without a GPU: the pipeline, the layouts and the kernels' arithmetic, but
// not the CUDA runtime or the device's instructions.
class HostTileDevice final : public PipelineDevice {
 public:
  Result<uint8_t*> scratch(Slot slot, size_t bytes) override;
  Status to_device(void* dst, const void* src, size_t bytes) override;
  Status to_host(void* dst, const void* src, size_t bytes) override;
  Status matmul_experts(const DeviceMatrix& w, uint64_t expert_stride, const ExpertTile* tiles,
                        const ExpertTile* tiles_host, int64_t n_tiles, const uint8_t* x, float* y) override;
  Status sync() override { return Status::ok(); }
  int64_t products() const { return products_; }  // matmul_experts calls so far

 private:
  std::vector<uint8_t> buffers_[SLOT_COUNT];
  int64_t products_ = 0;
};

}  // namespace essaim::gpu
