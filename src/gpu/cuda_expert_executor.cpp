#include "gpu/cuda_expert_executor.h"

#include <cuda_runtime.h>
#include <openssl/evp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "gpu/cuda_matmul.h"
#include "gpu/upload_plan.h"

namespace essaim::gpu {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// SHA-256 of bytes handed over in pieces.
class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new()) { EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr); }
  ~Sha256() { EVP_MD_CTX_free(ctx_); }
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void add(const uint8_t* p, size_t n) { EVP_DigestUpdate(ctx_, p, n); }
  std::vector<uint8_t> finish() {
    std::vector<uint8_t> d(32);
    unsigned int len = 0;
    EVP_DigestFinal_ex(ctx_, d.data(), &len);
    return d;
  }

 private:
  EVP_MD_CTX* ctx_;
};

// A device buffer that only grows (requests reuse it).
struct DeviceBuffer {
  void* p = nullptr;
  size_t capacity = 0;
  Status reserve(size_t bytes) {
    if (bytes <= capacity) return Status::ok();
    if (p != nullptr) cudaFree(p);
    p = nullptr;
    capacity = 0;
    ESSAIM_RETURN_IF_ERROR(cuda_status(cudaMalloc(&p, bytes), "allocating " + std::to_string(bytes) + " bytes of scratch on the GPU"));
    capacity = bytes;
    return Status::ok();
  }
  ~DeviceBuffer() { if (p != nullptr) cudaFree(p); }
};

}  // namespace

// The pipeline's device on one CUDA stream: copies and products are ordered on it, sync() waits.
struct CudaExpertExecutor::Scratch final : PipelineDevice {
  cudaStream_t stream = nullptr;
  DeviceBuffer buffers[SLOT_COUNT];
  PipelineScratch host;

  Result<uint8_t*> scratch(Slot slot, size_t bytes) override {
    ESSAIM_RETURN_IF_ERROR(buffers[slot].reserve(bytes));
    return static_cast<uint8_t*>(buffers[slot].p);
  }
  Status to_device(void* dst, const void* src, size_t bytes) override {
    return cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream), "copying rows to the GPU");
  }
  Status to_host(void* dst, const void* src, size_t bytes) override {
    return cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream), "copying rows back from the GPU");
  }
  Status matmul_experts(const DeviceMatrix& w, uint64_t expert_stride, const ExpertTile* tiles, const ExpertTile*,
                        int64_t n_tiles, const uint8_t* x, float* y) override {
    return cuda_matmul_experts(w, expert_stride, tiles, n_tiles, x, y, stream);
  }
  Status sync() override { return cuda_status(cudaStreamSynchronize(stream), "computing expert products on the GPU"); }
  size_t device_bytes() const {
    size_t n = 0;
    for (const DeviceBuffer& b : buffers) n += b.capacity;
    return n;
  }
};

CudaAvailability cuda_availability() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear it: the runtime keeps the last error sticky per thread
    return {.devices = 0, .reason = std::string("no CUDA device visible (") + cudaGetErrorName(e) + ": " +
                                    cudaGetErrorString(e) + ")"};
  }
  if (n == 0) return {.devices = 0, .reason = "no CUDA device visible (the runtime reports 0 devices)"};
  return {.devices = n, .reason = {}};
}

CudaExpertExecutor::CudaExpertExecutor(const ExpertStore& store, CudaExecutorOptions options)
    : store_(store), options_(options), scratch_(std::make_unique<Scratch>()) {}

CudaExpertExecutor::~CudaExpertExecutor() {
  scratch_.reset();  // its buffers are freed on this executor's device
  for (void* p : allocations_) cudaFree(p);
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

Result<std::unique_ptr<CudaExpertExecutor>> CudaExpertExecutor::create(const ExpertStore& store,
                                                                       CudaExecutorOptions options) {
  const CudaAvailability avail = cuda_availability();
  if (avail.devices == 0) return Status::error(avail.reason);
  if (options.device < 0 || options.device >= avail.devices)
    return Status::error("CUDA device " + std::to_string(options.device) + " does not exist (" +
                         std::to_string(avail.devices) + " visible: cuda:0.." + std::to_string(avail.devices - 1) + ")");
  std::unique_ptr<CudaExpertExecutor> x(new CudaExpertExecutor(store, options));
  ESSAIM_RETURN_IF_ERROR(cuda_status(cudaSetDevice(options.device), "selecting CUDA device " + std::to_string(options.device)));
  cudaDeviceProp prop{};
  ESSAIM_RETURN_IF_ERROR(cuda_status(cudaGetDeviceProperties(&prop, options.device), "reading the device's properties"));
  x->device_name_ = prop.name;
  x->isa_class_ = "cuda-sm" + std::to_string(prop.major) + std::to_string(prop.minor);
  cudaStream_t stream = nullptr;
  ESSAIM_RETURN_IF_ERROR(cuda_status(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "creating a CUDA stream"));
  x->stream_ = stream;
  x->scratch_->stream = stream;
  x->pool_ = std::make_unique<ThreadPool>(options.host_threads);  // 0 = every core
  ESSAIM_RETURN_IF_ERROR(x->upload_store());
  return x;
}

// Every range's three views, as host byte spans merged where they overlap (upload_plan.h), uploaded once
// each, then copied back and compared by SHA-256.
Status CudaExpertExecutor::upload_store() {
  ranges_.resize(size_t(store_.n_layers()));
  constexpr size_t kChunk = size_t(64) << 20;  // copy-back piece: bounded host memory for any slice size
  std::vector<uint8_t> back;
  for (int32_t layer = 0; layer < store_.n_layers(); ++layer) {
    for (const ExpertLayer& l : store_.ranges(layer)) {
      for (const ExpertMatrices* m : {&l.gate, &l.up, &l.down})
        if (!cuda_matmul_type_supported(m->type))
          return Status::error("layer " + std::to_string(layer) + ": the CUDA kernels cannot compute " +
                               std::string(type_name(m->type)) + " weights");
      const UploadPlan plan = upload_plan(l);
      std::vector<const uint8_t*> dev_span;
      for (const ByteSpan& s : plan.spans) {
        const size_t n = size_t(s.end - s.begin);
        void* d = nullptr;
        ESSAIM_RETURN_IF_ERROR(cuda_status(cudaMalloc(&d, n), "allocating " + std::to_string(n) +
                                                                  " bytes of expert weights on the GPU"));
        allocations_.push_back(d);
        const Clock::time_point t0 = Clock::now();
        ESSAIM_RETURN_IF_ERROR(cuda_status(cudaMemcpy(d, s.begin, n, cudaMemcpyHostToDevice), "uploading expert weights"));
        upload_.upload_seconds += seconds_since(t0);
        upload_.bytes += n;
        const Clock::time_point t1 = Clock::now();
        Sha256 host, device;
        host.add(s.begin, n);
        back.resize(std::min(n, kChunk));
        for (size_t off = 0; off < n; off += kChunk) {
          const size_t len = std::min(kChunk, n - off);
          ESSAIM_RETURN_IF_ERROR(cuda_status(cudaMemcpy(back.data(), static_cast<uint8_t*>(d) + off, len,
                                                        cudaMemcpyDeviceToHost), "copying expert weights back"));
          device.add(back.data(), len);
        }
        if (host.finish() != device.finish())
          return Status::error("layer " + std::to_string(layer) + ": the expert weights copied back from the GPU "
                               "differ from the slice's bytes (SHA-256 mismatch); the device is not usable");
        upload_.verify_seconds += seconds_since(t1);
        dev_span.push_back(static_cast<const uint8_t*>(d));
      }
      auto place = [&](const ViewPlace& p) { return dev_span[p.span] + p.offset; };
      ranges_[size_t(layer)].push_back(DeviceRangeViews{.gate = place(plan.gate), .up = place(plan.up), .down = place(plan.down)});
    }
  }
  return Status::ok();
}

uint64_t CudaExpertExecutor::device_bytes_in_use() const {
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) return 0;
  return uint64_t(total - free);
}

uint64_t CudaExpertExecutor::scratch_bytes() const { return scratch_->device_bytes(); }

Status CudaExpertExecutor::compute(const ExpertBatch& batch, std::span<float> out) {
  std::span<const ExpertLayer> ranges = store_.ranges(batch.layer);
  if (ranges.empty()) return Status::error("no experts held for layer " + std::to_string(batch.layer));
  ESSAIM_RETURN_IF_ERROR(validate_expert_batch(batch, ranges.front(), out.size()));
  for (int32_t id : batch.ids)
    if (id != -1 && store_.find(batch.layer, id) == nullptr)
      return Status::error("layer " + std::to_string(batch.layer) + ": expert " + std::to_string(id) + " is not held");
  std::lock_guard<std::mutex> lock(mu_);
  ESSAIM_RETURN_IF_ERROR(cuda_status(cudaSetDevice(options_.device), "selecting the CUDA device"));
  for (size_t i = 0; i < ranges.size(); ++i)
    ESSAIM_RETURN_IF_ERROR(expert_pipeline_run(ranges[i], ranges_[size_t(batch.layer)][i], batch, out.data(), *scratch_,
                                               scratch_->host, pool_.get()));
  return Status::ok();
}

}  // namespace essaim::gpu
