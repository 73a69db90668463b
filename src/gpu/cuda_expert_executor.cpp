#include "gpu/cuda_expert_executor.h"

#include <cuda_runtime.h>
#include <openssl/evp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "gpu/cuda_matmul.h"
#include "gpu/upload_plan.h"
#include "kernels/matmul.h"
#include "moe/numerics.h"

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
  Status reserve(size_t bytes, const char* what) {
    if (bytes <= capacity) return Status::ok();
    if (p != nullptr) cudaFree(p);
    p = nullptr;
    capacity = 0;
    ESSAIM_RETURN_IF_ERROR(cuda_status(cudaMalloc(&p, bytes), std::string("allocating ") + what + " on the GPU"));
    capacity = bytes;
    return Status::ok();
  }
  template <typename T> T* as() const { return static_cast<T*>(p); }
  ~DeviceBuffer() { if (p != nullptr) cudaFree(p); }
};

CudaMatrix device_expert(const ExpertMatrices& m, const uint8_t* dev_base, int32_t j) {
  return CudaMatrix{.type = m.type, .cols = m.cols, .rows = m.rows, .data = dev_base + uint64_t(j) * m.expert_stride,
                    .row_stride = m.row_stride};
}

}  // namespace

struct CudaExpertExecutor::DeviceRange {
  const uint8_t* gate = nullptr;  // device address of expert 0 of each view
  const uint8_t* up = nullptr;
  const uint8_t* down = nullptr;
};

struct CudaExpertExecutor::Scratch {
  DeviceBuffer x, x2, g, u, a, y;            // [pairs][row] of each step (x2: up's layout when it differs)
  std::vector<uint8_t> xq, xp, aq, ap;       // host: gathered rows, prepared rows, hidden rows, prepared
  std::vector<float> g_host, u_host, y_host;
  std::vector<int64_t> count, pairs, fill;   // grouping of the pairs by expert
  size_t device_bytes() const { return x.capacity + x2.capacity + g.capacity + u.capacity + a.capacity + y.capacity; }
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
      ranges_[size_t(layer)].push_back(DeviceRange{.gate = place(plan.gate), .up = place(plan.up), .down = place(plan.down)});
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
    ESSAIM_RETURN_IF_ERROR(compute_range(ranges[i], ranges_[size_t(batch.layer)][i], batch, out.data()));
  return Status::ok();
}

// moe's expert_ffn for one range, with the three products on the device (see the header for what runs
// where). The grouping and every host step are expert_ffn's, so each output row is bit-identical.
Status CudaExpertExecutor::compute_range(const ExpertLayer& l, const DeviceRange& dev, const ExpertBatch& batch,
                                         float* out) {
  Scratch& s = *scratch_;
  const auto stream = static_cast<cudaStream_t>(stream_);
  const int64_t n_pairs = batch.n_rows * batch.k;
  const int32_t k = batch.k;
  // Pairs of this range grouped by expert, in ascending pair order (expert_ffn's counting sort).
  s.count.assign(size_t(l.n_experts) + 1, 0);
  for (int64_t i = 0; i < n_pairs; ++i)
    if (l.holds(batch.ids[size_t(i)])) ++s.count[size_t(batch.ids[size_t(i)] - l.expert_begin) + 1];
  for (size_t j = 1; j < s.count.size(); ++j) s.count[j] += s.count[j - 1];
  const int64_t n_sel = s.count.back();
  if (n_sel == 0) return Status::ok();
  s.pairs.resize(size_t(n_sel));
  s.fill.assign(s.count.begin(), s.count.end() - 1);
  for (int64_t i = 0; i < n_pairs; ++i)
    if (l.holds(batch.ids[size_t(i)])) s.pairs[size_t(s.fill[size_t(batch.ids[size_t(i)] - l.expert_begin)]++)] = i;

  const uint64_t act_bytes = l.activation_row_bytes();
  const uint64_t down_act_bytes = activation_row_bytes(l.down.type, l.n_ff);
  const size_t F = size_t(l.n_ff), E = size_t(l.n_embd), N = size_t(n_sel);
  ESSAIM_RETURN_IF_ERROR(s.x.reserve(N * act_bytes, "activation rows"));
  ESSAIM_RETURN_IF_ERROR(s.g.reserve(N * F * sizeof(float), "gate outputs"));
  ESSAIM_RETURN_IF_ERROR(s.u.reserve(N * F * sizeof(float), "up outputs"));
  ESSAIM_RETURN_IF_ERROR(s.a.reserve(N * down_act_bytes, "hidden rows"));
  ESSAIM_RETURN_IF_ERROR(s.y.reserve(N * E * sizeof(float), "expert outputs"));

  // Gather the selected rows as bytes (the quantised form is used exactly as received).
  s.xq.resize(N * act_bytes);
  const uint8_t* act = batch.act.data();
  parallel_for(pool_.get(), N, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i)
      std::memcpy(s.xq.data() + i * act_bytes, act + size_t(s.pairs[i] / k) * act_bytes, act_bytes);
  });
  // The layout each kernel reads (lanes4 for Q4_K / Q5_K): the same bytes, moved within each sub-block.
  const bool gate_prep = cuda_activations_prepared(l.gate.type), up_prep = cuda_activations_prepared(l.up.type);
  if (gate_prep || up_prep) {
    const GgmlType prepared = gate_prep ? l.gate.type : l.up.type;
    s.xp.resize(N * act_bytes);
    parallel_for(pool_.get(), N, [&](size_t b, size_t e) {
      cuda_prepare_activations(prepared, s.xq.data() + b * act_bytes, int64_t(e - b), l.n_embd, s.xp.data() + b * act_bytes);
    });
  }
  const uint8_t* gate_rows = gate_prep ? s.xp.data() : s.xq.data();
  const uint8_t* up_rows = up_prep ? s.xp.data() : s.xq.data();
  ESSAIM_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(s.x.p, gate_rows, N * act_bytes, cudaMemcpyHostToDevice, stream),
                                     "uploading activation rows"));
  const uint8_t* x_up = s.x.as<uint8_t>();
  if (up_rows != gate_rows) {  // gate and up read different layouts (e.g. Q4_K gate, Q6_K up)
    ESSAIM_RETURN_IF_ERROR(s.x2.reserve(N * act_bytes, "activation rows"));
    ESSAIM_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(s.x2.p, up_rows, N * act_bytes, cudaMemcpyHostToDevice, stream),
                                       "uploading activation rows"));
    x_up = s.x2.as<uint8_t>();
  }
  // Gate and up of every expert of the request, back to back on one stream: one launch per expert and matrix.
  for (int32_t j = 0; j < l.n_experts; ++j) {
    const int64_t begin = s.count[size_t(j)], m = s.count[size_t(j) + 1] - begin;
    if (m == 0) continue;
    const size_t off = size_t(begin) * act_bytes;
    ESSAIM_RETURN_IF_ERROR(cuda_matmul_preq(device_expert(l.gate, dev.gate, j), s.x.as<uint8_t>() + off, m,
                                            s.g.as<float>() + size_t(begin) * F, stream));
    ESSAIM_RETURN_IF_ERROR(cuda_matmul_preq(device_expert(l.up, dev.up, j), x_up + off, m,
                                            s.u.as<float>() + size_t(begin) * F, stream));
  }
  s.g_host.resize(N * F);
  s.u_host.resize(N * F);
  ESSAIM_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(s.g_host.data(), s.g.p, N * F * sizeof(float), cudaMemcpyDeviceToHost, stream),
                                     "copying gate outputs back"));
  ESSAIM_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(s.u_host.data(), s.u.p, N * F * sizeof(float), cudaMemcpyDeviceToHost, stream),
                                     "copying up outputs back"));
  ESSAIM_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(stream), "computing the gate and up products"));

  // a = silu(gate) ⊙ up with libm's expf, then each row quantised on its own: expert_ffn's exact steps.
  s.aq.resize(N * down_act_bytes);
  parallel_for(pool_.get(), N, [&](size_t b, size_t e) {
    float* g = s.g_host.data() + b * F;
    const float* u = s.u_host.data() + b * F;
    for (size_t i = 0; i < (e - b) * F; ++i) g[i] = silu(g[i]) * u[i];
    quantize_activations(l.down.type, g, int64_t(e - b), l.n_ff, s.aq.data() + b * down_act_bytes);
  });
  const uint8_t* hidden = s.aq.data();
  if (cuda_activations_prepared(l.down.type)) {
    s.ap.resize(N * down_act_bytes);
    parallel_for(pool_.get(), N, [&](size_t b, size_t e) {
      cuda_prepare_activations(l.down.type, s.aq.data() + b * down_act_bytes, int64_t(e - b), l.n_ff,
                               s.ap.data() + b * down_act_bytes);
    });
    hidden = s.ap.data();
  }
  ESSAIM_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(s.a.p, hidden, N * down_act_bytes, cudaMemcpyHostToDevice, stream),
                                     "uploading hidden rows"));
  for (int32_t j = 0; j < l.n_experts; ++j) {
    const int64_t begin = s.count[size_t(j)], m = s.count[size_t(j) + 1] - begin;
    if (m == 0) continue;
    ESSAIM_RETURN_IF_ERROR(cuda_matmul_preq(device_expert(l.down, dev.down, j), s.a.as<uint8_t>() + size_t(begin) * down_act_bytes,
                                            m, s.y.as<float>() + size_t(begin) * E, stream));
  }
  s.y_host.resize(N * E);
  ESSAIM_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(s.y_host.data(), s.y.p, N * E * sizeof(float), cudaMemcpyDeviceToHost, stream),
                                     "copying expert outputs back"));
  ESSAIM_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(stream), "computing the down products"));
  parallel_for(pool_.get(), N, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) std::memcpy(out + size_t(s.pairs[i]) * E, s.y_host.data() + i * E, E * sizeof(float));
  });
  return Status::ok();
}

}  // namespace essaim::gpu
