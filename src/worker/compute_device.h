// Where a worker computes its experts: the CPU kernels (the default) or an NVIDIA GPU, chosen by
// `essaim worker --device cpu|cuda[:N]`. Both compute bit-identical rows (docs/worker.md, "GPU workers");
// the choice shows in the HELLO's fingerprint (isa_class "avx512", "cuda-sm90", ...).
//
//   ESSAIM_ASSIGN_OR_RETURN(ComputeDevice dev, open_compute_device("cuda:0", state.store()));
//   WorkerOptions o{.executor = dev.executor.get(), .isa_class = dev.isa_class};   // dev outlives the worker
//
// A build without CUDA support (ESSAIM_CUDA=OFF, the default) refuses "cuda" with a message that says how
// to get it; the worker library then links no CUDA code at all.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"
#include "moe/executor.h"

namespace essaim::worker {

struct DeviceSpec {
  enum class Kind { CPU, CUDA };
  Kind kind = Kind::CPU;
  int index = 0;  // cuda:N
};

// "cpu", "cuda" (= cuda:0) or "cuda:N" with N a decimal 0..1023; anything else is an error naming the forms.
Result<DeviceSpec> parse_device(std::string_view text);

// True when this build has the CUDA executor (configured with ESSAIM_CUDA=ON).
bool cuda_compiled_in();
// Empty when `--device cuda` can run here; else why not: no CUDA support compiled in, or "no CUDA device
// visible (...)" with the runtime's reason. Tests skip with this text.
std::string cuda_unavailable_reason();

struct ComputeDevice {
  std::unique_ptr<ExpertExecutor> executor;  // null for the CPU: the worker's own per-request executor
  std::string isa_class;                     // empty for the CPU: the kernels' ISA is announced
  std::string description;                   // one line for the worker's log
};

// Opens the device for the experts of `store` (which must outlive the result): for a GPU this uploads and
// verifies every expert's bytes. host_threads: the GPU executor's host-side threads (0 = every core).
Result<ComputeDevice> open_compute_device(const DeviceSpec& spec, const ExpertStore& store, size_t host_threads = 0);

}  // namespace essaim::worker
