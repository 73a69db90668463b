#include "kernels/kernel_traits.h"

#include <atomic>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if defined(__aarch64__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/blocks.h"
#include "kernels/dot_kernels.h"
#include "kernels/quantize.h"

namespace essaim {
namespace {

// The Q8_K activation quantiser of the current ISA: the AVX2 form wherever the kernels run SIMD on x86
// (same bytes; ESSAIM_ISA=scalar keeps the reference loop).
void quantize_row_q8k_for_isa(const float* src, void* dst, int64_t n) {
#if defined(ESSAIM_KERNELS_X86)
  if (kernels_isa() != Isa::SCALAR) return quantize_row_q8k_avx2(src, dst, n);
#endif
  quantize_row_q8k(src, dst, n);
}

// Columns: scalar, AVX2, AVX-512, NEON, NEON + dotprod (Isa order). ESSAIM_DOTS_DP names a type that has
// a dotprod kernel of its own; ESSAIM_PREPARE gives the activation layouts (avx2, avx512, dotprod).
#if defined(ESSAIM_KERNELS_X86)
#define ESSAIM_DOTS(name) {name##_scalar, name##_avx2, name##_avx512, nullptr, nullptr}
#define ESSAIM_DOTS_DP(name) ESSAIM_DOTS(name)
#define ESSAIM_PREPARE(avx2, avx512, dotprod) {nullptr, avx2, avx512, nullptr, nullptr}
#elif defined(ESSAIM_KERNELS_ARM)
#define ESSAIM_DOTS(name) {name##_scalar, nullptr, nullptr, name##_neon, nullptr}
#define ESSAIM_DOTS_DP(name) {name##_scalar, nullptr, nullptr, name##_neon, name##_dotprod}
#define ESSAIM_PREPARE(avx2, avx512, dotprod) {nullptr, nullptr, nullptr, nullptr, dotprod}
#else
#define ESSAIM_DOTS(name) {name##_scalar, nullptr, nullptr, nullptr, nullptr}
#define ESSAIM_DOTS_DP(name) ESSAIM_DOTS(name)
#define ESSAIM_PREPARE(avx2, avx512, dotprod) {}
#endif

// One row per type (docs/reference.md 2.1, 2.5). Activation-only Q8_K has conversions but no dot product.
const KernelTraits kTable[] = {
    {.type = GgmlType::F32, .block_size = 1, .type_size = 4, .alignment = 4, .vec_dot_type = GgmlType::F32,
     .dequantize = dequantize_row_f32, .quantize_ref = quantize_row_f32, .from_float = quantize_row_f32,
     .vec_dot = ESSAIM_DOTS(vec_dot_f32_f32)},
    {.type = GgmlType::F16, .block_size = 1, .type_size = 2, .alignment = 2, .vec_dot_type = GgmlType::F16,
     .dequantize = dequantize_row_f16, .quantize_ref = quantize_row_f16, .from_float = quantize_row_f16,
     .vec_dot = ESSAIM_DOTS(vec_dot_f16_f16)},
    {.type = GgmlType::BF16, .block_size = 1, .type_size = 2, .alignment = 2, .vec_dot_type = GgmlType::BF16,
     .dequantize = dequantize_row_bf16, .quantize_ref = quantize_row_bf16, .from_float = quantize_row_bf16,
     .vec_dot = ESSAIM_DOTS(vec_dot_bf16_bf16)},
    {.type = GgmlType::Q8_0, .block_size = kQK8_0, .type_size = sizeof(BlockQ8_0), .alignment = alignof(BlockQ8_0),
     .vec_dot_type = GgmlType::Q8_0, .dequantize = dequantize_row_q8_0, .quantize_ref = quantize_row_q8_0,
     .from_float = quantize_row_q8_0, .vec_dot = ESSAIM_DOTS_DP(vec_dot_q8_0_q8_0),
     .prepare = ESSAIM_PREPARE(prepare_q8_0_group8, prepare_q8_0_group8, nullptr)},
    {.type = GgmlType::Q4_K, .block_size = kQK_K, .type_size = sizeof(BlockQ4K), .alignment = alignof(BlockQ4K),
     .vec_dot_type = GgmlType::Q8_K, .dequantize = dequantize_row_q4k, .quantize_ref = quantize_row_q4k,
     .vec_dot = ESSAIM_DOTS_DP(vec_dot_q4k_q8k),
     .prepare = ESSAIM_PREPARE(prepare_q8k_q45k_avx2, prepare_q8k_q45k_avx512, nullptr)},
    {.type = GgmlType::Q5_K, .block_size = kQK_K, .type_size = sizeof(BlockQ5K), .alignment = alignof(BlockQ5K),
     .vec_dot_type = GgmlType::Q8_K, .dequantize = dequantize_row_q5k, .quantize_ref = quantize_row_q5k,
     .vec_dot = ESSAIM_DOTS_DP(vec_dot_q5k_q8k),
     .prepare = ESSAIM_PREPARE(prepare_q8k_q45k_avx2, prepare_q8k_q45k_avx512, nullptr)},
    {.type = GgmlType::Q6_K, .block_size = kQK_K, .type_size = sizeof(BlockQ6K), .alignment = alignof(BlockQ6K),
     .vec_dot_type = GgmlType::Q8_K, .dequantize = dequantize_row_q6k, .quantize_ref = quantize_row_q6k,
     .vec_dot = ESSAIM_DOTS(vec_dot_q6k_q8k),
     .prepare = ESSAIM_PREPARE(prepare_q8k_q6k_avx2, prepare_q8k_q6k_avx512, nullptr)},
    {.type = GgmlType::Q8_K, .block_size = kQK_K, .type_size = sizeof(BlockQ8K), .alignment = alignof(BlockQ8K),
     .vec_dot_type = GgmlType::Q8_K, .dequantize = dequantize_row_q8k, .quantize_ref = quantize_row_q8k,
     .from_float = quantize_row_q8k_for_isa},
};

#undef ESSAIM_DOTS
#undef ESSAIM_DOTS_DP
#undef ESSAIM_PREPARE

#if defined(ESSAIM_KERNELS_X86)
// F16C straight from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports does not know "f16c".
bool cpu_has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
}

bool cpu_has(Isa isa) {
  __builtin_cpu_init();  // idempotent; needed where this runs from a static initialiser (the prefetch default)
  switch (isa) {
    case Isa::SCALAR:
      return true;
    case Isa::AVX2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
    case Isa::AVX512:
      return cpu_has(Isa::AVX2) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
    case Isa::NEON:
    case Isa::NEON_DOTPROD:
    case Isa::COUNT:
      break;
  }
  return false;
}
#elif defined(ESSAIM_KERNELS_ARM)
// NEON (Advanced SIMD) is part of every AArch64 CPU; the dot-product extension is the kernel's asimddp bit.
bool cpu_has(Isa isa) {
  switch (isa) {
    case Isa::SCALAR:
    case Isa::NEON:
      return true;
    case Isa::NEON_DOTPROD:
      return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
    case Isa::AVX2:
    case Isa::AVX512:
    case Isa::COUNT:
      break;
  }
  return false;
}
#endif

#if defined(ESSAIM_KERNELS_X86)
bool cpu_is_intel() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(0, &eax, &ebx, &ecx, &edx) == 0) return false;
  char vendor[12];
  std::memcpy(vendor, &ebx, 4);
  std::memcpy(vendor + 4, &edx, 4);
  std::memcpy(vendor + 8, &ecx, 4);
  return std::memcmp(vendor, "GenuineIntel", 12) == 0;
}
#else
bool cpu_is_intel() { return false; }
#endif

#if defined(ESSAIM_KERNELS_X86)
// AMX-TILE and AMX-INT8 (CPUID leaf 7, EDX bits 24 and 25), and the tile data state granted to this process:
// Linux keeps it off until asked (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA), and refuses where
// the kernel or the hypervisor does not support it.
bool cpu_grants_amx() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
  if ((edx & (1u << 24)) == 0 || (edx & (1u << 25)) == 0) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}
#else
bool cpu_grants_amx() { return false; }
#endif

// A process-wide on/off switch from the environment: unset or empty = on, "0" = off, anything else a
// warning and on.
bool env_switch(const char* name, const char* what_on) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return true;
  if (std::strcmp(env, "0") == 0) return false;
  if (std::strcmp(env, "1") != 0) std::fprintf(stderr, "essaim: %s=%s is not 0 or 1; %s\n", name, env, what_on);
  return true;
}

bool initial_amx_wanted() { return env_switch("ESSAIM_AMX", "using the tiles where the CPU has them"); }

std::atomic<bool> g_amx_wanted{initial_amx_wanted()};
std::atomic<bool> g_lanes_wanted{env_switch("ESSAIM_LANES", "using the lane-per-row products")};

int64_t clamp_prefetch_bytes(int64_t bytes) { return bytes < 0 ? 0 : bytes > 65536 ? 65536 : bytes; }

// ESSAIM_PREFETCH_BYTES, or -1 where it is unset (or not a number): the default for the CPU and the kernels
// in use (default_prefetch_bytes).
int64_t env_prefetch_bytes() {
  const char* env = std::getenv("ESSAIM_PREFETCH_BYTES");
  if (env != nullptr && *env != '\0') {
    char* end = nullptr;
    const long long v = std::strtoll(env, &end, 10);
    if (end != env && *end == '\0') return clamp_prefetch_bytes(int64_t(v));
    std::fprintf(stderr, "essaim: ESSAIM_PREFETCH_BYTES=%s is not a number of bytes; using the default\n", env);
  }
  return -1;
}

// Hints on every x86 CPU but AMD's with AVX-512 (Zen 4 and later) running the AVX-512 kernels, where one L1
// hint measured 0.9-1.0x of none; AMD Zen 3 (AVX2 only) decodes 1.1-1.3x faster with them, and so do the
// AVX2 kernels on a Zen 5 (ESSAIM_ISA=avx2: a Q4_K product of one row on two threads 1.43x), which were
// tuned with them (docs/kernels.md, "Prefetch in the decode kernels").
int64_t default_prefetch_bytes(Isa running) {
#if defined(ESSAIM_KERNELS_X86)
  static const bool always = cpu_is_intel() || !isa_supported(Isa::AVX512);  // cpuid once: a VM traps it
  return always || running == Isa::AVX2 ? 1536 : 0;
#else
  (void)running;
  return cpu_is_intel() ? 1536 : 0;  // false: no x86 kernels here
#endif
}

Isa initial_isa() {
  const Isa best = best_isa();
  const char* env = std::getenv("ESSAIM_ISA");
  if (env == nullptr || *env == '\0') return best;
  const std::optional<Isa> wanted = isa_from_name(env);
  if (!wanted) {
    std::fprintf(stderr, "essaim: ESSAIM_ISA=%s is not one of scalar, avx2, avx512, neon, neon-dotprod; using %s\n", env,
                 std::string(isa_name(best)).c_str());
    return best;
  }
  if (!isa_supported(*wanted)) {
    std::fprintf(stderr, "essaim: ESSAIM_ISA=%s is not supported by this CPU; using %s\n", env,
                 std::string(isa_name(best)).c_str());
    return best;
  }
  return *wanted;
}

std::atomic<int32_t>& current_isa() {
  static std::atomic<int32_t> isa{int32_t(initial_isa())};
  return isa;
}

}  // namespace

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::SCALAR: return "scalar";
    case Isa::AVX2: return "avx2";
    case Isa::AVX512: return "avx512";
    case Isa::NEON: return "neon";
    case Isa::NEON_DOTPROD: return "neon-dotprod";
    case Isa::COUNT: break;
  }
  return "?";
}

std::optional<Isa> isa_from_name(std::string_view s) {
  for (int i = 0; i < int(Isa::COUNT); ++i)
    if (isa_name(Isa(i)) == s) return Isa(i);
  return std::nullopt;
}

bool isa_supported(Isa isa) {
#if defined(ESSAIM_KERNELS_X86) || defined(ESSAIM_KERNELS_ARM)
  return cpu_has(isa);
#else
  return isa == Isa::SCALAR;
#endif
}

Isa best_isa() {
  for (int i = int(Isa::COUNT) - 1; i > 0; --i)
    if (isa_supported(Isa(i))) return Isa(i);
  return Isa::SCALAR;
}

namespace {
// The distance fixed by ESSAIM_PREFETCH_BYTES or set_weight_prefetch_bytes, or -1: the default for the
// kernels in use, resolved again whenever set_kernel_isa changes them.
std::atomic<int64_t> g_prefetch_fixed{env_prefetch_bytes()};
int64_t resolve_prefetch_bytes(Isa running) {
  const int64_t fixed = g_prefetch_fixed.load(std::memory_order_relaxed);
  return fixed >= 0 ? fixed : default_prefetch_bytes(running);
}
}  // namespace

// What the kernels read (dot_kernels.h): always the resolved distance. Zero (no prefetch) until its dynamic
// initialisation, so a kernel running from another static initialiser is merely unhinted.
std::atomic<int64_t> g_weight_prefetch_bytes{resolve_prefetch_bytes(kernels_isa())};

int64_t weight_prefetch_bytes() { return g_weight_prefetch_bytes.load(std::memory_order_relaxed); }
void set_weight_prefetch_bytes(int64_t bytes) {
  const int64_t fixed = clamp_prefetch_bytes(bytes);
  g_prefetch_fixed.store(fixed, std::memory_order_relaxed);
  g_weight_prefetch_bytes.store(fixed, std::memory_order_relaxed);
}

bool amx_supported() {
  static const bool granted = cpu_grants_amx();
  return granted;
}
bool amx_enabled() {
  return g_amx_wanted.load(std::memory_order_relaxed) && kernels_isa() == Isa::AVX512 && amx_supported();
}
void set_amx_enabled(bool on) { g_amx_wanted.store(on, std::memory_order_relaxed); }

bool lanes_enabled() { return g_lanes_wanted.load(std::memory_order_relaxed) && kernels_isa() == Isa::AVX2; }
bool rowlanes_enabled() { return g_lanes_wanted.load(std::memory_order_relaxed) && kernels_isa() == Isa::AVX512; }

namespace {
std::atomic<uint64_t> g_lane_pass_override{0};

uint64_t l2_bytes_per_core() {
#ifdef _SC_LEVEL2_CACHE_SIZE
  static const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  return l2 > 0 ? uint64_t(l2) : 0;
#else
  return 0;
#endif
}

uint64_t measured_pass_bytes(uint64_t with_big_l2) {
  if (const uint64_t o = g_lane_pass_override.load(std::memory_order_relaxed)) return o;
  return l2_bytes_per_core() >= (1u << 20) ? with_big_l2 : 192 * 1024;
}
}  // namespace

uint64_t lanes_pass_bytes() { return measured_pass_bytes(320 * 1024); }
uint64_t rowlanes_pass_bytes() { return measured_pass_bytes(512 * 1024); }
void set_lane_pass_bytes(uint64_t bytes) { g_lane_pass_override.store(bytes, std::memory_order_relaxed); }
void set_lanes_enabled(bool on) { g_lanes_wanted.store(on, std::memory_order_relaxed); }
bool lanes_switch() { return g_lanes_wanted.load(std::memory_order_relaxed); }

Isa kernels_isa() { return Isa(current_isa().load(std::memory_order_relaxed)); }

Status set_kernel_isa(Isa isa) {
  if (int(isa) < 0 || isa >= Isa::COUNT) return Status::error("unknown instruction set");
  if (!isa_supported(isa))
    return Status::error("instruction set " + std::string(isa_name(isa)) + " is not supported by this CPU");
  current_isa().store(int32_t(isa), std::memory_order_relaxed);
  g_weight_prefetch_bytes.store(resolve_prefetch_bytes(isa), std::memory_order_relaxed);
  return Status::ok();
}

VecDotFn KernelTraits::dot(Isa isa) const {
  for (int i = int(isa); i >= 0; --i)
    if (vec_dot[size_t(i)] != nullptr) return vec_dot[size_t(i)];
  return nullptr;
}

PrepareFn KernelTraits::prepare_for(Isa isa) const {
  for (int i = int(isa); i >= 0; --i)
    if (vec_dot[size_t(i)] != nullptr) return prepare[size_t(i)];
  return nullptr;
}

void prepare_activations(const KernelTraits& k, Isa isa, const uint8_t* xq, int64_t n_rows, int64_t cols,
                         uint8_t* out) {
  const KernelTraits& act = *kernel_traits(k.vec_dot_type);
  const uint64_t row_bytes = act.row_bytes(cols);
  const PrepareFn prepare = k.prepare_for(isa);
  if (prepare == nullptr) {
    std::memcpy(out, xq, row_bytes * uint64_t(n_rows));
    return;
  }
  for (int64_t t = 0; t < n_rows; ++t) prepare(xq + uint64_t(t) * row_bytes, out + uint64_t(t) * row_bytes, cols);
}

const KernelTraits* kernel_traits(GgmlType type) {
  for (const KernelTraits& k : kTable)
    if (k.type == type) return &k;
  return nullptr;
}

bool kernel_type_supported(GgmlType type) { return kernel_traits(type) != nullptr; }

void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
  const KernelTraits* k = kernel_traits(type);
  ESSAIM_CHECK(k != nullptr && n % k->block_size == 0);
  k->dequantize(src, dst, n);
}

void quantize_row(GgmlType type, const float* src, void* dst, int64_t n) {
  const KernelTraits* k = kernel_traits(type);
  ESSAIM_CHECK(k != nullptr && n % k->block_size == 0);
  k->quantize_ref(src, dst, n);
}

}  // namespace essaim
