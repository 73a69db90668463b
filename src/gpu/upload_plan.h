// Which host bytes of an expert range the GPU executor uploads, and where each view lands on the device:
// the three views' byte spans, merged where they overlap (the gate and up halves of a fused gate_up
// tensor interleave, so they become one upload instead of two overlapping ones). Plain C++, shared by the
// executor and its host test (tests/gpu/gpu_dot_host_test.cpp).
//
//   UploadPlan p = upload_plan(layer);
//   for (const ByteSpan& s : p.spans) upload(s.begin, s.size());      // device buffer d[i] per span
//   const uint8_t* dev_gate = d[p.gate.span] + p.gate.offset;           // expert 0 of the gate view
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "moe/expert_ffn.h"

namespace essaim::gpu {

struct ByteSpan {
  const uint8_t* begin = nullptr;
  const uint8_t* end = nullptr;
  uint64_t size() const { return uint64_t(end - begin); }
};

struct ViewPlace {
  size_t span = 0;      // index into UploadPlan::spans
  uint64_t offset = 0;  // of the view's expert 0 within that span
};

struct UploadPlan {
  std::vector<ByteSpan> spans;  // disjoint, ascending
  ViewPlace gate, up, down;
};

// Bytes a view covers: up to the end of its last expert's rows (n_experts * expert_stride would overrun a
// fused tensor for its gate half).
inline uint64_t view_extent(const ExpertMatrices& m, int32_t n_experts) {
  return uint64_t(n_experts - 1) * m.expert_stride + uint64_t(m.rows) * m.row_stride;
}

inline UploadPlan upload_plan(const ExpertLayer& l) {
  const ExpertMatrices* views[3] = {&l.gate, &l.up, &l.down};
  std::vector<ByteSpan> spans;
  for (const ExpertMatrices* m : views) spans.push_back({m->data, m->data + view_extent(*m, l.n_experts)});
  std::sort(spans.begin(), spans.end(), [](const ByteSpan& a, const ByteSpan& b) { return a.begin < b.begin; });
  UploadPlan p;
  for (const ByteSpan& s : spans) {
    if (!p.spans.empty() && s.begin <= p.spans.back().end) p.spans.back().end = std::max(p.spans.back().end, s.end);
    else p.spans.push_back(s);
  }
  ViewPlace* places[3] = {&p.gate, &p.up, &p.down};
  for (int v = 0; v < 3; ++v)
    for (size_t i = 0; i < p.spans.size(); ++i)
      if (views[v]->data >= p.spans[i].begin && views[v]->data < p.spans[i].end)
        *places[v] = ViewPlace{.span = i, .offset = uint64_t(views[v]->data - p.spans[i].begin)};
  return p;
}

}  // namespace essaim::gpu
