// The Q8_K activation quantiser on AVX2: the same bytes as quantize_row_q8k (quant_simple.cpp) for every
// input, NaN and infinities included, because it performs the same operations on each value:
//   amax  the largest |x| with NaN skipped (vmaxps returns its second operand, the running maximum, when
//         the first is NaN: the reference's `ax > amax` is false for NaN), an order-free maximum;
//   mx    the first x whose |x| equals amax — the reference's first strictly larger element;
//   qs    min(127, nearest_int(iscale * x)) with nearest_int's own steps (add 1.5·2^23, keep the mantissa,
//         subtract 2^22) and the int8 truncation of the reference's cast (low byte, not a saturating pack);
//   bsums the exact integer sums of each 16 qs, d = 1 / iscale as in the reference.
// Activations are quantised for every product of a forward pass (every expert pair's down input among them):
// the scalar loop was ~2 % of a 512-token prefill on the AMD EPYC (Zen 3).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "core/status.h"
#include "kernels/blocks.h"
#include "kernels/dot_kernels.h"

namespace essaim {

void quantize_row_q8k_avx2(const float* src, void* dst, int64_t n) {
  ESSAIM_CHECK(n % kQK_K == 0);
  auto* y = static_cast<BlockQ8K*>(dst);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float* x = src + b * kQK_K;
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < kQK_K; i += 8) m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask), m);
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, m);
    float amax = lanes[0];
    for (int l = 1; l < 8; ++l) amax = lanes[l] > amax ? lanes[l] : amax;
    if (amax == 0.0f) {
      std::memset(&y[b], 0, sizeof(BlockQ8K));  // as the reference: all zeros (or NaN) give a zero block
      continue;
    }
    float mx = 0.0f;
    const __m256 amax_v = _mm256_set1_ps(amax);
    for (int i = 0; i < kQK_K; i += 8) {
      const int hits = _mm256_movemask_ps(
          _mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask), amax_v, _CMP_EQ_OQ));
      if (hits != 0) {
        mx = x[i + __builtin_ctz(unsigned(hits))];
        break;
      }
    }
    const float iscale = -127.0f / mx;
    const __m256 iscale_v = _mm256_set1_ps(iscale), magic = _mm256_set1_ps(12582912.0f);
    const __m256i mant = _mm256_set1_epi32(0x007FFFFF), half = _mm256_set1_epi32(0x00400000);
    const __m256i top = _mm256_set1_epi32(127), low_byte = _mm256_set1_epi32(0xFF);
    auto quantise8 = [&](const float* p) {
      const __m256 v = _mm256_add_ps(_mm256_mul_ps(iscale_v, _mm256_loadu_ps(p)), magic);
      const __m256i q = _mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(v), mant), half);
      return _mm256_and_si256(_mm256_min_epi32(q, top), low_byte);  // the int8 cast's byte, as 0..255
    };
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    for (int i = 0; i < kQK_K; i += 32) {
      // Bytes 0..255 survive both unsigned saturating packs; the packs work per 128-bit lane, leaving the
      // dwords (4 elements each) in the order 0, 2, 4, 6, 1, 3, 5, 7, which the permute undoes.
      const __m256i p01 = _mm256_packus_epi32(quantise8(x + i), quantise8(x + i + 8));
      const __m256i p23 = _mm256_packus_epi32(quantise8(x + i + 16), quantise8(x + i + 24));
      const __m256i q = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(p01, p23), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[b].qs + i), q);
      // Sums of 16 signed bytes: pairs (1 · q as words), then quads as dwords, then the four quads of each
      // 16-byte half; exact integers.
      alignas(32) int32_t quads[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(quads), _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q), ones16));
      y[b].bsums[i / 16] = int16_t(quads[0] + quads[1] + quads[2] + quads[3]);
      y[b].bsums[i / 16 + 1] = int16_t(quads[4] + quads[5] + quads[6] + quads[7]);
    }
    y[b].d = 1.0f / iscale;
  }
}

}  // namespace essaim
