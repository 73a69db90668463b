// Streams a planned synthetic model to disk: the pool generates one chunk of rows while the previous chunk
// is being written, so a 1.4 GB layer costs about max(generation, write) rather than their sum.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <future>

#include "core/thread_pool.h"
#include "gguf/gguf_writer.h"
#include "synth/synth.h"
#include "synth/synth_fill.h"

namespace essaim {
namespace {

constexpr uint64_t kChunkBytes = 32ull << 20;  // big enough to amortise a write call, small enough to pipeline

}  // namespace

Result<SynthSummary> synth_write(const SynthPlan& plan, const std::string& path) {
  const auto start = std::chrono::steady_clock::now();
  GgufWriter writer;
  for (const GgufKv& kv : plan.metadata.kvs) writer.set_value(kv.key, kv.value);
  for (const SynthTensor& t : plan.tensors) writer.add_tensor(t.name, t.type, t.ne);
  ESSAIM_RETURN_IF_ERROR(writer.begin(path));
  for (size_t i = 0; i < plan.tensors.size(); ++i) ESSAIM_CHECK(writer.tensor_nbytes(i) == plan.tensors[i].nbytes);

  ThreadPool pool(plan.options.threads);
  const SynthFillContext ctx = synth_fill_context(plan);
  std::vector<uint8_t> buffers[2];
  int current = 0;
  std::future<Status> pending;  // the write of the other buffer
  for (const SynthTensor& t : plan.tensors) {
    const uint64_t rows = t.rows();
    const uint64_t row_bytes = t.nbytes / rows;
    const uint64_t rows_per_chunk = std::max<uint64_t>(1, kChunkBytes / row_bytes);
    for (uint64_t r0 = 0; r0 < rows; r0 += rows_per_chunk) {
      const uint64_t n = std::min(rows_per_chunk, rows - r0);
      std::vector<uint8_t>& buf = buffers[current];
      buf.resize(size_t(n * row_bytes));
      uint8_t* base = buf.data();
      parallel_for(&pool, size_t(n), [&](size_t b, size_t e) {
        synth_fill_rows(ctx, t, r0 + b, r0 + e, base + b * row_bytes);
      });
      if (pending.valid()) ESSAIM_RETURN_IF_ERROR(pending.get());
      pending = std::async(std::launch::async, [&writer, &buf] { return writer.write_tensor_data(buf); });
      current ^= 1;
    }
  }
  if (pending.valid()) ESSAIM_RETURN_IF_ERROR(pending.get());
  ESSAIM_RETURN_IF_ERROR(writer.finish());

  SynthSummary s;
  std::error_code ec;
  s.file_bytes = std::filesystem::file_size(path, ec);
  if (ec) return Status::error("cannot stat '" + path + "' after writing it: " + ec.message());
  s.n_tensors = plan.tensors.size();
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return s;
}

}  // namespace essaim
