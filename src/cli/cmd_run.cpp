// `essaim run -m FILE -p TEXT [-n N] [--temp T] [--top-k K] [--top-p P] [--min-p P] [--repeat-penalty R]
//  [-s SEED] [--chat] [-t N] [-c N] [-b N] [--mlock] [--json] [--worker HOST:PORT]... [--expert-map FILE]
//  [--worker-timeout-ms MS] [--require-workers] [--draft-max K [--draft-min N] [--spec mtp]]`: generate text, streaming it to stdout, and end with the
// prompt and generation speeds (and, with workers, the dispatch summary) on stderr. With --json nothing is
// streamed: stdout gets one JSON document (fields: docs/cli.md).
//
//   essaim run -m tiny.gguf -p "Once upon a time" -n 32 --temp 0          # greedy
//   essaim run -m tiny.gguf -p "Hi!" --chat --seed 7
//
// The prompt is processed in one batched forward pass (or chunks of --batch tokens), then one token per
// step. Every routed expert goes through the ExpertExecutor built in make_executor: the local replica, or
// the swarm's dispatcher when workers are given (cli/dispatch_flags.h, docs/dispatch.md). With --draft-max K
// the model's MTP block drafts K tokens per step and one forward verifies them (cmd_run_spec.h,
// docs/speculative.md): the same stream in fewer forwards.
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/cmd_run_spec.h"
#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/dispatch_flags.h"
#include "cli/model_load.h"
#include "cli/sampling_flags.h"
#include "cli/spec_flags.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "moe/executor.h"
#include "text/chat.h"
#include "text/sampler.h"
#include "text/tokenizer.h"

namespace essaim::cli {
namespace {

struct RunArgs {
  ModelSource source;
  std::string model;  // the path loaded (either source), for messages
  std::string prompt;
  std::string system;
  int32_t n_predict = 128;
  SamplerParams sampling;
  bool chat = false;
  bool no_think = false;
  int32_t threads = 0;
  int32_t batch = 0;
  int32_t n_ctx = 0;
  std::string kv_type = "f16";
  bool mlock = false;
  bool no_mmap = false;
  bool keep_page_cache = false;
  bool json = false;
  DispatchFlags swarm;
  SpecFlags spec;
};

Result<ExecutorChoice> make_executor(const Model& model, ThreadPool* pool, const DispatchFlags& swarm) {
  return make_expert_executor(model, pool, swarm, "essaim run");
}

Status run_generate(const RunArgs& a) {
  using clock = std::chrono::steady_clock;
  const auto t_load = clock::now();
  keep_freed_memory_for_reuse();
  ESSAIM_ASSIGN_OR_RETURN(
      std::unique_ptr<Model> model,
      load_model_for_cli(a.model, {.mlock = a.mlock, .no_mmap = a.no_mmap, .backbone_file = a.source.is_backbone()},
                         a.keep_page_cache));
  const double load_s = std::chrono::duration<double>(clock::now() - t_load).count();
  ESSAIM_ASSIGN_OR_RETURN(Vocab vocab, vocab_from_gguf(model->file()));
  const std::string chat_template = vocab.chat_template;
  ESSAIM_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::create(std::move(vocab)));
  if (a.kv_type != "f16" && a.kv_type != "f32") return Status::error("--kv-type must be f16 or f32");

  std::string text = a.prompt;
  if (a.chat) {
    ESSAIM_ASSIGN_OR_RETURN(ChatFormat fmt, chat_format_for(model->info().arch, chat_template));
    std::vector<ChatMessage> messages;
    if (!a.system.empty()) messages.push_back({"system", a.system});
    messages.push_back({"user", a.prompt});
    text = chat_render(fmt, messages, {.add_generation_prompt = true, .enable_thinking = !a.no_think});
  }
  const std::vector<TokenId> prompt = tok.encode(text, /*parse_special=*/true);
  if (prompt.empty()) return Status::error("the prompt encodes to no tokens");

  ThreadPool pool(size_t(a.threads > 0 ? a.threads : 0));
  ESSAIM_ASSIGN_OR_RETURN(ExecutorChoice chosen, make_executor(*model, &pool, a.swarm));
  ExpertExecutor* const experts = chosen.executor.get();
  SequenceCache cache = model->new_cache({.kv_type = a.kv_type == "f32" ? KvType::F32 : KvType::F16, .n_ctx = a.n_ctx});
  if (int64_t(prompt.size()) >= cache.n_ctx())
    return Status::error("the prompt (" + std::to_string(prompt.size()) + " tokens) does not fit the context (" +
                         std::to_string(cache.n_ctx()) + ")");
  Sampler sampler(a.sampling);
  for (TokenId id : prompt) sampler.accept(id);
  std::vector<float> logits(size_t(model->info().n_vocab));

  const bool stream = !a.json;
  if (stream && !a.chat) std::fputs(text.c_str(), stdout);
  std::fflush(stdout);
  // Generation: print whole characters as they complete.
  Detokenizer out(tok);
  std::string generated;
  std::vector<TokenId> generated_ids;
  const auto emit = [&](const std::string& piece) {
    generated += piece;
    if (stream) {
      std::fputs(piece.c_str(), stdout);
      std::fflush(stdout);
    }
  };
  int32_t n_gen = 0;
  // Prompt: batched, chunks of --batch; only the last chunk produces logits (of its last row).
  const size_t chunk = a.batch > 0 ? size_t(a.batch) : prompt.size();
  double prompt_s = 0, gen_s = 0;
  std::optional<SpecStats> spec_stats;
  const auto t0 = clock::now();
  if (a.spec.enabled()) {
    std::unique_ptr<LocalExpertExecutor> draft_local;  // the MTP block's experts here (--draft-experts backbone)
    if (chosen.dispatching() && a.spec.drafts_on_backbone(*model))
      draft_local = std::make_unique<LocalExpertExecutor>(model->expert_store(), &pool);
    const auto on_token = [&](TokenId id) {
      if (n_gen >= a.n_predict) return false;
      ++n_gen;
      generated_ids.push_back(id);
      if (tok.is_eog(id)) return false;
      emit(out.push(id));
      return n_gen < a.n_predict;
    };
    ESSAIM_ASSIGN_OR_RETURN(const SpecRunResult r,
                            run_speculative({.model = model.get(), .experts = experts,
                                             .draft_experts = draft_local.get(), .pool = &pool,
                                             .cache = {.kv_type = a.kv_type == "f32" ? KvType::F32 : KvType::F16,
                                                       .n_ctx = a.n_ctx},
                                             .spec = a.spec.options(a.spec.draft_min > 0), .prompt = prompt,
                                             .chunk = chunk, .on_token = on_token},
                                            sampler));
    prompt_s = r.prompt_s, gen_s = r.generation_s, spec_stats = r.stats;
  }
  for (size_t b = 0; b < prompt.size() && !spec_stats; b += chunk) {
    const size_t n = std::min(chunk, prompt.size() - b);
    const bool last = b + n == prompt.size();
    ESSAIM_RETURN_IF_ERROR(model->forward({.tokens = std::span<const TokenId>(prompt).subspan(b, n),
                                           .cache = &cache, .experts = experts, .pool = &pool,
                                           .logits_mode = last ? LogitsMode::LAST : LogitsMode::NONE,
                                           .logits = last ? std::span<float>(logits) : std::span<float>()}));
  }
  if (!spec_stats) prompt_s = std::chrono::duration<double>(clock::now() - t0).count();

  // Plain generation: sample, feed the token back.
  const auto t1 = clock::now();
  while (!spec_stats && n_gen < a.n_predict) {
    const TokenId id = sampler.sample(logits);
    sampler.accept(id);
    ++n_gen;
    generated_ids.push_back(id);
    if (tok.is_eog(id)) break;
    emit(out.push(id));
    if (n_gen == a.n_predict || cache.n_past() >= cache.n_ctx()) break;
    ESSAIM_RETURN_IF_ERROR(model->forward({.tokens = std::span<const TokenId>(&id, 1), .cache = &cache,
                                           .experts = experts, .pool = &pool,
                                           .logits_mode = LogitsMode::LAST, .logits = logits}));
  }
  emit(out.flush());
  if (stream) std::fputs("\n", stdout);
  std::fflush(stdout);
  if (!spec_stats) gen_s = std::chrono::duration<double>(clock::now() - t1).count();

  std::fprintf(stderr, "\nessaim run: %s (%s), load %.3f s, seed %u, %zu thread%s\n", a.model.c_str(),
               model->info().arch.c_str(), load_s, sampler.seed(), pool.size(), pool.size() == 1 ? "" : "s");
  std::fprintf(stderr, "essaim run: prompt %zu tokens in %.3f s (%.2f tok/s)\n", prompt.size(), prompt_s,
               double(prompt.size()) / prompt_s);
  std::fprintf(stderr, "essaim run: generation %d tokens in %.3f s (%.2f tok/s)\n", n_gen, gen_s,
               gen_s > 0 ? double(n_gen) / gen_s : 0.0);
  if (spec_stats)
    std::fprintf(stderr, "essaim run: speculative (mtp, K %d): %lld steps, %lld drafted, %lld accepted (%.1f %%), "
                 "%.2f tokens per step\n", a.spec.draft_max, (long long)spec_stats->rounds,
                 (long long)spec_stats->drafted, (long long)spec_stats->accepted,
                 spec_stats->drafted ? 100.0 * double(spec_stats->accepted) / double(spec_stats->drafted) : 0.0,
                 spec_stats->rounds ? double(spec_stats->tokens) / double(spec_stats->rounds) : 0.0);
  print_dispatch_stats(chosen, "essaim run");
  if (chosen.dispatching() && n_gen > 0)
    std::fprintf(stderr, "essaim run: %llu layer calls for %d tokens (prompt included): %.2f per generated token\n",
                 (unsigned long long)labelled_stats(chosen).layer_calls, n_gen,
                 double(labelled_stats(chosen).layer_calls) / double(n_gen));
  if (a.source.is_backbone()) print_backbone_memory(*model, "essaim run");
  if (a.json) {
    nlohmann::json j{{"command", "run"},
                     {"model", a.model},
                     {"arch", model->info().arch},
                     {"seed", sampler.seed()},
                     {"threads", pool.size()},
                     {"n_ctx", cache.n_ctx()},
                     {"batch", chunk},
                     {"sampling", {{"temp", a.sampling.temperature}, {"top_k", a.sampling.top_k},
                                   {"top_p", a.sampling.top_p}, {"min_p", a.sampling.min_p},
                                   {"repeat_penalty", a.sampling.repeat_penalty},
                                   {"repeat_last_n", a.sampling.repeat_last_n}}},
                     {"load_s", load_s},
                     {"prompt_tokens", prompt.size()},
                     {"prompt_s", prompt_s},
                     {"prompt_tok_s", prompt_s > 0 ? double(prompt.size()) / prompt_s : 0.0},
                     {"generated_tokens", n_gen},
                     {"generation_s", gen_s},
                     {"generation_tok_s", gen_s > 0 ? double(n_gen) / gen_s : 0.0},
                     {"tokens", generated_ids},
                     {"text", generated},
                     {"files", nlohmann::json::array()},
                     {"speculative", spec_stats ? nlohmann::json{{"drafter", a.spec.drafter},
                                                                  {"draft_max", a.spec.draft_max},
                                                                  {"steps", spec_stats->rounds},
                                                                  {"drafted", spec_stats->drafted},
                                                                  {"accepted", spec_stats->accepted}}
                                                : nlohmann::json(nullptr)},
                     {"dispatch", chosen.dispatching() ? nlohmann::json::parse(labelled_stats(chosen).to_json())
                                                           : nlohmann::json(nullptr)}};
    std::fputs((j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n").c_str(), stdout);
    if (std::fflush(stdout) != 0) return Status::error("cannot write the output");
  }
  return Status::ok();
}

}  // namespace

void register_run(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<RunArgs>();
  CLI::App* cmd = app.add_subcommand("run", "Generate text from a prompt, streaming it");
  add_model_source_flags(*cmd, a->source);
  cmd->add_option("-p,--prompt", a->prompt, "Prompt text (the user message with --chat)")->required();
  cmd->add_option("-n,--n-predict", a->n_predict, "Tokens to generate (default 128)")->check(kNonNegative);
  add_sampling_flags(*cmd, a->sampling);
  cmd->add_flag("--chat", a->chat, "Wrap the prompt in the model's chat template");
  cmd->add_option("--system", a->system, "System message (with --chat)");
  cmd->add_flag("--no-think", a->no_think, "Chat: disable the thinking block");
  add_threads_flag(*cmd, a->threads);
  add_batch_flag(*cmd, a->batch, "Prompt chunk size (default: whole prompt)");
  add_ctx_flag(*cmd, a->n_ctx, "Context size (default: the model's, at most 8192)");
  cmd->add_option("--kv-type", a->kv_type, "KV cache type: f16 (default) or f32")->check(CLI::IsMember({"f16", "f32"}));
  cmd->add_flag("--mlock", a->mlock, "Read the model into RAM (progress on a terminal) and pin it there");
  add_no_mmap_flag(*cmd, a->no_mmap);
  add_keep_page_cache_flag(*cmd, a->keep_page_cache);
  add_json_flag(*cmd, a->json);
  add_dispatch_flags(*cmd, a->swarm);
  add_spec_flags(*cmd, a->spec);
  cmd->callback([a, &exit_code] {
    check_model_source(a->source, a->swarm);
    a->model = a->source.path();
    Status s = run_generate(*a);
    if (!s) {
      std::fprintf(stderr, "essaim run: %s\n", s.message().c_str());
      exit_code = kExitFailure;
      return;
    }
    exit_code = kExitOk;
  });
}

}  // namespace essaim::cli
