#include "kernels/interleaved_rows.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include <sys/mman.h>

#include "core/status.h"

namespace essaim {
namespace {

constexpr uint64_t kBlockBytes = 144;  // one Q4_K super-block

struct Range {
  const uint8_t* begin;
  const uint8_t* end;
  const uint8_t* copy;
  uint64_t row_stride;
};

std::shared_mutex g_mutex;
std::vector<Range> g_ranges;           // guarded by g_mutex
std::atomic<int> g_count{0};           // g_ranges.size(), read without the lock
std::atomic<bool> g_enabled{true};

}  // namespace

bool interleaved_rows_enabled() { return g_enabled.load(std::memory_order_relaxed); }
void set_interleaved_rows_enabled(bool on) { g_enabled.store(on, std::memory_order_relaxed); }

const uint8_t* interleaved_chunk(const uint8_t* first, uint64_t row_stride) {
  if (g_count.load(std::memory_order_acquire) == 0 || !interleaved_rows_enabled()) return nullptr;
  const uint64_t chunk = uint64_t(kInterleavedRows) * row_stride;
  std::shared_lock lock(g_mutex);
  for (const Range& r : g_ranges) {
    if (first < r.begin || first >= r.end) continue;
    const uint64_t off = uint64_t(first - r.begin);
    if (r.row_stride != row_stride || off % chunk != 0 || off + chunk > uint64_t(r.end - r.begin)) return nullptr;
    return r.copy + off;
  }
  return nullptr;
}

Result<InterleavedRows> InterleavedRows::build(const uint8_t* data, int64_t n_rows, uint64_t row_stride,
                                               ThreadPool* pool) {
  ESSAIM_CHECK(data != nullptr && n_rows > 0 && n_rows % kInterleavedRows == 0);
  ESSAIM_CHECK(row_stride > 0 && row_stride % kBlockBytes == 0);
  constexpr uint64_t kHuge = uint64_t(2) << 20;
  InterleavedRows out;
  out.bytes_ = uint64_t(n_rows) * row_stride;
  out.mapped_ = (out.bytes_ + kHuge - 1) / kHuge * kHuge;
  void* p = mmap(nullptr, out.mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return Status::error("cannot map " + std::to_string(out.mapped_ >> 20) + " MiB for a row-interleaved copy");
  // 2 MiB pages where the kernel has them: the decode kernel streams the copy (madvise fails harmlessly
  // where transparent huge pages are off).
  madvise(p, out.mapped_, MADV_HUGEPAGE);
  out.copy_ = static_cast<uint8_t*>(p);
  const uint64_t n_sb = row_stride / kBlockBytes, chunk = uint64_t(kInterleavedRows) * row_stride;
  uint8_t* dst = out.copy_;
  parallel_for(pool, size_t(n_rows / kInterleavedRows), [&](size_t b, size_t e) {
    for (size_t c = b; c < e; ++c)
      for (uint64_t k = 0; k < n_sb; ++k)
        for (int64_t r = 0; r < kInterleavedRows; ++r)
          std::memcpy(dst + c * chunk + (k * kInterleavedRows + uint64_t(r)) * kBlockBytes,
                      data + c * chunk + uint64_t(r) * row_stride + k * kBlockBytes, kBlockBytes);
  });
  std::unique_lock lock(g_mutex);
  g_ranges.push_back(Range{data, data + out.bytes_, dst, row_stride});
  g_count.store(int(g_ranges.size()), std::memory_order_release);
  return out;
}

void InterleavedRows::release() {
  if (copy_ == nullptr) return;
  {
    std::unique_lock lock(g_mutex);
    g_ranges.erase(std::remove_if(g_ranges.begin(), g_ranges.end(), [&](const Range& r) { return r.copy == copy_; }),
                   g_ranges.end());
    g_count.store(int(g_ranges.size()), std::memory_order_release);
  }
  munmap(copy_, mapped_);
  copy_ = nullptr;
  bytes_ = mapped_ = 0;
}

InterleavedRows::InterleavedRows(InterleavedRows&& o) noexcept : copy_(o.copy_), bytes_(o.bytes_), mapped_(o.mapped_) {
  o.copy_ = nullptr;
  o.bytes_ = o.mapped_ = 0;
}

InterleavedRows& InterleavedRows::operator=(InterleavedRows&& o) noexcept {
  if (this != &o) {
    release();
    copy_ = o.copy_;
    bytes_ = o.bytes_;
    mapped_ = o.mapped_;
    o.copy_ = nullptr;
    o.bytes_ = o.mapped_ = 0;
  }
  return *this;
}

InterleavedRows::~InterleavedRows() { release(); }

}  // namespace essaim
