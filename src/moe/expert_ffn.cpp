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

namespace {

// The (row, slot) pairs of a call grouped by expert, in ascending pair order (a counting sort over the held
// range): expert j's pairs are pairs[count[j] .. count[j + 1]), and `active` lists the experts with any.
struct PairsByExpert {
  std::vector<int64_t> count;
  std::vector<int64_t> pairs;  // pair indices r*k+s
  std::vector<int32_t> active;
  int64_t size(int32_t j) const { return count[size_t(j) + 1] - count[size_t(j)]; }
};

Result<PairsByExpert> group_pairs_by_expert(const ExpertLayer& layer, const int32_t* ids, int64_t n_pairs) {
  PairsByExpert p;
  p.count.assign(size_t(layer.n_experts) + 1, 0);
  for (int64_t i = 0; i < n_pairs; ++i) {
    const int32_t e = ids[i];
    if (e == -1) continue;
    if (!layer.holds(e))
      return Status::error("expert " + std::to_string(e) + " is not held (this layer holds experts " +
                           std::to_string(layer.expert_begin) + ".." +
                           std::to_string(layer.expert_begin + layer.n_experts - 1) + ")");
    ++p.count[size_t(e - layer.expert_begin) + 1];
  }
  for (size_t j = 1; j < p.count.size(); ++j) p.count[j] += p.count[j - 1];
  p.pairs.resize(size_t(p.count.back()));
  std::vector<int64_t> fill(p.count.begin(), p.count.end() - 1);
  for (int64_t i = 0; i < n_pairs; ++i)
    if (ids[i] != -1) p.pairs[size_t(fill[size_t(ids[i] - layer.expert_begin)]++)] = i;
  for (int32_t j = 0; j < layer.n_experts; ++j)
    if (p.size(j) > 0) p.active.push_back(j);
  return p;
}

// One expert_ffn call. The active experts, in ascending order, are cut into groups of at most kGroupPairs
// (row, slot) pairs (an expert with more forms a group alone), which bounds the scratch memory: a worker's RSS
// is its slice plus a small constant. Each group runs as three task sets — gate+up of every expert, the SwiGLU
// and quantisation of every pair, down of every expert — so a step has three barriers per layer, not three per
// expert; in decode the SwiGLU joins the gate+up set (two barriers). Tasks are (expert, range of weight rows)
// (make_tasks), and each output element is computed by matmul_rows exactly as matmul_preq would: the split
// changes no bit.
class ExpertFfnRun {
 public:
  ExpertFfnRun(const ExpertLayer& layer, const uint8_t* act, int32_t k, float* out, ThreadPool* pool,
               PairsByExpert pairs)
      : layer_(layer), act_(act), k_(k), out_(out), pool_(pool), p_(std::move(pairs)),
        act_bytes_(layer.activation_row_bytes()), down_act_bytes_(activation_row_bytes(layer.down.type, layer.n_ff)),
        F_(size_t(layer.n_ff)), E_(size_t(layer.n_embd)),
        // Tiles sized for the rows an active expert has on average (the kernel path depends on them).
        rows_per_expert_(p_.active.empty() ? 1 : std::max<int64_t>(1, p_.count.back() / int64_t(p_.active.size()))),
        n_workers_(pool != nullptr ? pool->size() : 1), streams_(rows_per_expert_ < kStreamRowsBelow),
        same_prepare_(prepare_layout_shared(layer.gate.type, layer.up.type)),
        down_prepare_(prepare_fn_for(layer.down.type)),
        pieces_left_(streams_ ? size_t(layer.n_experts) : 0) {}

  void run() {
    for (a_ = 0; a_ < p_.active.size(); a_ = z_) {
      z_ = group_end(a_);
      run_group();
    }
  }

 private:
  struct Task {
    int32_t j;           // expert (0-based in the layer)
    int64_t first, m;    // its pairs: [first, first + m) of the group
    int64_t o_begin, o_end;
  };
  static constexpr int64_t kGroupPairs = 1024;

  // One group: experts active[a .. end).
  size_t group_end(size_t a) const {
    size_t z = a;
    int64_t n = 0;
    while (z < p_.active.size()) {
      const int64_t m = p_.size(p_.active[z]);
      if (z > a && n + m > kGroupPairs) break;
      n += m;
      ++z;
    }
    return z;
  }

  int64_t first_of(int32_t j) const { return p_.count[size_t(j)] - pair_base_; }

  void run_group() {
    gather();
    // gate and up of every expert, tile by tile: the tile's activation rows are loaded once for both. In
    // decode, an expert's few SwiGLU rows run as soon as its last piece is done, in the same task set (one
    // barrier less per layer); in tiles, the SwiGLU of all rows is a task set of its own.
    const auto gate_up = [&](const Task& t) {
      matmul_rows(layer_.gate.expert(t.j), xg_ + uint64_t(t.first) * act_bytes_, t.m, t.o_begin, t.o_end,
                  g_rows_.data() + t.first);
      matmul_rows(layer_.up.expert(t.j), xu_ + uint64_t(t.first) * act_bytes_, t.m, t.o_begin, t.o_end,
                  u_rows_.data() + t.first);
    };
    make_tasks(int64_t(F_), layer_.gate.expert(0));
    if (streams_) {
      run_tasks(gate_up, [&](int32_t j) {
        const size_t first = size_t(first_of(j));
        swiglu_rows(first, first + size_t(p_.size(j)));
      });
    } else {
      run_tasks(gate_up);
      parallel_for(pool_, size_t(n_), [&](size_t begin, size_t end) { swiglu_rows(begin, end); });
    }
    const uint8_t* ad = down_prepare_ ? ad_scratch_.data() : aq_.data();
    // down of every expert, written straight into the pairs' output rows.
    make_tasks(int64_t(E_), layer_.down.expert(0));
    run_tasks([&](const Task& t) {
      matmul_rows(layer_.down.expert(t.j), ad + uint64_t(t.first) * down_act_bytes_, t.m, t.o_begin, t.o_end,
                  out_rows_.data() + t.first);
    });
  }

  // The group's activation rows (bytes, so the quantised form is used exactly as received), put in the
  // gate's and up's kernel layouts, and the rows each pair writes.
  void gather() {
    pair_base_ = p_.count[size_t(p_.active[a_])];  // the group's pairs are contiguous in `pairs`
    n_ = 0;
    for (size_t e = a_; e < z_; ++e) n_ += p_.size(p_.active[e]);
    const size_t n = size_t(n_);
    xq_.resize(n * act_bytes_);
    for (size_t i = 0; i < n; ++i)
      std::memcpy(xq_.data() + i * act_bytes_, act_ + size_t(pair(i) / k_) * act_bytes_, act_bytes_);
    xg_ = prepare_rows(layer_.gate.type, xq_.data(), n_, layer_.n_embd, xg_scratch_);
    xu_ = same_prepare_ ? xg_ : prepare_rows(layer_.up.type, xq_.data(), n_, layer_.n_embd, xu_scratch_);
    g_.resize(n * F_);  // [n][F]; becomes the SwiGLU output in place
    u_.resize(n * F_);
    g_rows_.resize(n);
    u_rows_.resize(n);
    out_rows_.resize(n);
    for (size_t i = 0; i < n; ++i) {
      g_rows_[i] = g_.data() + i * F_;
      u_rows_[i] = u_.data() + i * F_;
      out_rows_[i] = out_ + size_t(pair(i)) * E_;
    }
    aq_.resize(n * down_act_bytes_);
    ad_scratch_.resize(n * down_act_bytes_);
  }

  int64_t pair(size_t i) const { return p_.pairs[size_t(pair_base_) + i]; }

  // Tasks over weight rows [0, rows) of every expert of the group: tiles of w (products of many rows), or
  // stream pieces of each thread's share of every expert, share after share (decode).
  void make_tasks(int64_t rows, const WeightMatrix& w) {
    tasks_.clear();
    const int64_t tile = std::min(rows, streams_ ? matmul_piece_rows(w, 1) : matmul_tile_rows(w, rows_per_expert_));
    const size_t shares = streams_ ? n_workers_ : 1;
    for (size_t i = 0; i < shares; ++i) {
      int64_t o_begin, o_end;
      matmul_share(rows, shares, i, &o_begin, &o_end);
      for (size_t e = a_; e < z_; ++e) {
        const int32_t j = p_.active[e];
        const int64_t first = first_of(j), m = p_.size(j);
        for (int64_t o = o_begin; o < o_end; o += tile) tasks_.push_back({j, first, m, o, std::min(o_end, o + tile)});
      }
    }
  }

  // Stream pieces: each thread's range of tasks from the pool, consecutive pieces of one expert as one task;
  // with expert_done, the thread that ran an expert's last piece then calls expert_done(j) in the same task
  // set. Tiles: taken in order from a shared counter.
  void run_tasks(const std::function<void(const Task&)>& fn, const std::function<void(int32_t)>& expert_done = nullptr) {
    if (streams_) return run_stream_pieces(fn, expert_done);
    std::atomic<size_t> next{0};
    parallel_for(pool_, n_workers_, [&](size_t, size_t) {
      for (size_t t = next.fetch_add(1, std::memory_order_relaxed); t < tasks_.size();
           t = next.fetch_add(1, std::memory_order_relaxed))
        fn(tasks_[t]);
    });
  }

  void run_stream_pieces(const std::function<void(const Task&)>& fn, const std::function<void(int32_t)>& expert_done) {
    if (expert_done) {
      for (size_t e = a_; e < z_; ++e) pieces_left_[size_t(p_.active[e])].store(0, std::memory_order_relaxed);
      for (const Task& t : tasks_) pieces_left_[size_t(t.j)].fetch_add(1, std::memory_order_relaxed);
    }
    parallel_for(pool_, tasks_.size(), [&](size_t begin, size_t end) {
      for (size_t t = begin; t < end;) {
        Task run = tasks_[t++];
        int64_t pieces = 1;
        while (t < end && tasks_[t].j == run.j && tasks_[t].o_begin == run.o_end) {
          run.o_end = tasks_[t++].o_end;
          ++pieces;
        }
        fn(run);
        // acq_rel: the last thread sees every other thread's outputs of this expert.
        if (expert_done && pieces_left_[size_t(run.j)].fetch_sub(pieces, std::memory_order_acq_rel) == pieces)
          expert_done(run.j);
      }
    });
  }

  // a = silu(gate) ⊙ up of pair rows [begin, end), quantised row by row for the down product, and put in the
  // down kernel's layout.
  void swiglu_rows(size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      float* gi = g_.data() + i * F_;
      const float* ui = u_.data() + i * F_;
      for (size_t c = 0; c < F_; ++c) gi[c] = silu(gi[c]) * ui[c];
      uint8_t* row = aq_.data() + i * down_act_bytes_;
      quantize_activations(layer_.down.type, gi, 1, layer_.n_ff, row);
      if (down_prepare_) down_prepare_(row, ad_scratch_.data() + i * down_act_bytes_, layer_.n_ff);
    }
  }

  const ExpertLayer& layer_;
  const uint8_t* act_;
  const int32_t k_;
  float* out_;
  ThreadPool* pool_;
  const PairsByExpert p_;
  const uint64_t act_bytes_, down_act_bytes_;
  const size_t F_, E_;
  const int64_t rows_per_expert_;
  const size_t n_workers_;
  const bool streams_, same_prepare_;
  const PrepareRowFn down_prepare_;
  // The group being run: experts active[a_ .. z_), its n_ pairs starting at pair_base_ in p_.pairs.
  size_t a_ = 0, z_ = 0;
  int64_t n_ = 0, pair_base_ = 0;
  std::vector<uint8_t> xq_, xg_scratch_, xu_scratch_, aq_, ad_scratch_;
  const uint8_t* xg_ = nullptr;
  const uint8_t* xu_ = nullptr;
  std::vector<float> g_, u_;
  std::vector<float*> g_rows_, u_rows_, out_rows_;
  std::vector<Task> tasks_;
  std::vector<std::atomic<int64_t>> pieces_left_;  // decode: per expert of the layer, its gate/up pieces still to run
};

}  // namespace

Status expert_ffn(const ExpertLayer& layer, const uint8_t* act, int64_t n_rows, int32_t k, const int32_t* ids,
                  float* out, ThreadPool* pool) {
  if (layer.shape_only())
    return Status::error("this process holds no bytes of these experts (a backbone loaded from a backbone file): "
                         "they can only be computed by workers");
  ESSAIM_ASSIGN_OR_RETURN(PairsByExpert pairs, group_pairs_by_expert(layer, ids, n_rows * k));
  ExpertFfnRun(layer, act, k, out, pool, std::move(pairs)).run();
  return Status::ok();
}

}  // namespace essaim
