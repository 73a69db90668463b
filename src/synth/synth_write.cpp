// Streams a planned synthetic model to disk through an ordered pipeline: the data is cut into pieces of at
// most 16 MiB (whole rows of one tensor, in file order); every pool thread generates whole pieces into a
// ring of buffers while a writer thread hands finished pieces to GgufWriter strictly in order. No barrier
// per chunk, so a descheduled thread (a busy machine) delays one piece rather than all of them, and a 1.4 GB
// layer costs about max(generation, write) rather than their sum.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>

#include "core/thread_pool.h"
#include "gguf/gguf_writer.h"
#include "synth/synth.h"
#include "synth/synth_fill.h"
#include "synth/synth_weights.h"

namespace essaim {
namespace {

constexpr uint64_t kPieceBytes = 16ull << 20;  // amortises a write call; small enough to keep the ring short

struct Piece {
  size_t tensor;
  uint64_t row_begin, row_end;
  uint64_t bytes;
};

std::vector<Piece> cut_pieces(const SynthPlan& plan) {
  std::vector<Piece> pieces;
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const SynthTensor& t = plan.tensors[i];
    const uint64_t rows = t.rows(), row_bytes = t.nbytes / rows;
    const uint64_t per_piece = std::max<uint64_t>(1, kPieceBytes / row_bytes);
    for (uint64_t r0 = 0; r0 < rows; r0 += per_piece) {
      const uint64_t r1 = std::min(rows, r0 + per_piece);
      pieces.push_back({i, r0, r1, (r1 - r0) * row_bytes});
    }
  }
  return pieces;
}

// The shared state of one write: which pieces are claimed, generated, written.
struct Pipeline {
  std::mutex mu;
  std::condition_variable cv;
  size_t next_claim = 0;          // next piece a generator may take
  size_t written = 0;             // pieces handed to the writer so far
  std::vector<uint8_t> ready;     // per piece: generated
  bool failed = false;
};

// Every tensor's bytes, piece by piece: generated (or read from the weights) by the pool's threads into a ring of
// slots while one thread writes them in order.
Status write_pieces(const SynthPlan& plan, const std::optional<SynthWeights>& weights, GgufWriter& writer,
                    Progress* progress) {
  ThreadPool pool(plan.options.threads);
  const SynthFillContext ctx = synth_fill_context(plan);
  const std::vector<Piece> pieces = cut_pieces(plan);
  const size_t n_slots = 2 * pool.size() + 1;  // every generator busy while the writer drains one
  std::vector<std::vector<uint8_t>> slots(n_slots);
  Pipeline pipe;
  pipe.ready.assign(pieces.size(), 0);

  // Piece p lives in slot p % n_slots, so it may be claimed only once piece p - n_slots has been written.
  const auto generate = [&] {
    for (;;) {
      size_t p;
      {
        std::unique_lock<std::mutex> lock(pipe.mu);
        pipe.cv.wait(lock, [&] {
          return pipe.failed || pipe.next_claim >= pieces.size() || pipe.next_claim < pipe.written + n_slots;
        });
        if (pipe.failed || pipe.next_claim >= pieces.size()) return;
        p = pipe.next_claim++;
      }
      const Piece& piece = pieces[p];
      std::vector<uint8_t>& buf = slots[p % n_slots];
      buf.resize(size_t(piece.bytes));
      if (weights)
        weights->fill_rows(piece.tensor, piece.row_begin, piece.row_end, buf.data());
      else
        synth_fill_rows(ctx, plan.tensors[piece.tensor], piece.row_begin, piece.row_end, buf.data());
      {
        std::lock_guard<std::mutex> lock(pipe.mu);
        pipe.ready[p] = 1;
      }
      pipe.cv.notify_all();
    }
  };
  Status write_status;
  std::thread write_thread([&] {
    for (size_t p = 0; p < pieces.size(); ++p) {
      {
        std::unique_lock<std::mutex> lock(pipe.mu);
        pipe.cv.wait(lock, [&] { return pipe.ready[p] != 0; });
      }
      write_status = writer.write_tensor_data(slots[p % n_slots]);
      if (progress != nullptr && write_status) progress->advance(slots[p % n_slots].size());
      {
        std::lock_guard<std::mutex> lock(pipe.mu);
        pipe.written = p + 1;
        pipe.failed = !write_status.is_ok();
      }
      pipe.cv.notify_all();
      if (!write_status) return;
    }
  });
  pool.parallel_for(pool.size(), [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) generate();
  });
  write_thread.join();
  return write_status;
}

}  // namespace

Result<SynthSummary> synth_write(const SynthPlan& plan, const std::string& path, Progress* progress) {
  const auto start = std::chrono::steady_clock::now();
  std::optional<SynthWeights> weights;  // checked in full before a byte is written
  if (!plan.options.weights_dir.empty()) {
    ESSAIM_ASSIGN_OR_RETURN(SynthWeights loaded, SynthWeights::load(plan, plan.options.weights_dir));
    weights = std::move(loaded);
  }
  GgufWriter writer;
  for (const GgufKv& kv : plan.metadata.kvs) writer.set_value(kv.key, kv.value);
  for (const SynthTensor& t : plan.tensors) writer.add_tensor(t.name, t.type, t.ne);
  // Written beside the target and renamed over it at the end: a process that has the old file mapped keeps its
  // pages (truncating a mapped file in place would kill it with SIGBUS), and no reader sees a half-written file.
  const std::string part = path + ".part";
  ESSAIM_RETURN_IF_ERROR(writer.begin(part));
  for (size_t i = 0; i < plan.tensors.size(); ++i) ESSAIM_CHECK(writer.tensor_nbytes(i) == plan.tensors[i].nbytes);

  ESSAIM_RETURN_IF_ERROR(write_pieces(plan, weights, writer, progress));
  ESSAIM_RETURN_IF_ERROR(writer.finish());
  if (std::rename(part.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(part.c_str());
    return Status::error("cannot rename '" + part + "' to '" + path + "': " + std::strerror(err));
  }

  SynthSummary s;
  std::error_code ec;
  s.file_bytes = std::filesystem::file_size(path, ec);
  if (ec) return Status::error("cannot stat '" + path + "' after writing it: " + ec.message());
  s.n_tensors = plan.tensors.size();
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return s;
}

}  // namespace essaim
