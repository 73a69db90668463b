#include "moe/expert_ffn.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "moe/numerics.h"

namespace essaim {
namespace {

ExpertMatrices view_of(const ExpertLayer::Tensor3d& t, int64_t rows, uint64_t row_offset) {
  const uint64_t row_stride = type_traits(t.type).block_size ? type_traits(t.type).row_bytes(uint64_t(t.cols)) : 0;
  // A shape-only tensor (no bytes: a backbone file's experts) stays null rather than an offset from null.
  const uint8_t* data = t.data == nullptr ? nullptr : t.data + row_offset * row_stride;
  return ExpertMatrices{.type = t.type, .cols = t.cols, .rows = rows, .data = data,
                        .row_stride = row_stride, .expert_stride = row_stride * uint64_t(t.rows)};
}

Status check_matrices(const ExpertMatrices& m, const char* what, int64_t cols, int64_t rows, bool shape_only) {
  const TypeTraits& tt = type_traits(m.type);
  if (!tt.computable || tt.block_size == 0)
    return Status::error(std::string("expert ") + what + " weights have type " + std::string(tt.name) +
                         ", which essaim cannot compute");
  if (m.cols != cols || m.rows != rows)
    return Status::error(std::string("expert ") + what + " weights are [" + std::to_string(m.cols) + ", " +
                         std::to_string(m.rows) + "], expected [" + std::to_string(cols) + ", " +
                         std::to_string(rows) + "]");
  if (cols % tt.block_size != 0)
    return Status::error(std::string("expert ") + what + " input width " + std::to_string(cols) +
                         " is not a multiple of the " + std::string(tt.name) + " block size");
  if (m.row_stride != tt.row_bytes(uint64_t(cols)) || m.expert_stride < m.row_stride * uint64_t(rows))
    return Status::error(std::string("expert ") + what + " strides do not cover the rows");
  if (m.data == nullptr && !shape_only) return Status::error(std::string("expert ") + what + " weights have no data");
  return Status::ok();
}

// Where the experts get a few activation rows each (decode) the products are a read of the weights, and a
// task's bytes are a stream the kernel runs ahead of: a task that starts cold, or whose read-ahead runs past
// its rows into rows another thread takes, streams slower. So there each thread's range is its contiguous
// share of every expert matrix, in small pieces that another thread may take from the end (consecutive
// pieces run as one call), not tiles that fit L2 (which suit products of many rows, whose weights are
// reused from cache): an expert's gate and up products of one row (3072 × 1024 Q4_K, 8 experts, 2 threads,
// AMD EPYC Zen 5) read at 47–48 GB/s in 112-row tiles and 57–59 in 512-row ones (docs/engine.md, "Decode
// tasks of whole shares").
constexpr int64_t kStreamRowsBelow = 8;

}  // namespace

ExpertLayer ExpertLayer::separate(const Tensor3d& gate, const Tensor3d& up, const Tensor3d& down,
                                  int32_t expert_begin) {
  ExpertLayer l;
  l.n_embd = int32_t(gate.cols);
  l.n_ff = int32_t(gate.rows);
  l.expert_begin = expert_begin;
  l.n_experts = int32_t(gate.n_experts);
  l.gate = view_of(gate, gate.rows, 0);
  l.up = view_of(up, up.rows, 0);
  l.down = view_of(down, down.rows, 0);
  return l;
}

ExpertLayer ExpertLayer::fused(const Tensor3d& gate_up, const Tensor3d& down, int32_t expert_begin) {
  ExpertLayer l;
  l.n_embd = int32_t(gate_up.cols);
  l.n_ff = int32_t(gate_up.rows / 2);
  l.expert_begin = expert_begin;
  l.n_experts = int32_t(gate_up.n_experts);
  l.gate = view_of(gate_up, l.n_ff, 0);
  l.up = view_of(gate_up, l.n_ff, uint64_t(l.n_ff));
  l.down = view_of(down, down.rows, 0);
  return l;
}

Status ExpertLayer::validate() const {
  if (n_embd <= 0 || n_ff <= 0 || n_experts <= 0 || expert_begin < 0)
    return Status::error("expert layer has empty or negative dimensions");
  // All three views without bytes is a shape-only layer; one missing among others is a broken one.
  const bool none = shape_only();
  ESSAIM_RETURN_IF_ERROR(check_matrices(gate, "gate", n_embd, n_ff, none));
  ESSAIM_RETURN_IF_ERROR(check_matrices(up, "up", n_embd, n_ff, none));
  ESSAIM_RETURN_IF_ERROR(check_matrices(down, "down", n_ff, n_embd, none));
  // The activation is quantised once and consumed by both the gate and the up product.
  if (type_traits(gate.type).vec_dot_type != type_traits(up.type).vec_dot_type)
    return Status::error("expert gate (" + std::string(type_name(gate.type)) + ") and up (" +
                         std::string(type_name(up.type)) + ") weights need different activation formats");
  return Status::ok();
}

Status expert_ffn(const ExpertLayer& layer, const uint8_t* act, int64_t n_rows, int32_t k, const int32_t* ids,
                  float* out, ThreadPool* pool) {
  if (layer.shape_only())
    return Status::error("this process holds no bytes of these experts (a backbone loaded from a backbone file): "
                         "they can only be computed by workers");
  const int64_t n_pairs = n_rows * k;
  // Group (row, slot) pairs by expert, in ascending pair order: counting sort over the held range.
  std::vector<int64_t> count(size_t(layer.n_experts) + 1, 0);
  for (int64_t i = 0; i < n_pairs; ++i) {
    const int32_t e = ids[i];
    if (e == -1) continue;
    if (!layer.holds(e))
      return Status::error("expert " + std::to_string(e) + " is not held (this layer holds experts " +
                           std::to_string(layer.expert_begin) + ".." +
                           std::to_string(layer.expert_begin + layer.n_experts - 1) + ")");
    ++count[size_t(e - layer.expert_begin) + 1];
  }
  for (size_t j = 1; j < count.size(); ++j) count[j] += count[j - 1];
  std::vector<int64_t> pairs(size_t(count.back()));  // pair indices r*k+s, grouped by expert
  {
    std::vector<int64_t> fill(count.begin(), count.end() - 1);
    for (int64_t i = 0; i < n_pairs; ++i)
      if (ids[i] != -1) pairs[size_t(fill[size_t(ids[i] - layer.expert_begin)]++)] = i;
  }

  // The active experts in ascending order, cut into groups of at most kGroupPairs (row, slot) pairs (an
  // expert with more forms a group alone), which bounds the scratch memory: a worker's RSS is its slice
  // plus a small constant. Each group runs as three task sets — gate+up of every expert, the SwiGLU and
  // quantisation of every pair, down of every expert — so a step has three barriers per layer, not three
  // per expert; in decode the SwiGLU joins the gate+up set (two barriers). Tasks are (expert, range of
  // weight rows) (make_tasks below), and each output element is computed by matmul_rows exactly as
  // matmul_preq would: the split changes no bit.
  constexpr int64_t kGroupPairs = 1024;
  std::vector<int32_t> active;
  for (int32_t j = 0; j < layer.n_experts; ++j)
    if (count[size_t(j) + 1] > count[size_t(j)]) active.push_back(j);

  const uint64_t act_bytes = layer.activation_row_bytes();
  const uint64_t down_act_bytes = activation_row_bytes(layer.down.type, layer.n_ff);
  const size_t F = size_t(layer.n_ff), E = size_t(layer.n_embd);
  // Tiles sized for the rows an active expert has on average (the kernel path depends on them).
  const int64_t rows_per_expert = active.empty() ? 1 : std::max<int64_t>(1, count.back() / int64_t(active.size()));
  const size_t n_workers = pool != nullptr ? pool->size() : 1;
  const bool streams = rows_per_expert < kStreamRowsBelow;
  const bool same_prepare = prepare_layout_shared(layer.gate.type, layer.up.type);

  std::vector<uint8_t> xq, xg_scratch, xu_scratch, aq, ad_scratch;
  std::vector<float> g, u;
  std::vector<float*> g_rows, u_rows, out_rows;
  struct Task {
    int32_t j;           // expert (0-based in the layer)
    int64_t first, m;    // its pairs: [first, first + m) of the group
    int64_t o_begin, o_end;
  };
  std::vector<Task> tasks;
  // Decode: per expert of the layer, its gate/up pieces still to run.
  std::vector<std::atomic<int64_t>> pieces_left(streams ? size_t(layer.n_experts) : 0);
  for (size_t a = 0; a < active.size();) {
    // One group: experts active[a .. z).
    size_t z = a;
    int64_t n = 0;
    while (z < active.size()) {
      const int64_t m = count[size_t(active[z]) + 1] - count[size_t(active[z])];
      if (z > a && n + m > kGroupPairs) break;
      n += m;
      ++z;
    }
    const int64_t pair_base = count[size_t(active[a])];  // the group's pairs are contiguous in `pairs`
    // Gather the selected activation rows (bytes, so the quantised form is used exactly as received).
    xq.resize(size_t(n) * act_bytes);
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(xq.data() + size_t(i) * act_bytes, act + size_t(pairs[size_t(pair_base + i)] / k) * act_bytes,
                  act_bytes);
    const uint8_t* xg = prepare_rows(layer.gate.type, xq.data(), n, layer.n_embd, xg_scratch);
    const uint8_t* xu = same_prepare ? xg : prepare_rows(layer.up.type, xq.data(), n, layer.n_embd, xu_scratch);
    g.resize(size_t(n) * F);  // [n][F]; becomes the SwiGLU output in place
    u.resize(size_t(n) * F);
    g_rows.resize(size_t(n));
    u_rows.resize(size_t(n));
    out_rows.resize(size_t(n));
    for (int64_t i = 0; i < n; ++i) {
      g_rows[size_t(i)] = g.data() + size_t(i) * F;
      u_rows[size_t(i)] = u.data() + size_t(i) * F;
      out_rows[size_t(i)] = out + size_t(pairs[size_t(pair_base + i)]) * E;
    }
    // Tasks over weight rows [0, rows) of every expert of the group: tiles of w (products of many rows), or
    // stream pieces of each thread's share of every expert, share after share (decode).
    auto make_tasks = [&](int64_t rows, const WeightMatrix& w) {
      tasks.clear();
      const int64_t tile = std::min(rows, streams ? matmul_piece_rows(w, 1) : matmul_tile_rows(w, rows_per_expert));
      const size_t shares = streams ? n_workers : 1;
      for (size_t i = 0; i < shares; ++i) {
        int64_t o_begin, o_end;
        matmul_share(rows, shares, i, &o_begin, &o_end);
        for (size_t e = a; e < z; ++e) {
          const int32_t j = active[e];
          const int64_t first = count[size_t(j)] - pair_base, m = count[size_t(j) + 1] - count[size_t(j)];
          for (int64_t o = o_begin; o < o_end; o += tile) tasks.push_back({j, first, m, o, std::min(o_end, o + tile)});
        }
      }
    };
    // Stream pieces: each thread's range of tasks from the pool, consecutive pieces of one expert as one task;
    // with expert_done, the thread that ran an expert's last piece then calls expert_done(j) in the same task
    // set. Tiles: taken in order from a shared counter.
    auto run_tasks = [&](const std::function<void(const Task&)>& fn,
                         const std::function<void(int32_t)>& expert_done = nullptr) {
      if (streams) {
        if (expert_done) {
          for (size_t e = a; e < z; ++e) pieces_left[size_t(active[e])].store(0, std::memory_order_relaxed);
          for (const Task& t : tasks) pieces_left[size_t(t.j)].fetch_add(1, std::memory_order_relaxed);
        }
        return parallel_for(pool, tasks.size(), [&](size_t begin, size_t end) {
          for (size_t t = begin; t < end;) {
            Task run = tasks[t++];
            int64_t pieces = 1;
            while (t < end && tasks[t].j == run.j && tasks[t].o_begin == run.o_end) {
              run.o_end = tasks[t++].o_end;
              ++pieces;
            }
            fn(run);
            // acq_rel: the last thread sees every other thread's outputs of this expert.
            if (expert_done && pieces_left[size_t(run.j)].fetch_sub(pieces, std::memory_order_acq_rel) == pieces)
              expert_done(run.j);
          }
        });
      }
      std::atomic<size_t> next{0};
      parallel_for(pool, n_workers, [&](size_t, size_t) {
        for (size_t t = next.fetch_add(1, std::memory_order_relaxed); t < tasks.size();
             t = next.fetch_add(1, std::memory_order_relaxed))
          fn(tasks[t]);
      });
    };

    // a = silu(gate) ⊙ up of pair rows [begin, end), quantised row by row for the down product, and put in
    // the down kernel's layout.
    aq.resize(size_t(n) * down_act_bytes);
    ad_scratch.resize(size_t(n) * down_act_bytes);
    const PrepareRowFn down_prepare = prepare_fn_for(layer.down.type);
    auto swiglu_rows = [&](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) {
        float* gi = g.data() + i * F;
        const float* ui = u.data() + i * F;
        for (size_t c = 0; c < F; ++c) gi[c] = silu(gi[c]) * ui[c];
        uint8_t* row = aq.data() + i * down_act_bytes;
        quantize_activations(layer.down.type, gi, 1, layer.n_ff, row);
        if (down_prepare) down_prepare(row, ad_scratch.data() + i * down_act_bytes, layer.n_ff);
      }
    };
    // gate and up of every expert, tile by tile: the tile's activation rows are loaded once for both. In
    // decode, an expert's few SwiGLU rows run as soon as its last piece is done, in the same task set (one
    // barrier less per layer); in tiles, the SwiGLU of all rows is a task set of its own.
    const auto gate_up = [&](const Task& t) {
      matmul_rows(layer.gate.expert(t.j), xg + uint64_t(t.first) * act_bytes, t.m, t.o_begin, t.o_end,
                  g_rows.data() + t.first);
      matmul_rows(layer.up.expert(t.j), xu + uint64_t(t.first) * act_bytes, t.m, t.o_begin, t.o_end,
                  u_rows.data() + t.first);
    };
    make_tasks(int64_t(F), layer.gate.expert(0));
    if (streams) {
      run_tasks(gate_up, [&](int32_t j) {
        const size_t first = size_t(count[size_t(j)] - pair_base);
        swiglu_rows(first, first + size_t(count[size_t(j) + 1] - count[size_t(j)]));
      });
    } else {
      run_tasks(gate_up);
      parallel_for(pool, size_t(n), swiglu_rows);
    }
    const uint8_t* ad = down_prepare ? ad_scratch.data() : aq.data();
    // down of every expert, written straight into the pairs' output rows.
    make_tasks(int64_t(E), layer.down.expert(0));
    run_tasks([&](const Task& t) {
      matmul_rows(layer.down.expert(t.j), ad + uint64_t(t.first) * down_act_bytes, t.m, t.o_begin, t.o_end,
                  out_rows.data() + t.first);
    });
    a = z;
  }
  return Status::ok();
}

}  // namespace essaim
