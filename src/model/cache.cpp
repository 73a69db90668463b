#include "model/cache.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>

#include "core/fp16.h"
#include "kernels/kernel_traits.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace essaim {
namespace {

// Every f16 bit pattern's f32 value (256 KiB, built once from the exact software conversion): reading
// the cache without F16C is a table lookup, and the table is what the conversion instruction is held to.
const float* f16_table() {
  static const std::unique_ptr<float[]> table = [] {
    std::unique_ptr<float[]> t(new float[65536]);
    for (uint32_t h = 0; h < 65536; ++h) t[h] = f16_to_f32(uint16_t(h));
    return t;
  }();
  return table.get();
}

// One cached row of n f16 values as f32. The conversion instruction and the table give the same bits for
// every value the cache can hold: it stores only f32_to_f16 results, whose one NaN is the quiet 0x7E00 | sign,
// and f16 -> f32 is exact otherwise (tests/model/attention_test.cpp compares the two on every such pattern).
// The table lookups were ~18 % of a 512-token attention at head_dim 256; vcvtph2ps makes them ~free.
// (The kernels' dequantize_row_f16 stays the software conversion: weights from a file may hold signalling
// NaNs, which the instruction quiets.)
void f16_row_table(const uint16_t* src, float* dst, size_t n) {
  const float* table = f16_table();
  for (size_t i = 0; i < n; ++i) dst[i] = table[src[i]];
}

#if defined(__x86_64__)
__attribute__((target("avx,f16c"))) void f16_row_f16c(const uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  f16_row_table(src + i, dst + i, n - i);
}
#endif

using F16RowFn = void (*)(const uint16_t*, float*, size_t);

// Chosen once from the CPU (AVX2 in the kernels' sense includes F16C), as ops.cpp chooses its clones.
F16RowFn f16_row_fn() {
#if defined(__x86_64__)
  static const F16RowFn fn = isa_supported(Isa::AVX2) ? f16_row_f16c : f16_row_table;
  return fn;
#else
  return f16_row_table;
#endif
}

size_t elem_bytes(KvType t) { return t == KvType::F16 ? 2 : 4; }

}  // namespace

KvCache::KvCache(KvType type, int32_t n_kv_heads, int32_t head_dim)
    : type_(type), n_kv_heads_(n_kv_heads), head_dim_(head_dim) {
  ESSAIM_CHECK(n_kv_heads > 0 && head_dim > 0);
  if (type_ == KvType::F16) f16_table();
}

void KvCache::put(std::vector<uint8_t>& buf, int32_t pos, const float* src) {
  const size_t n = size_t(n_kv_heads_) * size_t(head_dim_);
  const size_t row = n * elem_bytes(type_);
  if (buf.size() < size_t(pos + 1) * row) {
    if (buf.capacity() < size_t(pos + 1) * row) buf.reserve(std::max(buf.capacity() * 2, size_t(pos + 1) * row));
    buf.resize(size_t(pos + 1) * row);
  }
  uint8_t* dst = buf.data() + size_t(pos) * row;
  if (type_ == KvType::F32) {
    std::memcpy(dst, src, row);
  } else {
    uint16_t* h = reinterpret_cast<uint16_t*>(dst);
    for (size_t i = 0; i < n; ++i) h[i] = f32_to_f16(src[i]);
  }
}

void KvCache::store(int32_t pos, const float* k, const float* v) {
  ESSAIM_CHECK(pos >= 0 && pos <= size_);
  put(k_, pos, k);
  put(v_, pos, v);
  size_ = std::max(size_, pos + 1);
}

void KvCache::get(const std::vector<uint8_t>& buf, int32_t g, int32_t j0, int32_t j1, float* dst) const {
  ESSAIM_CHECK(g >= 0 && g < n_kv_heads_ && j0 >= 0 && j0 <= j1 && j1 <= size_);
  const size_t D = size_t(head_dim_), stride = size_t(n_kv_heads_) * D;
  if (type_ == KvType::F32) {
    const float* src = reinterpret_cast<const float*>(buf.data());
    for (int32_t j = j0; j < j1; ++j)
      std::memcpy(dst + size_t(j - j0) * D, src + size_t(j) * stride + size_t(g) * D, D * sizeof(float));
    return;
  }
  const F16RowFn convert = f16_row_fn();
  const uint16_t* src = reinterpret_cast<const uint16_t*>(buf.data());
  for (int32_t j = j0; j < j1; ++j) convert(src + size_t(j) * stride + size_t(g) * D, dst + size_t(j - j0) * D, D);
}

void KvCache::load_k(int32_t g, int32_t j0, int32_t j1, float* dst) const { get(k_, g, j0, j1, dst); }
void KvCache::load_v(int32_t g, int32_t j0, int32_t j1, float* dst) const { get(v_, g, j0, j1, dst); }

void KvCache::truncate(int32_t n) {
  ESSAIM_CHECK(n >= 0);
  if (n >= size_) return;
  const size_t row = size_t(n_kv_heads_) * size_t(head_dim_) * elem_bytes(type_);
  k_.resize(size_t(n) * row);
  v_.resize(size_t(n) * row);
  size_ = n;
}

void KvCache::assign_prefix(const KvCache& from, int32_t n) {
  ESSAIM_CHECK(from.type_ == type_ && from.n_kv_heads_ == n_kv_heads_ && from.head_dim_ == head_dim_);
  ESSAIM_CHECK(n >= 0 && n <= from.size_);
  const size_t bytes = size_t(n) * size_t(n_kv_heads_) * size_t(head_dim_) * elem_bytes(type_);
  k_.assign(from.k_.begin(), from.k_.begin() + ptrdiff_t(bytes));
  v_.assign(from.v_.begin(), from.v_.begin() + ptrdiff_t(bytes));
  size_ = n;
}

void RecurrentState::reset() {
  std::fill(conv.begin(), conv.end(), 0.0f);
  std::fill(state.begin(), state.end(), 0.0f);
}

Status SequenceCache::check_room(int64_t n) const {
  if (n < 0 || int64_t(n_past_) + n > int64_t(n_ctx_))
    return Status::error("context full: " + std::to_string(n_past_) + " tokens cached + " + std::to_string(n) +
                         " new exceed the context size " + std::to_string(n_ctx_));
  return Status::ok();
}

Status SequenceCache::cut_back(int32_t n) {
  if (n == n_past_) return Status::ok();
  if (n < 0 || n > n_past_)
    return Status::error("cannot cut a sequence of " + std::to_string(n_past_) + " tokens back to " + std::to_string(n));
  bool recurrent = false;
  for (const LayerCache& l : layers_) recurrent = recurrent || std::holds_alternative<RecurrentState>(l);
  const int64_t row = int64_t(n) - kept_first_ - 1;  // the kept row that ends at n
  if (recurrent && (row < 0 || row >= kept_count_ || kept_first_ + kept_count_ != n_past_))
    return Status::error("cannot cut the sequence back to " + std::to_string(n) +
                         " tokens: the last forward kept no recurrent state ending there");
  for (LayerCache& l : layers_) {
    if (auto* kv = std::get_if<KvCache>(&l)) kv->truncate(n);
    if (auto* r = std::get_if<RecurrentState>(&l)) {
      std::memcpy(r->conv.data(), r->conv_rows.data() + size_t(row) * r->conv.size(), r->conv.size() * sizeof(float));
      std::memcpy(r->state.data(), r->state_rows.data() + size_t(row) * r->state.size(),
                  r->state.size() * sizeof(float));
    }
  }
  n_past_ = n;
  kept_count_ = 0;
  return Status::ok();
}

void SequenceCache::reset() {
  for (LayerCache& l : layers_) {
    if (auto* kv = std::get_if<KvCache>(&l)) kv->truncate(0);
    if (auto* r = std::get_if<RecurrentState>(&l)) r->reset();
  }
  n_past_ = 0;
  kept_count_ = 0;
}

uint64_t SequenceCache::bytes() const {
  uint64_t b = 0;
  for (const LayerCache& l : layers_) {
    if (auto* kv = std::get_if<KvCache>(&l)) b += kv->bytes();
    if (auto* r = std::get_if<RecurrentState>(&l))
      b += (r->conv.size() + r->state.size() + r->conv_next.size() + r->state_next.size() + r->conv_rows.size() +
            r->state_rows.size()) * sizeof(float);
  }
  return b;
}

}  // namespace essaim
