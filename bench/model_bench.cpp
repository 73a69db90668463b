// Whole-model benchmark: load time, prefill and decode tokens/s of qwen3moe models, the weight bytes one
// decoded token reads, and how that compares with the machine's memory bandwidth (a STREAM-like copy and a
// read measured in the same run) — decode of a big MoE is bandwidth-bound, so the fraction is its roofline.
// Prints one JSON document; every timing is a median.
//
//   build-model/bench/model_bench                                  # tiny + 122B-shaped 2 and 4 layers
//   build-model/bench/model_bench --layers 2 --decode 16 --reps 3
//   build-model/bench/model_bench --model some.gguf                # only that file
//   build-model/bench/model_bench --arch qwen35moe --layers 4      # qwen35moe: 3 Gated DeltaNet + 1 attention
//
// Models: unless --model is given, the synth library writes (once, into --data-dir) the tiny qwen3moe
// (q4_k_m) and the q35-122b-shaped qwen3moe with the requested layer counts (q4_k_m): the per-layer shapes
// of Qwen3.5-122B-A10B (3072 embd, 256 experts top-8 of 3×3072×1024, 32 q / 2 kv heads × 256).
// Bytes per decoded token = every dense weight once (attention, norms, router, LM head) + one embedding
// row + K experts per MoE layer (ModelInfo::active_bytes_per_token): decode groups rows by expert, so
// each active expert's bytes are streamed exactly once per token. decode_weight_gb_per_s = those bytes ×
// tokens/s; fraction_of_copy_bandwidth divides it by the STREAM copy figure (read + written bytes, as
// STREAM counts them), fraction_of_read_bandwidth by a pure read stream with the widest vector loads.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "model/model.h"
#include "moe/executor.h"
#include "speed/memory_bandwidth.h"
#include "speed/model_speed.h"
#include "synth/synth.h"

namespace essaim {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Options {
  std::vector<std::string> models;
  SynthArch arch = SynthArch::QWEN3MOE;  // of the synth models
  std::string data_dir = "bench-data";
  std::vector<uint32_t> layers = {2, 4};
  bool skip_122b = false;
  int prompt = 64;
  int decode = 32;
  int reps = 3;
  int threads = 0;
  int64_t stream_mb = 1024;
};

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// STREAM-like copy and read bandwidth (speed/memory_bandwidth.h), as the JSON section this bench prints.
json memory_bandwidth(int64_t bytes, int reps, ThreadPool* pool) {
  const Bandwidth bw = measure_bandwidth({.bytes = bytes, .reps = reps, .copy = true}, pool);
  return json{{"buffer_bytes", bw.buffer_bytes}, {"threads", bw.threads},
              {"copy_gb_per_s", bw.copy_gb_per_s}, {"read_gb_per_s", bw.read_gb_per_s}};
}

// Writes a synth model unless it is already there (synth is deterministic: same options, same bytes).
std::string ensure_synth(const Options& o, SynthPreset preset, uint32_t layers) {
  const std::string name = std::string(synth_arch_name(o.arch)) + "-" + std::string(synth_preset_name(preset)) + "-" +
                           std::to_string(layers) + "l-q4_k_m.gguf";
  const std::string path = o.data_dir + "/" + name;
  if (std::filesystem::exists(path)) return path;
  std::filesystem::create_directories(o.data_dir);
  Result<SynthPlan> plan = synth_plan({.arch = o.arch, .preset = preset, .layers = layers,
                                       .types = SynthTypeMix::Q4_K_M, .seed = 1});
  if (!plan) throw std::runtime_error(plan.status().message());
  std::fprintf(stderr, "model_bench: writing %s\n", path.c_str());
  Result<SynthSummary> s = synth_write(*plan, path + ".part");
  if (!s) throw std::runtime_error(s.status().message());
  std::filesystem::rename(path + ".part", path);
  return path;
}

json bench_model(const std::string& path, const Options& o, ThreadPool& pool, double copy_bw, double read_bw) {
  const auto t_load = Clock::now();
  Result<std::unique_ptr<Model>> loaded = load_model(path);
  const double load_s = since(t_load);
  if (!loaded) throw std::runtime_error(loaded.status().message());
  const Model& m = **loaded;
  const ModelInfo& info = m.info();
  LocalExpertExecutor experts(m.expert_store(), &pool);

  std::mt19937 rng(1);
  std::uniform_int_distribution<int32_t> pick(0, info.n_vocab - 1);
  std::vector<int32_t> prompt(static_cast<size_t>(o.prompt));
  for (int32_t& t : prompt) t = pick(rng);
  std::vector<float> logits(size_t(info.n_vocab));

  touch_model_pages(m);  // so the timings see RAM, not the disk

  std::vector<double> prefill_s, decode_s;
  for (int r = 0; r < o.reps + 1; ++r) {  // the first repetition warms up and is not counted
    SequenceCache cache = m.new_cache({.n_ctx = o.prompt + o.decode + 1});
    auto t0 = Clock::now();
    Status s = m.forward({.tokens = prompt, .cache = &cache, .experts = &experts, .pool = &pool,
                          .logits_mode = LogitsMode::LAST, .logits = logits});
    if (!s) throw std::runtime_error(s.message());
    if (r > 0) prefill_s.push_back(since(t0));
    for (int i = 0; i < o.decode; ++i) {
      const int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
      t0 = Clock::now();
      s = m.forward({.tokens = std::span<const int32_t>(&next, 1), .cache = &cache, .experts = &experts,
                     .pool = &pool, .logits_mode = LogitsMode::LAST, .logits = logits});
      if (!s) throw std::runtime_error(s.message());
      if (r > 0) decode_s.push_back(since(t0));
    }
  }
  const double prefill_tps = double(o.prompt) / median(prefill_s);
  const double decode_tps = 1.0 / median(decode_s);
  const double bytes_per_token = double(info.active_bytes_per_token);
  const double decode_gb_per_s = bytes_per_token * decode_tps / 1e9;
  return json{
      {"model", path},
      {"arch", info.arch},
      {"n_layer", info.n_layer},
      {"n_embd", info.n_embd},
      {"n_expert", info.n_expert},
      {"n_expert_used", info.n_expert_used},
      {"file_bytes", m.file().file_size()},
      {"load_ms", load_s * 1e3},
      {"prompt_tokens", o.prompt},
      {"prefill_tokens_per_s", prefill_tps},
      {"decode_tokens", o.decode},
      {"decode_tokens_per_s", decode_tps},
      {"decode_ms_per_token", 1e3 / decode_tps},
      {"bytes_per_decoded_token", info.active_bytes_per_token},
      {"decode_weight_gb_per_s", decode_gb_per_s},
      {"fraction_of_copy_bandwidth", decode_gb_per_s / copy_bw},
      {"fraction_of_read_bandwidth", decode_gb_per_s / read_bw},
  };
}

int run(const Options& o) {
  ThreadPool pool(size_t(o.threads > 0 ? o.threads : 0));
  json doc;
  doc["benchmark"] = "model";
  doc["cpu"] = cpu_model_name();
  doc["threads"] = pool.size();
  doc["reps"] = o.reps;
  doc["memory_bandwidth"] = memory_bandwidth(o.stream_mb << 20, 5, &pool);
  const double copy_bw = doc["memory_bandwidth"]["copy_gb_per_s"].get<double>();
  const double read_bw = doc["memory_bandwidth"]["read_gb_per_s"].get<double>();

  std::vector<std::string> models = o.models;
  if (models.empty()) {
    models.push_back(ensure_synth(o, SynthPreset::TINY, 2));
    if (!o.skip_122b)
      for (uint32_t l : o.layers) models.push_back(ensure_synth(o, SynthPreset::Q35_122B, l));
  }
  doc["models"] = json::array();
  for (const std::string& path : models) {
    json r = bench_model(path, o, pool, copy_bw, read_bw);
    std::fprintf(stderr, "%-60s load %7.1f ms  prefill %8.2f tok/s  decode %7.2f tok/s  %7.1f MB/token  %4.0f%% of copy bw\n",
                 path.c_str(), r["load_ms"].get<double>(), r["prefill_tokens_per_s"].get<double>(),
                 r["decode_tokens_per_s"].get<double>(), r["bytes_per_decoded_token"].get<double>() / 1e6,
                 100 * r["fraction_of_copy_bandwidth"].get<double>());
    doc["models"].push_back(std::move(r));
  }
  std::printf("%s\n", doc.dump(2).c_str());
  return 0;
}

}  // namespace
}  // namespace essaim

int main(int argc, char** argv) {
  essaim::Options o;
  CLI::App app{"essaim model benchmark: load, prefill and decode tokens/s, bytes per token, % of bandwidth"};
  app.add_option("--model", o.models, "GGUF file(s) to measure instead of the synth models");
  app.add_option("--arch", o.arch, "Architecture of the synth models: qwen3moe (default) or qwen35moe")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, essaim::SynthArch>{{"qwen3moe", essaim::SynthArch::QWEN3MOE},
                                                   {"qwen35moe", essaim::SynthArch::QWEN35MOE}}));
  app.add_option("--data-dir", o.data_dir, "Where the synth models are written once (default ./bench-data)");
  app.add_option("--layers", o.layers, "Layer counts of the 122B-shaped models (default 2 4)");
  app.add_flag("--skip-122b", o.skip_122b, "Only the tiny model");
  app.add_option("--prompt", o.prompt, "Prompt tokens for prefill (default 64)")->check(CLI::Range(1, 4096));
  app.add_option("--decode", o.decode, "Decoded tokens per repetition (default 32)")->check(CLI::Range(1, 4096));
  app.add_option("--reps", o.reps, "Timed repetitions (default 3; one more warms up)")->check(CLI::Range(1, 100));
  app.add_option("--threads", o.threads, "Threads (default: all cores)");
  app.add_option("--stream-mb", o.stream_mb, "Bandwidth buffer size in MiB (default 1024)")->check(CLI::Range(16, 1 << 16));
  CLI11_PARSE(app, argc, argv);
  try {
    return essaim::run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "model_bench: %s\n", e.what());
    return 1;
  }
}
