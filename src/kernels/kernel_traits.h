// The kernel table: one row per type essaim computes with (block geometry, conversions, and the dot product
// against its activation type for every instruction set), plus the run-time choice of instruction set.
//
//   const KernelTraits& k = *kernel_traits(GgmlType::Q4_K);     // k.vec_dot_type == GgmlType::Q8_K
//   const Isa isa = kernels_isa();
//   prepare_activations(k, isa, xq, 2, 3072, xp);                // 2 Q8_K rows -> the layout k.dot(isa) reads
//   float y[2];
//   k.dot(isa)(3072, w_row, xp, xq_row_bytes, 2, y);              // w_row . row 0, w_row . row 1
//   set_kernel_isa(Isa::SCALAR);                                  // tests and benchmarks compare variants
//
// Most callers want matmul.h, which does all of this.
//
// Every variant of a dot product returns the same bits as the scalar reference (docs/kernels.md gives the
// canonical accumulation order each one follows). Adding a type is adding a row here and its kernels;
// adding an instruction set is adding an Isa value and one file of kernels per type family.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "core/ggml_type.h"
#include "core/status.h"

namespace essaim {

// Ordered so that, among the sets one CPU family can run, a higher value is wider (x86: AVX2 < AVX512;
// AArch64: NEON < NEON_DOTPROD); a machine supports only its own family's values.
enum class Isa : int32_t { SCALAR = 0, AVX2 = 1, AVX512 = 2, NEON = 3, NEON_DOTPROD = 4, COUNT = 5 };

std::string_view isa_name(Isa isa);                    // "scalar", "avx2", "avx512", "neon", "neon-dotprod"
std::optional<Isa> isa_from_name(std::string_view s);  // inverse of isa_name
bool isa_supported(Isa isa);  // this CPU (and build) can run it: AVX2 = avx2+fma+f16c; AVX512 = f+bw+vl+vnni;
                              // NEON = any AArch64; NEON_DOTPROD = asimddp
Isa best_isa();               // the widest supported

// The variant kernels use now. Starts as ESSAIM_ISA (scalar|avx2|avx512|neon|neon-dotprod) when that names a supported ISA,
// else best_isa(). Process-wide; change it only while no kernel runs.
Isa kernels_isa();
Status set_kernel_isa(Isa isa);  // error when the CPU lacks it

// How far ahead of its position (bytes) a one-activation-row (decode) K-quant kernel asks for its weight
// stream with prefetch hints; 0 = none. A hint changes when weight bytes arrive, never a result bit. The
// default depends on the CPU and the kernels in use (docs/kernels.md, "Prefetch in the decode kernels":
// Intel 1536, where one core's stream is bound by the misses it keeps in flight; AMD 1536 for the AVX2
// kernels and 0 for the AVX-512 ones, measured neutral to slower there); ESSAIM_PREFETCH_BYTES=N or
// set_weight_prefetch_bytes fixes it. Process-wide; benchmarks may change it between runs.
int64_t weight_prefetch_bytes();
void set_weight_prefetch_bytes(int64_t bytes);  // clamped to [0, 65536]

// Intel AMX tiles for Q4_K and Q6_K products of several activation rows (matmul_amx.h; docs/kernels.md, "AMX tiles").
// Supported: the CPU has AMX-TILE and AMX-INT8 and the kernel granted this process the tile state. Enabled:
// supported, kernels_isa() is AVX512 and ESSAIM_AMX is not 0 (set_amx_enabled overrides). The tiles form the
// same exact integers as the dot kernels, so this changes speed only, never a bit. Process-wide.
bool amx_supported();
bool amx_enabled();
void set_amx_enabled(bool on);  // on = use them where supported

// AVX2 lane-per-row products for Q4_K and Q6_K with several activation rows (matmul_lanes_avx2.h; docs/kernels.md):
// enabled when kernels_isa() is AVX2 and ESSAIM_LANES is not 0 (set_lanes_enabled overrides). Same
// exact integers and f32 steps as the dot kernels: speed only, never a bit. Process-wide.
bool lanes_enabled();
void set_lanes_enabled(bool on);
bool lanes_switch();  // the switch itself, whatever the ISA (what set_lanes_enabled last set)
// AVX-512 row-lane products for Q4_K with several activation rows (matmul_rowlanes_avx512.h; docs/kernels.md):
// enabled when kernels_isa() is AVX512 and the same switch (ESSAIM_LANES, set_lanes_enabled) is on. Same
// exact integers and f32 steps as the dot kernels: speed only, never a bit.
bool rowlanes_enabled();

// Activation bytes one pass of the lane products keeps in L2 while it streams every weight row once (AVX2
// lanes: transposed blocks; AVX-512 row lanes: prepared rows). Larger passes unpack and stream the weights
// fewer times. With an L2 of 1 MiB or more per core: 320 KiB (lanes) and 512 KiB (row lanes), measured in
// paired runs on the AMD EPYC (Zen 5, 1 MiB L2) — the 8192-column products of 512 rows ~9 % faster than
// with 192 KiB, the 3072-column ones 1.5 % (lanes) and 4–6 % (row lanes), larger budgets slower again;
// with a smaller or unknown L2 the 192 KiB measured on a Zen 3 (512 KiB L2). Speed only: every activation
// row's sums are the same whatever the pass it falls in. set_lane_pass_bytes overrides both (0: back to
// the measured ones; tests use it to take several passes at known row counts).
uint64_t lanes_pass_bytes();
uint64_t rowlanes_pass_bytes();
void set_lane_pass_bytes(uint64_t bytes);

// Version of the kernels' numerical contract: block formats, activation quantisation and every accumulation
// order (docs/kernels.md). Two builds with the same value compute bit-identical results on any ISA; bump it
// whenever a change could alter one output bit. Peers of the expert protocol compare it in their HELLO.
inline constexpr uint32_t kKernelAbiVersion = 2;  // 2: K-quant orders without f32 lanes

// Rows a dot kernel takes at once: y[j] = dot(w, x + j * x_stride) for j < nx, 1 <= nx <= kDotMaxRows.
// Several activation rows per call let a kernel decode a weight block once and use it nx times; each y[j]
// is computed exactly as a one-row call would compute it. Prefill batches and experts with many rows run
// eight at a time (the Q4_K/Q5_K/Q6_K x86 kernels decode a weight block once for all eight; the others
// run 8 as 4 + 4).
inline constexpr int kDotMaxRows = 8;
using VecDotFn = void (*)(int64_t n, const void* w, const void* x, size_t x_stride, int nx, float* y);
// A SIMD kernel may want its activation bytes in another order than the vec_dot format (e.g. shuffled so
// that its integer pair sums never mix canonical lanes). Its prepare function rewrites one row of n
// elements, same size, into that order once per product, so the work is not repeated for every weight
// row. The values and the result are unchanged; only where bytes sit.
using PrepareFn = void (*)(const void* x, void* out, int64_t n);
using DequantizeFn = void (*)(const void* src, float* dst, int64_t n);
using QuantizeFn = void (*)(const float* src, void* dst, int64_t n);

struct KernelTraits {
  GgmlType type = GgmlType::F32;
  uint32_t block_size = 0;  // elements
  uint32_t type_size = 0;   // bytes per block
  uint32_t alignment = 1;   // bytes a block pointer must be aligned to (alignof the block struct)
  GgmlType vec_dot_type = GgmlType::F32;  // activation format of the dot product
  DequantizeFn dequantize = nullptr;
  QuantizeFn quantize_ref = nullptr;     // reference quantiser (llama.cpp's bytes)
  QuantizeFn from_float = nullptr;       // converts activations when this type is a vec_dot_type
  std::array<VecDotFn, size_t(Isa::COUNT)> vec_dot{};  // null: no dot product (activation-only types)
  // Per ISA: the activation layout vec_dot[isa] reads; null: the plain vec_dot format.
  std::array<PrepareFn, size_t(Isa::COUNT)> prepare{};

  uint64_t row_bytes(int64_t n) const { return uint64_t(n) / block_size * type_size; }
  // The variant for isa, falling back to the next narrower one that exists; its prepare function (null
  // when it reads the plain format).
  VecDotFn dot(Isa isa) const;
  PrepareFn prepare_for(Isa isa) const;
};

// Rewrites n_rows activation rows (vec_dot format, row_bytes apart) into the layout k.dot(isa) reads;
// a copy when it reads the plain format. out may not alias xq.
void prepare_activations(const KernelTraits& k, Isa isa, const uint8_t* xq, int64_t n_rows, int64_t cols,
                         uint8_t* out);

// Row of the table; nullptr for types without kernels.
const KernelTraits* kernel_traits(GgmlType type);

}  // namespace essaim
