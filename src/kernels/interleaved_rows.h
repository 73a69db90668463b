// Row-interleaved copies of Q4_K weights for the AVX-512 decode kernel (docs/kernels.md, "Row-interleaved
// copies"). The file keeps each weight row contiguous, so a kernel that takes sixteen rows at a time reads
// sixteen strided streams; in a copy where the sixteen rows' super-block k lie side by side (chunk c of
// sixteen rows: super-block k of row r at c · 16 · row_stride + (16 · k + r) · 144), the same bytes are one
// sequential stream. The copy holds the same bytes, so a product read from it is the same bits; only the
// addresses differ.
//
//   InterleavedRows copy = InterleavedRows::build(data, n_rows, row_stride, &pool);  // Q4_K rows, 16 | n_rows
//   // while `copy` lives, rowlanes_one_row_q4k reads rows of [data, data + n_rows · row_stride) from it,
//   // unless set_interleaved_rows_enabled(false).
#pragma once

#include <cstdint>

#include "core/status.h"
#include "core/thread_pool.h"

namespace essaim {

constexpr int64_t kInterleavedRows = 16;

// One registered copy; unregistered and freed on destruction. Move-only.
class InterleavedRows {
 public:
  // Copies n_rows (a multiple of 16) Q4_K rows of row_stride bytes (a multiple of 144) from data,
  // interleaved, into anonymous memory, and registers the copy for [data, data + n_rows · row_stride).
  // An error when the memory cannot be had.
  static Result<InterleavedRows> build(const uint8_t* data, int64_t n_rows, uint64_t row_stride, ThreadPool* pool);

  InterleavedRows() = default;
  InterleavedRows(InterleavedRows&& o) noexcept;
  InterleavedRows& operator=(InterleavedRows&& o) noexcept;
  ~InterleavedRows();

  uint64_t bytes() const { return bytes_; }

 private:
  uint8_t* copy_ = nullptr;  // anonymous memory, mapped_ bytes (2 MiB pages asked for)
  uint64_t bytes_ = 0;
  uint64_t mapped_ = 0;
  void release();
};

// Whether the decode kernel reads the registered copies (on by default: nothing is registered unless a
// model was loaded with them; a run-time switch for measuring).
bool interleaved_rows_enabled();
void set_interleaved_rows_enabled(bool on);

// The copy of the sixteen rows starting at `first` (a row of a registered range, on its grid of sixteen
// rows), or nullptr when none covers them or the switch is off. Lock-free when nothing is registered.
const uint8_t* interleaved_chunk(const uint8_t* first, uint64_t row_stride);

}  // namespace essaim
