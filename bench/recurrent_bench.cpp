// The Gated DeltaNet recurrent step of one decoded token alone (gated_deltanet_recurrence: gates, conv,
// L2 norms, delta rule, gated norm; no projection) over a Qwen3.5-122B-shaped state (16 key heads, 64 value
// heads of 128: 4 MiB per layer), under each kernel ISA the CPU has (the delta rule runs the baseline code
// below AVX2, its AVX2 clone from AVX2 on), with the state advanced in place or written to a second buffer
// (what a forward does while its expert executor may fail), and with the caches flushed between tokens (as
// a decode's weight stream flushes them) or not. Prints one JSON document: medians in µs per layer, the
// state bytes each form moves per layer (in place: read and written back, 2 × 4 MiB; aside: read, the
// destination read for ownership and written back, 3 × 4 MiB), that traffic per second and its fraction of
// the read bandwidth measured in the same run (docs/engine.md, "Recurrent states advanced in place").
//
//   build/bench/recurrent_bench                      # 2 threads, 3 layers, 40 tokens per case and round
//   build/bench/recurrent_bench --threads 1 --rounds 5
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/kernel_traits.h"
#include "model/gated_deltanet.h"
#include "speed/memory_bandwidth.h"
#include "median.h"

namespace essaim {
namespace {

struct Layer {
  std::vector<float> conv, state, conv_aside, state_aside;
};

// The per-channel and per-head parameters the recurrence reads (the projections are not used), seeded.
struct Weights {
  std::vector<float> conv1d, dt_bias, a, norm;
  GdnWeights w;
  explicit Weights(const GdnShape& s) {
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 0.5f);
    conv1d.resize(size_t(s.conv_channels()) * size_t(s.conv_kernel));
    for (float& x : conv1d) x = normal(rng);
    dt_bias.assign(size_t(s.n_v_heads), 0.0f);
    a.assign(size_t(s.n_v_heads), -1.0f);
    norm.assign(size_t(s.head_dim), 1.0f);
    w.conv1d = conv1d.data();
    w.dt_bias = dt_bias.data();
    w.a = a.data();
    w.norm = norm.data();
  }
};

using bench::median;

}  // namespace
}  // namespace essaim

int main(int argc, char** argv) {
  using namespace essaim;
  CLI::App app{"Gated DeltaNet recurrent step of one decoded token (122B shape), per delta-rule form"};
  size_t threads = 2;
  int layers = 3, tokens = 40, rounds = 3;
  int64_t flush_mb = 256;
  app.add_option("--threads", threads, "threads")->check(CLI::Range(1, 256));
  app.add_option("--layers", layers, "layers, each with its own 4 MiB state")->check(CLI::Range(1, 64));
  app.add_option("--tokens", tokens, "tokens per case and round")->check(CLI::Range(1, 100000));
  app.add_option("--rounds", rounds, "rounds; the cases alternate within each")->check(CLI::Range(1, 1000));
  app.add_option("--flush-mb", flush_mb, "bytes read between tokens in the cold cases")->check(CLI::Range(1, 65536));
  CLI11_PARSE(app, argc, argv);

  const GdnShape s{.n_embd = 3072, .conv_kernel = 4, .n_k_heads = 16, .n_v_heads = 64, .head_dim = 128, .eps = 1e-6f};
  const Weights weights(s);
  ThreadPool pool(threads);
  const Bandwidth bw = measure_bandwidth({.bytes = int64_t(256) << 20, .reps = 3, .copy = false}, &pool);

  std::vector<Layer> state(static_cast<size_t>(layers));
  for (Layer& l : state) {
    l.conv.assign(s.conv_state_size(), 0.0f);
    l.state.assign(s.recurrent_state_size(), 0.0f);
    l.conv_aside = l.conv;
    l.state_aside = l.state;
  }
  std::mt19937 rng(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // One row's raw projections (refilled per token: the gates turn beta and decay in place) and read-out.
  std::vector<float> mix(size_t(s.conv_channels())), z(size_t(s.value_dim())), o(size_t(s.value_dim()));
  std::vector<float> beta(size_t(s.n_v_heads)), decay(size_t(s.n_v_heads));
  for (float& x : mix) x = normal(rng);
  for (float& x : z) x = normal(rng);
  std::vector<uint8_t> flush(size_t(flush_mb) << 20, 1);
  volatile uint64_t sink = 0;

  struct Case {
    Isa isa;
    bool in_place, cold;
    std::vector<double> us;  // per layer and token
  };
  std::vector<Case> cases;
  const Isa saved = kernels_isa();
  for (Isa isa : {Isa::SCALAR, Isa::AVX2, Isa::AVX512, Isa::NEON})
    if (isa_supported(isa))
      for (bool in_place : {true, false})
        for (bool cold : {true, false}) cases.push_back({isa, in_place, cold, {}});
  for (int r = 0; r < rounds; ++r)
    for (Case& c : cases) {
      if (!set_kernel_isa(c.isa)) continue;
      for (int t = 0; t < tokens; ++t) {
        for (float& x : beta) x = normal(rng);
        for (float& x : decay) x = normal(rng);
        if (c.cold) {
          uint64_t sum = 0;
          for (size_t i = 0; i < flush.size(); i += 64) sum += flush[i];
          sink = sink + sum;
        }
        for (Layer& l : state) {
          GdnSequence sq{.row0 = 0, .n_rows = 1,
                         .io = {.conv_in = l.conv.data(), .state_in = l.state.data(), .conv_out = l.conv.data(),
                                .state_out = l.state.data()}};
          if (!c.in_place) sq.io.conv_out = l.conv_aside.data(), sq.io.state_out = l.state_aside.data();
          std::vector<float> b = beta, d = decay;
          const auto t0 = std::chrono::steady_clock::now();
          gated_deltanet_recurrence(s, weights.w, 1, std::span(&sq, 1), mix.data(), z.data(), b.data(), d.data(),
                                    o.data(), &pool);
          c.us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
          if (!c.in_place) l.conv.swap(l.conv_aside), l.state.swap(l.state_aside);
        }
      }
    }
  (void)set_kernel_isa(saved);

  const double state_bytes = double(s.recurrent_state_size()) * sizeof(float);
  nlohmann::json out{{"benchmark", "Gated DeltaNet recurrent step, one decoded token, 122B shape"},
                     {"cpu", cpu_model_name()},
                     {"threads", threads},
                     {"layers", layers},
                     {"state_bytes_per_layer", state_bytes},
                     {"read_gb_per_s", bw.read_gb_per_s},
                     {"cases", nlohmann::json::array()}};
  for (const Case& c : cases) {
    const double us = median(c.us), moved = (c.in_place ? 2.0 : 3.0) * state_bytes;
    const double gb_per_s = us > 0 ? moved / (us * 1e-6) / 1e9 : 0.0;
    out["cases"].push_back({{"isa", std::string(isa_name(c.isa))},
                            {"state", c.in_place ? "in place" : "aside"},
                            {"caches", c.cold ? "flushed" : "warm"},
                            {"us_per_layer", us},
                            {"state_bytes_moved", moved},
                            {"state_gb_per_s", gb_per_s},
                            {"fraction_of_read_bandwidth", bw.read_gb_per_s > 0 ? gb_per_s / bw.read_gb_per_s : 0.0}});
  }
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}
