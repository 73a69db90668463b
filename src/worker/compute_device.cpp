#include "worker/compute_device.h"

#include <charconv>
#include <cstdio>

#if defined(ESSAIM_HAVE_CUDA)
#include "gpu/cuda_expert_executor.h"
#endif

namespace essaim::worker {

Result<DeviceSpec> parse_device(std::string_view text) {
  if (text == "cpu") return DeviceSpec{.kind = DeviceSpec::Kind::CPU, .index = 0};
  if (text == "cuda") return DeviceSpec{.kind = DeviceSpec::Kind::CUDA, .index = 0};
  constexpr std::string_view kCuda = "cuda:";
  if (text.substr(0, kCuda.size()) == kCuda) {
    const std::string_view digits = text.substr(kCuda.size());
    int index = -1;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (!digits.empty() && ec == std::errc() && end == digits.data() + digits.size() && index >= 0 && index <= 1023)
      return DeviceSpec{.kind = DeviceSpec::Kind::CUDA, .index = index};
  }
  return Status::error("unknown device '" + std::string(text) + "': use cpu, cuda or cuda:N (N = 0, 1, ...)");
}

bool cuda_compiled_in() {
#if defined(ESSAIM_HAVE_CUDA)
  return true;
#else
  return false;
#endif
}

std::string cuda_unavailable_reason() {
#if defined(ESSAIM_HAVE_CUDA)
  return gpu::cuda_availability().reason;
#else
  return "this build has no CUDA support (configure with -DESSAIM_CUDA=ON)";
#endif
}

Result<ComputeDevice> open_compute_device(const DeviceSpec& spec, const ExpertStore& store, size_t host_threads) {
  if (spec.kind == DeviceSpec::Kind::CPU) return ComputeDevice{.executor = nullptr, .isa_class = {}, .description = "cpu"};
#if defined(ESSAIM_HAVE_CUDA)
  Result<std::unique_ptr<gpu::CudaExpertExecutor>> x =
      gpu::CudaExpertExecutor::create(store, {.device = spec.index, .host_threads = host_threads});
  if (!x) return x.status().with_context("cuda:" + std::to_string(spec.index));
  const gpu::CudaUploadReport& up = (*x)->upload();
  char line[256];
  std::snprintf(line, sizeof line, "%s (cuda:%d, %s), %.1f MiB of experts resident, uploaded in %.2f s, SHA-256 verified in %.2f s",
                (*x)->device_name().c_str(), spec.index, (*x)->isa_class().c_str(), double(up.bytes) / (1 << 20),
                up.upload_seconds, up.verify_seconds);
  ComputeDevice d;
  d.isa_class = (*x)->isa_class();
  d.description = line;
  d.executor = std::move(*x);
  return d;
#else
  (void)store;
  (void)host_threads;
  return Status::error("this build of essaim has no CUDA support; rebuild with -DESSAIM_CUDA=ON on a machine with "
                       "the CUDA toolkit (docs/worker.md, \"GPU workers\"), or use --device cpu");
#endif
}

}  // namespace essaim::worker
