// `essaim eval -m FILE (--tokens 1,2,3 | -p TEXT) --logits-out FILE.npy [-b N] [-t N] [--json]
//  [--worker HOST:PORT]... [--expert-map FILE] [--worker-timeout-ms MS] [--require-workers]`:
// teacher-forced logits of every position, written as float32 .npy [n_tokens, n_vocab] — the format the
// llama.cpp reference fixtures and other tools compare with.
//
//   essaim eval -m tiny.gguf --tokens 151,7,42 --logits-out /tmp/l.npy
//   essaim eval -m tiny.gguf -p "Hello" --batch 4 --logits-out /tmp/l.npy     # same logits, 4-token chunks
//
// The prompt is evaluated in chunks of --batch tokens (default: all at once); the result does not depend
// on the chunking nor on --threads (docs/invariants.md invariant 2), nor on which workers computed the experts
// (invariant 1: `essaim npy-diff` of a monolithic and a sharded run shows max |Δ| = 0).
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/dispatch_flags.h"
#include "cli/file_digest.h"
#include "cli/model_load.h"
#include "core/npy.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "moe/executor.h"
#include "text/tokenizer.h"

namespace essaim::cli {
namespace {

struct EvalArgs {
  ModelLoadFlags load;
  std::string model;  // the path loaded (either source), for messages
  std::string tokens;
  std::string prompt;
  std::string logits_out;
  int32_t batch = 0;
  int32_t threads = 0;
  bool json = false;
  backbone::SwarmSetup swarm;
};

Result<std::vector<int32_t>> parse_token_list(const std::string& s) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    const std::string item = s.substr(i, j - i);
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v < 0 || v > INT32_MAX)
      return Status::error("--tokens: '" + item + "' is not a token id");
    ids.push_back(int32_t(v));
    i = j + 1;
  }
  if (ids.empty()) return Status::error("--tokens: no token ids");
  return ids;
}

Status run_eval(const EvalArgs& a) {
  using clock = std::chrono::steady_clock;
  const auto t_load = clock::now();
  keep_freed_memory_for_reuse();
  ESSAIM_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, load_model_for_cli(a.load));
  const double load_s = std::chrono::duration<double>(clock::now() - t_load).count();

  std::vector<int32_t> ids;
  if (!a.tokens.empty()) {
    ESSAIM_ASSIGN_OR_RETURN(ids, parse_token_list(a.tokens));
  } else {
    // Tokenizer errors name the file: the vocabulary is the model file's metadata.
    Result<Vocab> vocab = vocab_from_gguf(model->file());
    if (!vocab) return vocab.status().with_context(a.model);
    Result<Tokenizer> tok = Tokenizer::create(std::move(*vocab));
    if (!tok) return tok.status().with_context(a.model);
    ids = tok->encode(a.prompt, /*parse_special=*/true);
    if (ids.empty()) return Status::error("the prompt encodes to no tokens");
  }

  ThreadPool pool(size_t(a.threads > 0 ? a.threads : 0));
  ESSAIM_ASSIGN_OR_RETURN(backbone::ExecutorChoice chosen,
                          backbone::make_expert_executor(*model, &pool, a.swarm, "essaim eval"));
  ExpertExecutor& experts = *chosen.executor;
  SequenceCache cache = model->new_cache({.kv_type = a.load.kv(),
                                          .n_ctx = std::max<int32_t>(int32_t(ids.size()), 1)});
  const size_t V = size_t(model->info().n_vocab);
  std::vector<float> logits(ids.size() * V);  // [n_tokens][n_vocab]
  const size_t chunk = a.batch > 0 ? size_t(a.batch) : ids.size();
  const auto t0 = clock::now();
  for (size_t b = 0; b < ids.size(); b += chunk) {
    const size_t n = std::min(chunk, ids.size() - b);
    ESSAIM_RETURN_IF_ERROR(model->forward({.tokens = std::span<const int32_t>(ids).subspan(b, n),
                                           .cache = &cache, .experts = &experts, .pool = &pool,
                                           .logits_mode = LogitsMode::ALL,
                                           .logits = std::span<float>(logits).subspan(b * V, n * V)}));
  }
  const double eval_s = std::chrono::duration<double>(clock::now() - t0).count();
  ESSAIM_RETURN_IF_ERROR(npy_write_f32(a.logits_out, {int64_t(ids.size()), int64_t(V)}, logits));
  std::fprintf(stderr, "essaim eval: %s (%s), %zu tokens, load %.3f s, eval %.3f s (%.1f tok/s), %zu thread%s\n",
               a.model.c_str(), model->info().arch.c_str(), ids.size(), load_s, eval_s,
               double(ids.size()) / eval_s, pool.size(), pool.size() == 1 ? "" : "s");
  std::fprintf(stderr, "essaim eval: wrote %s [%zu, %zu] float32\n", a.logits_out.c_str(), ids.size(), V);
  backbone::print_dispatch_stats(chosen, "essaim eval");
  if (a.load.source.is_backbone()) print_backbone_memory(*model, "essaim eval");
  if (a.json) {
    ESSAIM_ASSIGN_OR_RETURN(nlohmann::json logits_file, file_summary_json(a.logits_out));
    nlohmann::json j{{"command", "eval"},
                     {"model", a.model},
                     {"arch", model->info().arch},
                     {"threads", pool.size()},
                     {"load_s", load_s},
                     {"n_tokens", ids.size()},
                     {"n_vocab", V},
                     {"eval_s", eval_s},
                     {"eval_tok_s", eval_s > 0 ? double(ids.size()) / eval_s : 0.0},
                     {"files", nlohmann::json::array({logits_file})},
                     {"dispatch", chosen.dispatching() ? nlohmann::json::parse(backbone::labelled_stats(chosen).to_json())
                                                           : nlohmann::json(nullptr)}};
    std::fputs((j.dump() + "\n").c_str(), stdout);
    if (std::fflush(stdout) != 0) return Status::error("cannot write the output");
  }
  return Status::ok();
}

}  // namespace

void register_eval(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<EvalArgs>();
  CLI::App* cmd = app.add_subcommand("eval", "Teacher-forced logits of every position, written as .npy");
  add_model_load_flags(*cmd, args->load);
  auto* tokens = cmd->add_option("--tokens", args->tokens, "Comma-separated token ids");
  auto* prompt = cmd->add_option("-p,--prompt", args->prompt, "Text to tokenize and evaluate");
  tokens->excludes(prompt);
  cmd->add_option("--logits-out", args->logits_out, "Output .npy file (float32 [n_tokens, n_vocab])")->required();
  add_batch_flag(*cmd, args->batch, "Evaluate in chunks of N tokens (default: all at once)");
  add_threads_flag(*cmd, args->threads);
  add_json_flag(*cmd, args->json);
  add_dispatch_flags(*cmd, args->swarm);
  cmd->callback([args, &exit_code, tokens, prompt] {
    if (tokens->count() == 0 && prompt->count() == 0) throw UsageError("give --tokens or -p");
    check_model_source(args->load.source, args->swarm);
    args->model = args->load.source.path();
    Status s = run_eval(*args);
    if (!s) {
      std::fprintf(stderr, "essaim eval: %s\n", s.message().c_str());
      exit_code = kExitFailure;
      return;
    }
    exit_code = kExitOk;
  });
}

}  // namespace essaim::cli
