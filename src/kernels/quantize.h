// Converting rows between f32 and the block formats: dequantisation, the reference weight quantisers that
// reproduce llama.cpp's bytes, and the activation quantisers the matrix products use.
//
//   std::vector<uint8_t> q(type_traits(GgmlType::Q4_K).row_bytes(3072));
//   quantize_row(GgmlType::Q4_K, x, q.data(), 3072);   // byte-identical to llama.cpp's quantize_row_q4_K_ref
//   dequantize_row(GgmlType::Q4_K, q.data(), y, 3072);
//
// n (elements) must be a multiple of the type's block size; types without kernels are a programming error
// (callers check kernel_type_supported on anything read from a file).
#pragma once

#include <cstdint>

#include "core/ggml_type.h"

namespace essaim {

// True for F32 F16 BF16 Q8_0 Q4_K Q5_K Q6_K Q8_K: the types these functions accept. Whether a type can be
// a weight matrix is matmul_type_supported (matmul.h): Q8_K cannot.
bool kernel_type_supported(GgmlType type);

// src (n elements of `type`) -> dst (n floats).
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);

// Reference quantiser: n floats -> n elements of `type`, exactly the bytes llama.cpp's quantize_row_*_ref
// writes (Q8_0: amax / 127 and roundf; Q4_K/Q5_K: make_qkx2_quants; Q6_K: make_qx_quants; F16/BF16: round
// to nearest even; Q8_K: the activation quantiser below). Used by tools that write files.
void quantize_row(GgmlType type, const float* src, void* dst, int64_t n);

// Q8_K activation quantiser (docs/reference.md 2.6): per 256 values, the first element of largest magnitude mx
// maps to -127, d = 1 / (-127 / mx), qs = min(127, rne(x * iscale)), bsums per 16; an all-zero block gets
// d = 0, qs = 0 and bsums = 0. n must be a multiple of 256.
void quantize_row_q8k(const float* src, void* dst, int64_t n);

// Q8_0 reference quantiser (also the activation format of Q8_0 weights): per 32 values d = amax / 127
// stored as f16, qs = roundf(x * (1 / d)) with 1/d from the unrounded d.
void quantize_row_q8_0(const float* src, void* dst, int64_t n);

// Reference K-quant quantisers (llama.cpp's *_ref, no importance matrix).
void quantize_row_q4k(const float* src, void* dst, int64_t n);
void quantize_row_q5k(const float* src, void* dst, int64_t n);
void quantize_row_q6k(const float* src, void* dst, int64_t n);

void dequantize_row_q8_0(const void* src, float* dst, int64_t n);
void dequantize_row_q8k(const void* src, float* dst, int64_t n);
void dequantize_row_q4k(const void* src, float* dst, int64_t n);
void dequantize_row_q5k(const void* src, float* dst, int64_t n);
void dequantize_row_q6k(const void* src, float* dst, int64_t n);

// Plain element formats.
void quantize_row_f32(const float* src, void* dst, int64_t n);   // copy
void quantize_row_f16(const float* src, void* dst, int64_t n);   // rne, NaN -> 0x7E00 | sign
void quantize_row_bf16(const float* src, void* dst, int64_t n);  // rne, NaN -> quiet
void dequantize_row_f32(const void* src, float* dst, int64_t n);
void dequantize_row_f16(const void* src, float* dst, int64_t n);
void dequantize_row_bf16(const void* src, float* dst, int64_t n);

}  // namespace essaim
