#include "kernels/kernel_cases.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <random>

#include "core/fp16.h"
#include "core/status.h"
#include "kernels/kernel_traits.h"
#include "kernels/quantize.h"

namespace essaim {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string case_name(GgmlType type, int64_t cols, int64_t rows, int64_t n, WeightFill fill) {
  return lower(type_name(type)) + " " + std::to_string(cols) + "x" + std::to_string(rows) + " n=" +
         std::to_string(n) + (fill == WeightFill::QUANTIZED ? " quantized" : " random_bits");
}

KernelCase make_case(GgmlType type, int64_t cols, int64_t rows, int64_t n, WeightFill fill) {
  return KernelCase{.name = case_name(type, cols, rows, n, fill), .type = type, .cols = cols, .rows = rows,
                    .n_rows = n, .fill = fill};
}

// An f16 bit pattern that is finite and of moderate size (exponent field 5..20), sign random.
uint16_t random_scale_f16(std::mt19937_64& rng) {
  const uint16_t exp = uint16_t(5 + rng() % 16), mant = uint16_t(rng() & 0x3FF), sign = uint16_t(rng() & 1);
  return uint16_t(sign << 15 | exp << 10 | mant);
}

// Random bytes, then the scale fields overwritten with finite values; float formats get finite floats.
void fill_random_bits(GgmlType type, uint8_t* row, int64_t cols, std::mt19937_64& rng) {
  const KernelTraits& k = *kernel_traits(type);
  const uint64_t bytes = k.row_bytes(cols);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  switch (type) {
    case GgmlType::F32:
      for (int64_t i = 0; i < cols; ++i) {
        const float v = gauss(rng);
        std::memcpy(row + 4 * i, &v, 4);
      }
      return;
    case GgmlType::F16:
    case GgmlType::BF16:
      for (int64_t i = 0; i < cols; ++i) {
        const float v = gauss(rng);
        const uint16_t h = type == GgmlType::F16 ? f32_to_f16(v) : f32_to_bf16(v);
        std::memcpy(row + 2 * i, &h, 2);
      }
      return;
    default:
      break;
  }
  for (uint64_t i = 0; i < bytes; ++i) row[i] = uint8_t(rng());
  for (uint64_t b = 0; b < bytes / k.type_size; ++b) {
    uint8_t* block = row + b * k.type_size;
    std::vector<size_t> f16_offsets;
    if (type == GgmlType::Q8_0) f16_offsets = {0};
    if (type == GgmlType::Q4_K || type == GgmlType::Q5_K) f16_offsets = {0, 2};
    if (type == GgmlType::Q6_K) f16_offsets = {208};
    for (size_t off : f16_offsets) {
      const uint16_t h = random_scale_f16(rng);
      std::memcpy(block + off, &h, 2);
    }
  }
}

}  // namespace

WeightMatrix KernelProblem::weights() const {
  const uint64_t row_bytes = kernel_traits(type)->row_bytes(cols);
  return WeightMatrix{.type = type, .cols = cols, .rows = rows, .data = w.data(), .row_stride = row_bytes};
}

KernelProblem kernel_problem_build(const KernelCase& c, uint64_t seed) {
  const KernelTraits* k = kernel_traits(c.type);
  ESSAIM_CHECK(k != nullptr && c.cols % k->block_size == 0);
  KernelProblem p;
  p.type = c.type;
  p.cols = c.cols;
  p.rows = c.rows;
  p.n_rows = c.n_rows;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> gauss(0.0f, 1.0f);

  const uint64_t row_bytes = k->row_bytes(c.cols);
  p.w.resize(row_bytes * uint64_t(c.rows));
  std::vector<float> wrow(size_t(c.cols));
  for (int64_t r = 0; r < c.rows; ++r) {
    if (c.fill == WeightFill::RANDOM_BITS) {
      fill_random_bits(c.type, p.w.data() + uint64_t(r) * row_bytes, c.cols, rng);
      continue;
    }
    // Row scales spread over two decades, like real weight matrices.
    const float row_scale = 0.02f * std::pow(10.0f, float(rng() % 1000) / 1000.0f);
    for (float& v : wrow) v = row_scale * gauss(rng);
    quantize_row(c.type, wrow.data(), p.w.data() + uint64_t(r) * row_bytes, c.cols);
  }

  p.x.resize(size_t(c.n_rows * c.cols));
  for (int64_t t = 0; t < c.n_rows; ++t) {
    float* xr = p.x.data() + t * c.cols;
    const float row_scale = std::pow(10.0f, float(int(rng() % 400) - 200) / 100.0f);  // 0.01 .. 100
    for (int64_t i = 0; i < c.cols; ++i) xr[i] = row_scale * gauss(rng);
    if (c.cols >= 64) xr[rng() % uint64_t(c.cols)] *= 30.0f;  // an outlier channel, as LLM activations have
    if (t == 1) std::fill(xr, xr + std::min<int64_t>(c.cols, 256), 0.0f);
  }
  return p;
}

std::vector<KernelCase> kernel_cases_correctness() {
  std::vector<KernelCase> cases;
  const GgmlType types[] = {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0,
                            GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};
  for (GgmlType t : types) {
    const int64_t bs = kernel_traits(t)->block_size;
    // Float formats: lengths around the 16-lane chunk (tails of every size) as well as long rows.
    const std::vector<int64_t> widths = bs == 1 ? std::vector<int64_t>{1, 15, 16, 17, 100, 1000}
                                                : std::vector<int64_t>{bs, 3 * bs, 7 * bs, (bs == 32 ? 96 : 12) * bs};
    for (int64_t cols : widths)
      for (WeightFill fill : {WeightFill::QUANTIZED, WeightFill::RANDOM_BITS})
        cases.push_back(make_case(t, cols, 13, 9, fill));  // 9 rows: every nx up to kDotMaxRows at two starts
  }
  return cases;
}

std::vector<KernelCase> kernel_cases_benchmark() {
  std::vector<KernelCase> cases;
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0})
    for (auto [cols, rows] : {std::pair<int64_t, int64_t>{3072, 1024}, {1024, 3072}})
      for (int64_t n : {1, 8, 64, 512}) cases.push_back(make_case(t, cols, rows, n, WeightFill::QUANTIZED));
  return cases;
}

}  // namespace essaim
