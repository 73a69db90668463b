// How fast this machine lets a decode kernel read its weights, before any arithmetic: the read rate of the
// access forms a one-row product can take over a buffer far larger than the caches, all threads at once on
// contiguous shares (as a decode splits a matrix's rows), each form against plain sequential loads (what
// `essaim bench`'s read probe does) measured in the same round. Nothing is computed but an xor of what is
// loaded, so each figure is a ceiling for a kernel that reads that way: a kernel that needs software
// read-ahead cannot stream faster than "sequential + read-ahead", and the AVX-512 row lanes cannot stream
// faster than "row lanes order" with their read-ahead (docs/engine.md, "The read ceiling of a decode kernel").
//
//   build/bench/read_ceiling [--threads 2] [--mb 1024] [--rounds 7] [--cols 3072] [--isa best|avx512|avx2]
//                            [--pages 2m|4k]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <sys/mman.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "speed/memory_bandwidth.h"
#include "median.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kLine = 64;
constexpr size_t kQ4kBlockBytes = 144;  // one Q4_K super-block of 256 columns
constexpr size_t kLaneRows = 16;        // rows per step of the AVX-512 row lanes

// One access form over [p, p + n): returns a value depending on every byte loaded (kept from the optimiser).
using ReadFn = uint64_t (*)(const uint8_t* p, size_t n, size_t param);

#if defined(__x86_64__)
__attribute__((target("avx512f"))) uint64_t fold(__m512i v) {
  uint64_t lane[8];
  _mm512_storeu_si512(lane, v);
  uint64_t s = 0;
  for (uint64_t x : lane) s += x;
  return s;
}

// Two 64-byte loads per step, as the probe; with `ahead` > 0 also one T0 prefetch per line `ahead` bytes on.
__attribute__((target("avx512f"))) uint64_t sequential(const uint8_t* p, size_t n, size_t ahead) {
  __m512i a = _mm512_setzero_si512(), b = a;
  for (size_t i = 0; i + 2 * kLine <= n; i += 2 * kLine) {
    if (ahead != 0) {
      _mm_prefetch(reinterpret_cast<const char*>(p + i + ahead), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(p + i + ahead + kLine), _MM_HINT_T0);
    }
    a = _mm512_xor_si512(a, _mm512_load_si512(p + i));
    b = _mm512_xor_si512(b, _mm512_load_si512(p + i + kLine));
  }
  return fold(_mm512_xor_si512(a, b));
}

// The row lanes' decode order over Q4_K rows of `row` bytes: sixteen rows at a time, super-block k of each
// row in turn (144 bytes: two 64-byte loads and one of 16). With `readahead`, the kernel's read-ahead too:
// the next super-block of each row, and a share of the next sixteen rows' lines at each super-block step.
template <bool kReadAhead>
__attribute__((target("avx512f"))) uint64_t row_lanes_order(const uint8_t* p, size_t n, size_t row) {
  __m512i a = _mm512_setzero_si512();
  const size_t chunk = kLaneRows * row, n_sb = row / kQ4kBlockBytes;
  const size_t lines = (chunk + kLine - 1) / kLine, per_step = (lines + n_sb - 1) / n_sb;
  for (size_t c = 0; c + 2 * chunk <= n; c += chunk) {
    const uint8_t* f = p + c;
    for (size_t k = 0; k < n_sb; ++k) {
      if constexpr (kReadAhead) {
        for (size_t l = k * per_step; l < std::min(lines, (k + 1) * per_step); ++l)
          _mm_prefetch(reinterpret_cast<const char*>(f + chunk + kLine * l), _MM_HINT_T0);
        if (k + 1 < n_sb)
          for (size_t r = 0; r < kLaneRows; ++r) {
            const char* next = reinterpret_cast<const char*>(f + r * row + (k + 1) * kQ4kBlockBytes);
            for (size_t o = 0; o < kQ4kBlockBytes; o += kLine) _mm_prefetch(next + o, _MM_HINT_T0);
            _mm_prefetch(next + kQ4kBlockBytes - 1, _MM_HINT_T0);
          }
      }
      for (size_t r = 0; r < kLaneRows; ++r) {
        const uint8_t* q = f + r * row + k * kQ4kBlockBytes;
        a = _mm512_xor_si512(a, _mm512_loadu_si512(q));
        a = _mm512_xor_si512(a, _mm512_loadu_si512(q + kLine));
        a = _mm512_xor_si512(a, _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 128))));
      }
    }
  }
  return fold(a);
}
// The same forms with 32-byte loads, for AVX2 machines (or --isa avx2): sequential, with read-ahead, and
// the AVX2 decode kernel's order — four Q4_K rows, super-block k of each in turn — with its hints (the four
// rows' 576 bytes per step swept twice the prefetch distance ahead into L1 and eight times into L2,
// dot_quant_avx2.cpp's hint_four_rows).
__attribute__((target("avx2"))) uint64_t fold256(__m256i v) {
  uint64_t lane[4];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(lane), v);
  return lane[0] + lane[1] + lane[2] + lane[3];
}

__attribute__((target("avx2"))) uint64_t sequential_avx2(const uint8_t* p, size_t n, size_t ahead) {
  __m256i a = _mm256_setzero_si256(), b = a;
  for (size_t i = 0; i + kLine <= n; i += kLine) {
    if (ahead != 0) _mm_prefetch(reinterpret_cast<const char*>(p + i + ahead), _MM_HINT_T0);
    a = _mm256_xor_si256(a, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    b = _mm256_xor_si256(b, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
  }
  return fold256(_mm256_xor_si256(a, b));
}

template <bool kHints>
__attribute__((target("avx2"))) uint64_t four_rows_order(const uint8_t* p, size_t n, size_t row) {
  constexpr size_t kRows = 4;
  const size_t chunk = kRows * row, n_sb = row / kQ4kBlockBytes, ahead = 1536;
  __m256i a = _mm256_setzero_si256();
  for (size_t c = 0; c + chunk + 8 * ahead + kRows * kQ4kBlockBytes <= n; c += chunk) {
    const uint8_t* f = p + c;
    for (size_t k = 0; k < n_sb; ++k) {
      if constexpr (kHints) {
        const uint8_t* at = f + k * kRows * kQ4kBlockBytes;
        for (size_t o = 0; o < kRows * kQ4kBlockBytes; o += kLine) {
          _mm_prefetch(reinterpret_cast<const char*>(at + 2 * ahead + o), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(at + 8 * ahead + o), _MM_HINT_T1);
        }
      }
      for (size_t r = 0; r < kRows; ++r) {
        const uint8_t* q = f + r * row + k * kQ4kBlockBytes;
        for (size_t o = 0; o < 128; o += 32)
          a = _mm256_xor_si256(a, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + o)));
        a = _mm256_xor_si256(a, _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 128))));
      }
    }
  }
  return fold256(a);
}
#endif

// Portable form of the sequential read (one word per line), for machines without AVX-512.
uint64_t sequential_words(const uint8_t* p, size_t n, size_t) {
  uint64_t s = 0;
  for (size_t i = 0; i + kLine <= n; i += kLine) {
    uint64_t w;
    std::memcpy(&w, p + i, sizeof(w));
    s ^= w;
  }
  return s;
}

struct Form {
  std::string name;
  ReadFn fn;
  size_t param;
};

// AnonHugePages of this process (/proc/self/status has no such field; smaps_rollup has), in MiB.
double anon_huge_mib() {
  std::ifstream f("/proc/self/smaps_rollup");
  std::string key;
  double kb = 0;
  while (f >> key) {
    if (key == "AnonHugePages:") {
      f >> kb;
      break;
    }
    f.ignore(1 << 16, '\n');
  }
  return kb / 1024;
}

using essaim::bench::median;

// All threads read their share at once (started together); seconds until the last one is done.
double timed_read(const Form& form, const uint8_t* buf, size_t share, int threads, std::vector<uint64_t>& sink) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) {
      }
      sink[size_t(t)] ^= form.fn(buf + size_t(t) * share, share, form.param);
    });
  while (ready.load() != threads) {
  }
  const auto t0 = Clock::now();
  go.store(true, std::memory_order_release);
  for (auto& th : ts) th.join();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The read rate of a decode kernel's access forms against plain sequential loads (no arithmetic)"};
  int threads = 2, mb = 1024, rounds = 7, cols = 3072;
  std::string isa = "best", pages = "2m";
  app.add_option("--threads", threads, "threads reading at once, each a contiguous share")->check(CLI::Range(1, 256));
  app.add_option("--mb", mb, "buffer size in MiB (far beyond the caches)")->check(CLI::Range(64, 65536));
  app.add_option("--rounds", rounds, "rounds; the forms alternate within each")->check(CLI::Range(1, 1000));
  app.add_option("--cols", cols, "columns of the Q4_K rows in the row-lanes forms (a multiple of 256)")
      ->check(CLI::Range(256, 1 << 20));
  app.add_option("--isa", isa, "load width and kernel order: avx512 (the row lanes), avx2 (the four-row kernel), "
                 "or best (the widest this CPU has)")
      ->check(CLI::IsMember({"best", "avx512", "avx2"}));
  app.add_option("--pages", pages, "page size asked for the buffer: 2m (as the model's mapping, docs/engine.md) or 4k "
                 "(sixteen strided rows then touch seven pages per step: TLB misses, not the bus)")
      ->check(CLI::IsMember({"2m", "4k"}));
  CLI11_PARSE(app, argc, argv);
  if (cols % 256 != 0) {
    std::cerr << "read_ceiling: --cols must be a multiple of 256\n";
    return 2;
  }

  std::vector<Form> forms;
#if defined(__x86_64__)
  const bool has_avx512 = __builtin_cpu_supports("avx512f"), has_avx2 = __builtin_cpu_supports("avx2");
#else
  const bool has_avx512 = false, has_avx2 = false;
#endif
  if (isa == "best") isa = has_avx512 ? "avx512" : has_avx2 ? "avx2" : "none";
  if ((isa == "avx512" && !has_avx512) || (isa == "avx2" && !has_avx2)) {
    std::cerr << "read_ceiling: this CPU has no " << isa << "\n";
    return 2;
  }
  const size_t row = size_t(cols) / 256 * kQ4kBlockBytes;
#if defined(__x86_64__)
  const std::string one_chunk = " (" + std::to_string(kLaneRows * row) + " B)";
  if (isa == "avx512")
    forms = {{"sequential", sequential, 0},
             {"sequential, read-ahead 512 B", sequential, 512},
             {"sequential, read-ahead 2 KiB", sequential, 2048},
             {"sequential, read-ahead 8 KiB", sequential, 8192},
             {"sequential, read-ahead one chunk of sixteen rows" + one_chunk, sequential, kLaneRows * row},
             {"row lanes order", row_lanes_order<false>, row},
             {"row lanes order, kernel's read-ahead", row_lanes_order<true>, row}};
  if (isa == "avx2")
    forms = {{"sequential", sequential_avx2, 0},
             {"sequential, read-ahead 512 B", sequential_avx2, 512},
             {"sequential, read-ahead 2 KiB", sequential_avx2, 2048},
             {"sequential, read-ahead 8 KiB", sequential_avx2, 8192},
             {"four rows order", four_rows_order<false>, row},
             {"four rows order, kernel's hints", four_rows_order<true>, row}};
#endif
  if (forms.empty()) {
    forms = {{"sequential", sequential_words, 0}};
    std::cerr << "read_ceiling: no AVX2 here; only the sequential form is measured\n";
  }

  const size_t bytes = size_t(mb) << 20;
  void* mapped = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) {
    std::cerr << "read_ceiling: cannot map " << mb << " MiB\n";
    return 1;
  }
  auto* buf = static_cast<uint8_t*>(mapped);
  madvise(buf, bytes, pages == "2m" ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  for (size_t i = 0; i < bytes; i += 4096) std::memset(buf + i, int(i >> 12) & 0xFF, 4096);
  const size_t share = bytes / size_t(threads) / kLine * kLine;
  std::vector<uint64_t> sink(size_t(threads), 0);

  // seconds[f][r]; a warm-up round first.
  std::vector<std::vector<double>> seconds(forms.size());
  for (int r = 0; r <= rounds; ++r)
    for (size_t f = 0; f < forms.size(); ++f) {
      const double s = timed_read(forms[f], buf, share, threads, sink);
      if (r > 0) seconds[f].push_back(s);
    }

  nlohmann::json cases = nlohmann::json::array();
  const double gb = double(share) * threads / 1e9;
  for (size_t f = 0; f < forms.size(); ++f) {
    std::vector<double> rates, ratios;
    for (int r = 0; r < rounds; ++r) {
      rates.push_back(gb / seconds[f][size_t(r)]);
      ratios.push_back(seconds[0][size_t(r)] / seconds[f][size_t(r)]);
    }
    cases.push_back({{"form", forms[f].name},
                     {"gb_per_s_median", median(rates)},
                     {"gb_per_s_best", *std::max_element(rates.begin(), rates.end())},
                     {"over_sequential_median", median(ratios)}});
  }
  uint64_t all = 0;
  for (uint64_t s : sink) all ^= s;
  nlohmann::json out{{"benchmark", "read_ceiling"},
                     {"cpu", essaim::cpu_model_name()},
                     {"isa", isa},
                     {"threads", threads},
                     {"buffer_mib", mb},
                     {"pages", pages},
                     {"anon_huge_pages_mib", anon_huge_mib()},
                     {"rounds", rounds},
                     {"row_lanes_cols", cols},
                     {"checksum", all},
                     {"cases", cases}};
  std::cout << out.dump(2) << "\n";
  munmap(buf, bytes);
  return 0;
}
