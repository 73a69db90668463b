// `essaim synth`: write a synthetic GGUF model that follows llama.cpp's conventions (docs/synth.md).
//
//   essaim synth --arch qwen3moe --preset tiny --types q4_k_m --seed 1 -o tiny.gguf
//   essaim synth --arch qwen35moe --preset q35-122b --layers 4 --types q4_k_m -o q35-4l.gguf
//   essaim synth --arch qwen35moe --preset tiny --types f32 --nextn 1 --fused-gate-up -o mtp.gguf
//
// Writing shows progress on stderr when it is a terminal. Exit 2: options the plan refuses; 1: writing failed.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "core/progress.h"
#include "synth/synth.h"

namespace essaim::cli {

namespace {

struct SynthArgs {
  SynthOptions options;
  std::string arch, preset, types;
  uint32_t layers = 0;
  uint32_t experts = 0;
  std::string out;
};

void add_synth_flags(CLI::App& cmd, SynthArgs& a) {
  cmd.add_option("--arch", a.arch, "Architecture")->required()->check(CLI::IsMember({"qwen3moe", "qwen35moe"}));
  cmd.add_option("--preset", a.preset,
                 "tiny (unit tests, a few MB), small (the trained model's shapes: 8 layers, 32 experts top-8) or "
                  "q35-122b (Qwen3.5-122B-A10B per-layer shapes)")
      ->required()
      ->check(CLI::IsMember({"tiny", "small", "q35-122b"}));
  cmd.add_option("--layers", a.layers, "Executed layers (default: tiny qwen3moe 2, tiny qwen35moe 4, q35-122b 2)")
      ->check(CLI::Range(1, 512));
  cmd.add_option("--experts", a.experts, "Routed experts per layer (default: tiny 6, q35-122b 256)")
      ->check(CLI::Range(1, 1024));
  cmd.add_option("--types", a.types,
                  "Type mix: f32, bf16 or q8_0 (every weight llama.cpp converts), q4_k_m (llama-quantize's rule)")
      ->required()
      ->check(CLI::IsMember({"f32", "bf16", "q8_0", "q4_k_m"}));
  cmd.add_option("-s,--seed", a.options.seed, "Random seed; the same seed gives a byte-identical file")
      ->capture_default_str();
  cmd.add_option("--tokenizer", a.options.tokenizer_json,
                  "Hugging Face tokenizer.json to embed (default: a byte-level BPE learned from a small corpus)")
      ->check(CLI::ExistingFile);
  cmd.add_option("--router-skew", a.options.router_skew,
                  "Expert popularity skew >= 0: the most popular expert's router logit rises by about X, the "
                  "r-th by X/r (Zipf); 0 = no preferred experts")
      ->capture_default_str();
  cmd.add_option("--logits-scale", a.options.logits_scale,
                  "Standard deviation of the output logits (peaked, stable sampling)")
      ->capture_default_str();
  cmd.add_flag("--recurrent-flags", a.options.recurrent_flags,
               "qwen35moe: write attention.recurrent_layers instead of full_attention_interval");
  cmd.add_option("--nextn", a.options.nextn, "qwen35moe: append N MTP blocks (block_count includes them)")
      ->capture_default_str();
  cmd.add_flag("--fused-gate-up", a.options.fused_gate_up,
               "qwen35moe: ffn_gate_up_exps [E, 2F, X] instead of ffn_gate_exps + ffn_up_exps");
  cmd.add_option("--weights", a.options.weights_dir,
                  "Directory of DIR/<tensor name>.npy (float32, ne reversed) giving every tensor's values instead "
                  "of random ones: how the trained model of models/ is written (models/README.md)")
      ->check(CLI::ExistingDirectory);
  cmd.add_option("--name", a.options.name, "general.name (default: essaim-synth ARCH PRESET)");
  add_threads_flag(cmd, a.options.threads, "Generation threads (0 = all cores; never changes the bytes)");
  cmd.add_option("-o,--output", a.out, "Output GGUF file")->required();

}

int run_synth(const SynthArgs& a) {
  SynthOptions o = a.options;
  o.arch = a.arch == "qwen35moe" ? SynthArch::QWEN35MOE : SynthArch::QWEN3MOE;
  o.preset = a.preset == "q35-122b" ? SynthPreset::Q35_122B
             : a.preset == "small"  ? SynthPreset::SMALL
                                      : SynthPreset::TINY;
  o.types = a.types == "q4_k_m" ? SynthTypeMix::Q4_K_M
            : a.types == "q8_0" ? SynthTypeMix::Q8_0
            : a.types == "bf16" ? SynthTypeMix::BF16
                                  : SynthTypeMix::F32;
  if (a.layers > 0) o.layers = a.layers;
  if (a.experts > 0) o.experts = a.experts;
  Result<SynthPlan> plan = synth_plan(o);
  if (!plan) {
    std::fprintf(stderr, "essaim synth: %s\n", plan.status().message().c_str());
    return kExitUsage;
  }
  uint64_t data_bytes = 0;
  for (const SynthTensor& t : plan->tensors) data_bytes += t.nbytes;
  Progress progress("synth " + a.out, data_bytes);
  Result<SynthSummary> s = synth_write(*plan, a.out, &progress);
  progress.finish();
  if (!s) {
    std::fprintf(stderr, "essaim synth: %s\n", s.status().message().c_str());
    return kExitFailure;
  }
  std::printf("essaim synth: wrote %s (%s %s %s, %u blocks, vocab %u): %llu bytes, %zu tensors, %.2f s\n",
              a.out.c_str(), plan->arch->name, std::string(synth_preset_name(o.preset)).c_str(),
              std::string(synth_type_mix_name(o.types)).c_str(), plan->hp.block_count(), plan->hp.n_vocab,
              static_cast<unsigned long long>(s->file_bytes), s->n_tensors, s->seconds);
  return kExitOk;
}

}  // namespace

void register_synth(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<SynthArgs>();
  CLI::App* cmd = app.add_subcommand(
      "synth",
      "Write a synthetic GGUF model (llama.cpp's keys, tensor names, shapes, order and type mix; seeded random "
      "weights). The q35-122b preset has Qwen3.5-122B-A10B's per-layer shapes but, unless --tokenizer is given, "
      "the small synthetic vocabulary (a real 248320-token one would make token_embd and output ~760 MB each).");
  add_synth_flags(*cmd, *args);
  cmd->callback([args, &exit_code] { exit_code = run_synth(*args); });
}

}  // namespace essaim::cli
