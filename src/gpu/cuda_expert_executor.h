// The expert executor of a GPU worker: the same pure function as LocalExpertExecutor (moe/executor.h),
// `(layer, activation rows, selected experts) → f32 rows`, with the matrix products on an NVIDIA GPU and
// bit-identical results. CUDA builds only (ESSAIM_CUDA=ON); the worker reaches it through
// worker/compute_device.h, never directly.
//
//   ESSAIM_ASSIGN_OR_RETURN(std::unique_ptr<gpu::CudaExpertExecutor> gpu,
//                           gpu::CudaExpertExecutor::create(state.store(), {.device = 0}));
//   gpu->isa_class();                       // "cuda-sm90": what the worker's HELLO announces
//   ESSAIM_RETURN_IF_ERROR(gpu->compute(batch, out));   // out: [n_rows][k][n_embd], as LocalExpertExecutor
//
// What runs where, per expert range of the requested layer (expert_pipeline.h, docs/worker.md "GPU
// workers"): grouping, gathering and the SwiGLU + quantisation of the hidden rows on the host — CUDA's expf
// is another approximation than libm's, so the SwiGLU stays on the CPU, where it is the very code the CPU
// worker runs — and the gate, up and down products on the device, one launch per matrix covering every
// expert of the request (tiles of up to four rows of one expert), on one stream.
// The weights of every range in the store are uploaded once by create(), kept resident, and verified by
// copying them back and comparing SHA-256 digests with the host bytes.
//
// Thread-safe: requests from several lanes compute one at a time (a mutex); the parallelism is inside one
// request, on the device and in the host thread pool.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "gpu/expert_pipeline.h"
#include "moe/executor.h"

namespace essaim::gpu {

// How many CUDA devices the runtime sees, and why none when 0 ("no CUDA device visible: ..." with the
// runtime's own error, e.g. no driver installed). Never fails hard: a machine without a GPU is normal.
struct CudaAvailability {
  int devices = 0;
  std::string reason;  // empty when devices > 0
};
CudaAvailability cuda_availability();

struct CudaExecutorOptions {
  int device = 0;           // CUDA device index (cuda:N)
  size_t host_threads = 0;  // threads of the host SwiGLU / quantisation step; 0 = every core
};

struct CudaUploadReport {
  uint64_t bytes = 0;           // weight bytes resident on the device
  double upload_seconds = 0;    // host → device copies
  double verify_seconds = 0;    // device → host copy back and both SHA-256 digests
};

class CudaExpertExecutor final : public ExpertExecutor {
 public:
  // Uploads and verifies every range of `store`, which must outlive the executor. Errors: no such
  // device, out of device memory, a weight type the device kernels lack, a digest mismatch.
  static Result<std::unique_ptr<CudaExpertExecutor>> create(const ExpertStore& store, CudaExecutorOptions options = {});
  ~CudaExpertExecutor() override;
  CudaExpertExecutor(const CudaExpertExecutor&) = delete;
  CudaExpertExecutor& operator=(const CudaExpertExecutor&) = delete;

  // The contract of moe/executor.h: checks the batch against the store first (layer held, format, sizes,
  // ids held); slots with id -1 are left untouched.
  Status compute(const ExpertBatch& batch, std::span<float> out) override;

  const std::string& isa_class() const { return isa_class_; }      // "cuda-sm<major><minor>"
  const std::string& device_name() const { return device_name_; }  // e.g. "NVIDIA H200"
  const CudaUploadReport& upload() const { return upload_; }
  // Device memory in use now, all processes (cudaMemGetInfo total - free), and this executor's scratch.
  uint64_t device_bytes_in_use() const;
  uint64_t scratch_bytes() const;

 private:
  struct Scratch;  // the pipeline's CUDA device (stream, scratch buffers) and host buffers
  CudaExpertExecutor(const ExpertStore& store, CudaExecutorOptions options);

  Status upload_store();

  const ExpertStore& store_;
  CudaExecutorOptions options_;
  std::string isa_class_, device_name_;
  CudaUploadReport upload_;
  void* stream_ = nullptr;                        // cudaStream_t
  std::vector<void*> allocations_;                // device weight buffers
  std::vector<std::vector<DeviceRangeViews>> ranges_;  // [layer][range], parallel to store_.ranges(layer)
  std::unique_ptr<Scratch> scratch_;
  std::unique_ptr<ThreadPool> pool_;
  std::mutex mu_;
};

}  // namespace essaim::gpu
