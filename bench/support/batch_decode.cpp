#include "batch_decode.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>

#include "synth/synth.h"

namespace essaim::bench {

using Clock = std::chrono::steady_clock;

Result<std::string> ensure_synth_model(const std::string& data_dir, const std::string& preset, uint32_t layers,
                                       const std::string& who) {
  const bool big = preset == "q35-122b";
  if (!big && preset != "tiny") return Status::error("the synth preset is tiny or q35-122b, not \"" + preset + "\"");
  const std::string path = data_dir + "/qwen3moe-" + preset + "-" + std::to_string(layers) + "l-q4_k_m.gguf";
  if (std::filesystem::exists(path)) return path;
  std::filesystem::create_directories(data_dir);
  ESSAIM_ASSIGN_OR_RETURN(SynthPlan plan, synth_plan({.arch = SynthArch::QWEN3MOE,
                                                      .preset = big ? SynthPreset::Q35_122B : SynthPreset::TINY,
                                                      .layers = layers, .types = SynthTypeMix::Q4_K_M, .seed = 1}));
  std::fprintf(stderr, "%s: writing %s\n", who.c_str(), path.c_str());
  ESSAIM_ASSIGN_OR_RETURN(SynthSummary summary, synth_write(plan, path + ".part"));
  (void)summary;
  std::filesystem::rename(path + ".part", path);
  return path;
}

double BatchRun::tokens_per_s(int n) const {
  double total = 0;
  for (double t : step_s) total += t;
  return total > 0 ? double(n) * double(step_s.size()) / total : 0;
}

Result<BatchRun> batch_decode(const Model& m, const BatchDecodeOptions& o, int n, ExpertExecutor& experts,
                              const backbone::RemoteExpertExecutor* remote, ThreadPool& pool) {
  const size_t V = size_t(m.info().n_vocab), N = size_t(n);
  BatchRun r;
  std::vector<SequenceCache> caches;                         // [N]
  std::vector<std::vector<int32_t>> prompts(N);              // [N][prompt]
  std::vector<std::vector<float>> logits(N, std::vector<float>(V));  // [N][V]
  for (size_t i = 0; i < N; ++i) {
    caches.push_back(m.new_cache({.n_ctx = o.prompt + o.decode + 2}));
    std::mt19937 rng(uint32_t(1000 + i));
    for (int t = 0; t < o.prompt; ++t) prompts[i].push_back(int32_t(rng() % uint32_t(V)));
  }
  std::vector<BatchItem> items(N);
  for (size_t i = 0; i < N; ++i)
    items[i] = {.tokens = prompts[i], .cache = &caches[i], .logits_mode = LogitsMode::LAST, .logits = logits[i]};
  auto t0 = Clock::now();
  ESSAIM_RETURN_IF_ERROR(m.forward_batch({.items = items, .experts = &experts, .pool = &pool}));
  r.prefill_s = std::chrono::duration<double>(Clock::now() - t0).count();

  std::vector<int32_t> next(N);  // [N] this step's token of each sequence
  r.tokens.resize(N);
  for (int step = 0; step <= o.decode; ++step) {
    if (step == 1 && remote) r.before = remote->stats();
    for (size_t i = 0; i < N; ++i) {
      next[i] = int32_t(std::max_element(logits[i].begin(), logits[i].end()) - logits[i].begin());
      r.tokens[i].push_back(next[i]);
      items[i].tokens = std::span<const int32_t>(&next[i], 1);
    }
    t0 = Clock::now();
    ESSAIM_RETURN_IF_ERROR(m.forward_batch({.items = items, .experts = &experts, .pool = &pool}));
    if (step > 0) r.step_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  if (remote) r.after = remote->stats();
  return r;
}

}  // namespace essaim::bench
