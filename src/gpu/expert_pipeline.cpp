#include "gpu/expert_pipeline.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "gpu/dot_device.h"
#include "gpu/dot_device_tiles.h"
#include "kernels/matmul.h"
#include "moe/numerics.h"

namespace essaim::gpu {

bool activation_layout_prepared(GgmlType weight_type) {
  return weight_type == GgmlType::Q4_K || weight_type == GgmlType::Q5_K;
}

void prepare_activations(GgmlType weight_type, const uint8_t* xq, int64_t n_rows, int64_t cols, uint8_t* out) {
  const uint64_t rb = activation_row_bytes(weight_type, cols);
  if (!activation_layout_prepared(weight_type)) {
    std::memcpy(out, xq, size_t(n_rows) * rb);
    return;
  }
  for (int64_t t = 0; t < n_rows; ++t) prepare_q8k_lanes4(xq + uint64_t(t) * rb, out + uint64_t(t) * rb, cols);
}

namespace {

DeviceMatrix device_view(const ExpertMatrices& m, const uint8_t* dev_base) {
  return DeviceMatrix{.type = m.type, .cols = m.cols, .rows = m.rows, .data = dev_base, .row_stride = m.row_stride};
}

}  // namespace

namespace {

using Slot = PipelineDevice::Slot;

// Pairs of this range grouped by expert, in ascending pair order (expert_ffn's counting sort): s.count and
// s.pairs; the number of pairs selected.
int64_t group_pairs(const ExpertLayer& l, const ExpertBatch& batch, PipelineScratch& s) {
  const int64_t n_pairs = batch.n_rows * batch.k;
  s.count.assign(size_t(l.n_experts) + 1, 0);
  for (int64_t i = 0; i < n_pairs; ++i)
    if (l.holds(batch.ids[size_t(i)])) ++s.count[size_t(batch.ids[size_t(i)] - l.expert_begin) + 1];
  for (size_t j = 1; j < s.count.size(); ++j) s.count[j] += s.count[j - 1];
  const int64_t n_sel = s.count.back();
  if (n_sel == 0) return 0;
  s.pairs.resize(size_t(n_sel));
  s.fill.assign(s.count.begin(), s.count.end() - 1);
  for (int64_t i = 0; i < n_pairs; ++i)
    if (l.holds(batch.ids[size_t(i)])) s.pairs[size_t(s.fill[size_t(batch.ids[size_t(i)] - l.expert_begin)]++)] = i;
  return n_sel;
}

// The gate's and up's input rows on the device (one buffer when both read the same layout).
struct DeviceInputs {
  uint8_t* gate = nullptr;
  uint8_t* up = nullptr;
};

// Gathers the selected rows as bytes (the quantised form is used exactly as received), rewrites them into the
// layout each kernel reads (the same bytes, moved within each sub-block) and copies them to the device.
Result<DeviceInputs> upload_inputs(const ExpertLayer& l, const ExpertBatch& batch, size_t N, PipelineDevice& device,
                                   PipelineScratch& s, ThreadPool* pool) {
  const uint64_t act_bytes = l.activation_row_bytes();
  const int32_t k = batch.k;
  s.xq.resize(N * act_bytes);
  const uint8_t* act = batch.act.data();
  parallel_for(pool, N, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i)
      std::memcpy(s.xq.data() + i * act_bytes, act + size_t(s.pairs[i] / k) * act_bytes, act_bytes);
  });
  const bool gate_prep = activation_layout_prepared(l.gate.type), up_prep = activation_layout_prepared(l.up.type);
  if (gate_prep || up_prep) {
    const GgmlType prepared = gate_prep ? l.gate.type : l.up.type;
    s.xp.resize(N * act_bytes);
    parallel_for(pool, N, [&](size_t b, size_t e) {
      prepare_activations(prepared, s.xq.data() + b * act_bytes, int64_t(e - b), l.n_embd, s.xp.data() + b * act_bytes);
    });
  }
  const uint8_t* gate_rows = gate_prep ? s.xp.data() : s.xq.data();
  const uint8_t* up_rows = up_prep ? s.xp.data() : s.xq.data();
  DeviceInputs in;
  ESSAIM_ASSIGN_OR_RETURN(in.gate, device.scratch(Slot::X_GATE, N * act_bytes));
  ESSAIM_RETURN_IF_ERROR(device.to_device(in.gate, gate_rows, N * act_bytes));
  in.up = in.gate;
  if (up_rows != gate_rows) {  // gate and up read different layouts (e.g. a Q4_K gate with a Q6_K up)
    ESSAIM_ASSIGN_OR_RETURN(in.up, device.scratch(Slot::X_UP, N * act_bytes));
    ESSAIM_RETURN_IF_ERROR(device.to_device(in.up, up_rows, N * act_bytes));
  }
  return in;
}

// Tiles of up to kTileRows rows of one expert, in expert order (one launch per matrix covers them all), on the
// device.
Result<const ExpertTile*> upload_tiles(const ExpertLayer& l, PipelineDevice& device, PipelineScratch& s) {
  s.tiles.clear();
  for (int32_t j = 0; j < l.n_experts; ++j)
    for (int64_t t = s.count[size_t(j)]; t < s.count[size_t(j) + 1]; t += kTileRows)
      s.tiles.push_back(ExpertTile{.row = t, .expert = j, .nx = int32_t(std::min<int64_t>(kTileRows, s.count[size_t(j) + 1] - t))});
  ESSAIM_ASSIGN_OR_RETURN(uint8_t* tiles_dev, device.scratch(Slot::TILES, s.tiles.size() * sizeof(ExpertTile)));
  ESSAIM_RETURN_IF_ERROR(device.to_device(tiles_dev, s.tiles.data(), s.tiles.size() * sizeof(ExpertTile)));
  return reinterpret_cast<const ExpertTile*>(tiles_dev);
}

// a = silu(gate) ⊙ up with libm's expf, then each row quantised on its own (expert_ffn's exact steps) and put
// in the down kernel's layout: the hidden rows on the host.
const uint8_t* swiglu_hidden(const ExpertLayer& l, size_t N, PipelineScratch& s, ThreadPool* pool) {
  const size_t F = size_t(l.n_ff);
  const uint64_t down_act_bytes = activation_row_bytes(l.down.type, l.n_ff);
  s.aq.resize(N * down_act_bytes);
  parallel_for(pool, N, [&](size_t b, size_t e) {
    float* gr = s.g.data() + b * F;
    const float* ur = s.u.data() + b * F;
    for (size_t i = 0; i < (e - b) * F; ++i) gr[i] = silu(gr[i]) * ur[i];
    quantize_activations(l.down.type, gr, int64_t(e - b), l.n_ff, s.aq.data() + b * down_act_bytes);
  });
  if (!activation_layout_prepared(l.down.type)) return s.aq.data();
  s.ap.resize(N * down_act_bytes);
  parallel_for(pool, N, [&](size_t b, size_t e) {
    prepare_activations(l.down.type, s.aq.data() + b * down_act_bytes, int64_t(e - b), l.n_ff,
                        s.ap.data() + b * down_act_bytes);
  });
  return s.ap.data();
}

}  // namespace

Status expert_pipeline_run(const ExpertLayer& l, const DeviceRangeViews& dev, const ExpertBatch& batch, float* out,
                           PipelineDevice& device, PipelineScratch& s, ThreadPool* pool) {
  const int64_t n_sel = group_pairs(l, batch, s);
  if (n_sel == 0) return Status::ok();
  const uint64_t down_act_bytes = activation_row_bytes(l.down.type, l.n_ff);
  const size_t F = size_t(l.n_ff), E = size_t(l.n_embd), N = size_t(n_sel);
  ESSAIM_ASSIGN_OR_RETURN(const DeviceInputs x, upload_inputs(l, batch, N, device, s, pool));
  ESSAIM_ASSIGN_OR_RETURN(const ExpertTile* tiles, upload_tiles(l, device, s));
  const auto n_tiles = int64_t(s.tiles.size());
  ESSAIM_ASSIGN_OR_RETURN(uint8_t* g_dev, device.scratch(Slot::G, N * F * sizeof(float)));
  ESSAIM_ASSIGN_OR_RETURN(uint8_t* u_dev, device.scratch(Slot::U, N * F * sizeof(float)));
  auto* g = reinterpret_cast<float*>(g_dev);
  auto* u = reinterpret_cast<float*>(u_dev);
  ESSAIM_RETURN_IF_ERROR(device.matmul_experts(device_view(l.gate, dev.gate), l.gate.expert_stride, tiles, s.tiles.data(),
                                               n_tiles, x.gate, g));
  ESSAIM_RETURN_IF_ERROR(device.matmul_experts(device_view(l.up, dev.up), l.up.expert_stride, tiles, s.tiles.data(),
                                               n_tiles, x.up, u));
  s.g.resize(N * F);
  s.u.resize(N * F);
  ESSAIM_RETURN_IF_ERROR(device.to_host(s.g.data(), g, N * F * sizeof(float)));
  ESSAIM_RETURN_IF_ERROR(device.to_host(s.u.data(), u, N * F * sizeof(float)));
  ESSAIM_RETURN_IF_ERROR(device.sync());

  const uint8_t* hidden = swiglu_hidden(l, N, s, pool);
  ESSAIM_ASSIGN_OR_RETURN(uint8_t* a_dev, device.scratch(Slot::HIDDEN, N * down_act_bytes));
  ESSAIM_RETURN_IF_ERROR(device.to_device(a_dev, hidden, N * down_act_bytes));
  ESSAIM_ASSIGN_OR_RETURN(uint8_t* y_dev, device.scratch(Slot::Y, N * E * sizeof(float)));
  auto* y = reinterpret_cast<float*>(y_dev);
  ESSAIM_RETURN_IF_ERROR(device.matmul_experts(device_view(l.down, dev.down), l.down.expert_stride, tiles, s.tiles.data(),
                                               n_tiles, a_dev, y));
  s.y.resize(N * E);
  ESSAIM_RETURN_IF_ERROR(device.to_host(s.y.data(), y, N * E * sizeof(float)));
  ESSAIM_RETURN_IF_ERROR(device.sync());
  parallel_for(pool, N, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) std::memcpy(out + size_t(s.pairs[i]) * E, s.y.data() + i * E, E * sizeof(float));
  });
  return Status::ok();
}

// --- HostTileDevice ---------------------------------------------------------------------------------------

Result<uint8_t*> HostTileDevice::scratch(Slot slot, size_t bytes) {
  std::vector<uint8_t>& b = buffers_[slot];
  if (b.size() < bytes) b.resize(bytes);
  return b.data();
}

Status HostTileDevice::to_device(void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
  return Status::ok();
}

Status HostTileDevice::to_host(void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
  return Status::ok();
}

// What the device launch does (cuda_matmul.cu): every tile against every weight row of its expert, with
// the same tile functions.
Status HostTileDevice::matmul_experts(const DeviceMatrix& w, uint64_t expert_stride, const ExpertTile* /*tiles*/,
                                      const ExpertTile* tiles_host, int64_t n_tiles, const uint8_t* x, float* y) {
  ++products_;
  const uint64_t xs = activation_row_bytes(w.type, w.cols);
  using TileFn = void (*)(int64_t, const void*, const void*, uint64_t, int, float*);
  TileFn tile = nullptr;
  switch (w.type) {
    case GgmlType::Q4_K: tile = dot_q45k_tile<BlockQ4K>; break;
    case GgmlType::Q5_K: tile = dot_q45k_tile<BlockQ5K>; break;
    case GgmlType::Q6_K: tile = dot_q6k_tile; break;
    case GgmlType::Q8_0: tile = dot_q8_0_tile; break;
    case GgmlType::F32: tile = dot_f32_tile; break;
    case GgmlType::F16: tile = dot_f16_tile; break;
    case GgmlType::BF16: tile = dot_bf16_tile; break;
    default: return Status::error("the device kernels cannot compute " + std::string(type_name(w.type)) + " weights");
  }
  for (int64_t i = 0; i < n_tiles; ++i) {
    const ExpertTile& t = tiles_host[i];
    if (t.nx < 1 || t.nx > kTileRows) return Status::error("internal: a tile of " + std::to_string(t.nx) + " rows");
    const uint8_t* we = w.data + uint64_t(t.expert) * expert_stride;
    for (int64_t r = 0; r < w.rows; ++r) {
      float o[kTileRows];
      tile(w.cols, we + uint64_t(r) * w.row_stride, x + uint64_t(t.row) * xs, xs, t.nx, o);
      for (int j = 0; j < t.nx; ++j) y[(t.row + j) * w.rows + r] = o[j];
    }
  }
  return Status::ok();
}

}  // namespace essaim::gpu
