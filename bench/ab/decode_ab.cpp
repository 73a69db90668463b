// A run-time switch of the decode path measured in one process, token by token. First two sequences decode
// the same 32 random tokens, one with the switch off and one with it on, and their logits must be the same
// bits at every step (the switches here change speed only); then one sequence decodes pairs of consecutive
// tokens, one with the switch off and one on, alternating which goes first. Separate `essaim bench` runs move
// by more than a few per cent on a shared host; per-token pairs cancel the host's drifts (docs/engine.md,
// "ninth session"). Prints JSON: the median of the per-pair on/off time ratios with its quartiles.
//
//   build/bench/decode_ab -m model.gguf --switch prefetch --on-bytes 1536 --pairs 400 -t 2
// Switches: prefetch (the decode kernels' prefetch distance: off 0, on --on-bytes; set_weight_prefetch_bytes),
// lanes (the AVX2 lanes and AVX-512 row lanes: set_lanes_enabled), amx (set_amx_enabled). A new switch is
// one more case in set_switch.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "ab_pairs.h"
#include "core/huge_pages.h"
#include "core/thread_pool.h"
#include "kernels/kernel_traits.h"
#include "model/model.h"
#include "moe/executor.h"
#include "speed/model_speed.h"

namespace essaim {
namespace {

using Clock = std::chrono::steady_clock;
using ab::quantile;

int run(int argc, char** argv) {
  CLI::App app{"essaim decode A/B of a run-time switch, token by token (JSON on stdout)"};
  std::string path, which = "prefetch";
  int pairs = 300, threads = 2, reset_every = 128;
  int64_t on_bytes = 1536;
  app.add_option("-m,--model", path, "GGUF model")->required();
  app.add_option("--switch", which, "what to switch: prefetch, lanes, amx");
  app.add_option("--on-bytes", on_bytes, "prefetch: the distance when on (off is 0)")->check(CLI::Range(0, 65536));
  app.add_option("--pairs", pairs, "token pairs timed")->check(CLI::Range(1, 100000));
  app.add_option("-t,--threads", threads, "threads")->check(CLI::Range(1, 1024));
  app.add_option("--reset-every", reset_every, "tokens decoded into the timed sequence before it starts again")->check(CLI::Range(1, 4096));
  CLI11_PARSE(app, argc, argv);
  std::function<void(bool)> set_switch;
  if (which == "prefetch") set_switch = [on_bytes](bool on) { set_weight_prefetch_bytes(on ? on_bytes : 0); };
  else if (which == "lanes") set_switch = [](bool on) { set_lanes_enabled(on); };
  else if (which == "amx") set_switch = [](bool on) { set_amx_enabled(on); };
  if (!set_switch) {
    std::fprintf(stderr, "decode_ab: unknown switch '%s' (prefetch, lanes, amx)\n", which.c_str());
    return 2;
  }

  Result<std::unique_ptr<Model>> loaded = load_model(path);
  if (!loaded) {
    std::fprintf(stderr, "decode_ab: %s\n", loaded.status().message().c_str());
    return 1;
  }
  // The mapping in 2 MiB pages, as `essaim bench` has it (cli/model_load.cpp): with 4 KiB pages a decode
  // pays TLB misses that depend on its access order, and a switch that changes the order would read faster
  // or slower for that alone (docs/engine.md, "tenth session").
  const std::string huge = map_in_huge_pages((*loaded)->file().mapping()).describe(path);
  if (!huge.empty()) std::fprintf(stderr, "decode_ab: %s\n", huge.c_str());
  const Model& m = **loaded;
  ThreadPool pool{size_t(threads)};
  LocalExpertExecutor experts(m.expert_store(), &pool);
  touch_model_pages(m);

  const int32_t n_vocab = m.info().n_vocab;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> pick(0, n_vocab - 1);
  std::vector<float> logits[2] = {std::vector<float>(size_t(n_vocab)), std::vector<float>(size_t(n_vocab))};
  auto decode = [&](SequenceCache& cache, int32_t token, std::vector<float>& out) {
    const auto t0 = Clock::now();
    const Status s = m.forward({.tokens = std::span<const int32_t>(&token, 1), .cache = &cache, .experts = &experts,
                                .pool = &pool, .logits_mode = LogitsMode::LAST, .logits = out});
    if (!s.is_ok()) {
      std::fprintf(stderr, "decode_ab: %s\n", s.message().c_str());
      std::exit(1);
    }
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  // First the bits: two sequences decode the same tokens, one with the switch off and one with it on.
  {
    SequenceCache caches[2] = {m.new_cache({.n_ctx = 33}), m.new_cache({.n_ctx = 33})};
    for (int i = 0; i < 32; ++i) {
      const int32_t token = pick(rng);
      for (int side = 0; side < 2; ++side) {
        set_switch(side == 1);
        decode(caches[side], token, logits[side]);
      }
      if (std::memcmp(logits[0].data(), logits[1].data(), logits[0].size() * sizeof(float)) != 0) {
        std::fprintf(stderr, "decode_ab: the switch changed the logits' bits at token %d\n", i);
        return 1;
      }
    }
  }
  // Then the time: one sequence, consecutive tokens in pairs (off then on, or on then off, alternating), so
  // that neither side reuses the weights the other just read (consecutive tokens route to other experts).
  std::vector<double> ratios, ms[2];
  SequenceCache cache = m.new_cache({.n_ctx = reset_every + 1});
  int in_cache = 0;
  for (int p = -8; p < pairs; ++p) {  // eight pairs warm up
    if (in_cache + 2 > reset_every) {
      cache = m.new_cache({.n_ctx = reset_every + 1});
      in_cache = 0;
    }
    double seconds[2];
    for (int k = 0; k < 2; ++k) {
      const int side = (p & 1) ? 1 - k : k;  // 0 = off, 1 = on
      set_switch(side == 1);
      seconds[side] = decode(cache, pick(rng), logits[0]);
    }
    in_cache += 2;
    if (p < 0) continue;
    ratios.push_back(seconds[1] / seconds[0]);
    for (int side = 0; side < 2; ++side) ms[side].push_back(1e3 * seconds[side]);
  }
  const nlohmann::json out = {{"benchmark", "decode_ab"},    {"switch", which},
                              {"model", path},               {"threads", threads},
                              {"pairs", pairs},              {"off_ms_median", quantile(ms[0], 0.5)},
                              {"on_ms_median", quantile(ms[1], 0.5)},
                              {"on_over_off_median", quantile(ratios, 0.5)},
                              {"on_over_off_q1", quantile(ratios, 0.25)},
                              {"on_over_off_q3", quantile(ratios, 0.75)}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace essaim

int main(int argc, char** argv) { return essaim::run(argc, argv); }
