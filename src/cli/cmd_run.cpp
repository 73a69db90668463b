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
#include <functional>
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
#include "text/chat_template.h"
#include "text/sampler.h"
#include "text/tokenizer.h"

namespace essaim::cli {
namespace {

struct RunArgs {
  ModelLoadFlags load;
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
  bool json = false;
  backbone::SwarmSetup swarm;
  SpecFlags spec;
};

Result<backbone::ExecutorChoice> make_executor(const Model& model, ThreadPool* pool, const backbone::SwarmSetup& swarm) {
  return backbone::make_expert_executor(model, pool, swarm, "essaim run");
}

// What a generation gave, for the summary and --json.
struct Generation {
  double prompt_s = 0;
  double generation_s = 0;
  int32_t n_gen = 0;
  std::vector<TokenId> ids;
  std::string text;
  int32_t n_ctx = 0;
  std::optional<SpecStats> spec;  // with --draft-max
};



using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Plain decoding: the prompt batched in chunks (only the last chunk's last row gives logits), then one token
// per forward, each handed to on_token until it says stop or the context is full.
Status generate_plain(const Model& model, ExpertExecutor* experts, ThreadPool& pool, const CacheOptions& cache_options,
                      std::span<const TokenId> prompt, size_t chunk, Sampler& sampler,
                      const std::function<bool(TokenId)>& on_token, Generation& g) {
  SequenceCache cache = model.new_cache(cache_options);
  g.n_ctx = cache.n_ctx();
  std::vector<float> logits(size_t(model.info().n_vocab));
  const auto t0 = Clock::now();
  for (size_t b = 0; b < prompt.size(); b += chunk) {
    const size_t n = std::min(chunk, prompt.size() - b);
    const bool last = b + n == prompt.size();
    ESSAIM_RETURN_IF_ERROR(model.forward({.tokens = prompt.subspan(b, n), .cache = &cache, .experts = experts,
                                          .pool = &pool, .logits_mode = last ? LogitsMode::LAST : LogitsMode::NONE,
                                          .logits = last ? std::span<float>(logits) : std::span<float>()}));
  }
  g.prompt_s = seconds_since(t0);
  const auto t1 = Clock::now();
  for (;;) {
    const TokenId id = sampler.sample(logits);
    sampler.accept(id);
    if (!on_token(id) || cache.n_past() >= cache.n_ctx()) break;
    ESSAIM_RETURN_IF_ERROR(model.forward({.tokens = std::span<const TokenId>(&id, 1), .cache = &cache,
                                          .experts = experts, .pool = &pool,
                                          .logits_mode = LogitsMode::LAST, .logits = logits}));
  }
  g.generation_s = seconds_since(t1);
  return Status::ok();
}

// Speculative decoding (cmd_run_spec.h): the MTP block's experts on this process when it holds them
// (--draft-experts backbone), else through the swarm's executor.
Status generate_speculative(const RunArgs& a, const Model& model, const backbone::ExecutorChoice& chosen, ThreadPool& pool,
                            const CacheOptions& cache_options, std::span<const TokenId> prompt, size_t chunk,
                            Sampler& sampler, const std::function<bool(TokenId)>& on_token, Generation& g) {
  std::unique_ptr<LocalExpertExecutor> draft_local;
  if (chosen.dispatching() && a.spec.drafts_on_backbone(model))
    draft_local = std::make_unique<LocalExpertExecutor>(model.expert_store(), &pool);
  ESSAIM_ASSIGN_OR_RETURN(const SpecRunResult r,
                          run_speculative({.model = &model, .experts = chosen.executor.get(),
                                           .draft_experts = draft_local.get(), .pool = &pool,
                                           .cache = cache_options, .spec = a.spec.options(a.spec.draft_min > 0),
                                           .prompt = prompt,
                                           .chunk = chunk, .on_token = on_token},
                                          sampler));
  g.prompt_s = r.prompt_s, g.generation_s = r.generation_s, g.spec = r.stats, g.n_ctx = r.n_ctx;
  return Status::ok();
}

void print_summary(const RunArgs& a, const Model& model, const backbone::ExecutorChoice& chosen, const ThreadPool& pool,
                   double load_s, uint32_t seed, size_t n_prompt, const Generation& g) {
  std::fprintf(stderr, "\nessaim run: %s (%s), load %.3f s, seed %u, %zu thread%s\n", a.model.c_str(),
               model.info().arch.c_str(), load_s, seed, pool.size(), pool.size() == 1 ? "" : "s");
  std::fprintf(stderr, "essaim run: prompt %zu tokens in %.3f s (%.2f tok/s)\n", n_prompt, g.prompt_s,
               double(n_prompt) / g.prompt_s);
  std::fprintf(stderr, "essaim run: generation %d tokens in %.3f s (%.2f tok/s)\n", g.n_gen, g.generation_s,
               g.generation_s > 0 ? double(g.n_gen) / g.generation_s : 0.0);
  if (g.spec)
    std::fprintf(stderr, "essaim run: speculative (mtp, K %d): %lld steps, %lld drafted, %lld accepted (%.1f %%), "
                 "%.2f tokens per step\n", a.spec.draft_max, (long long)g.spec->rounds, (long long)g.spec->drafted,
                 (long long)g.spec->accepted,
                 g.spec->drafted ? 100.0 * double(g.spec->accepted) / double(g.spec->drafted) : 0.0,
                 g.spec->rounds ? double(g.spec->tokens) / double(g.spec->rounds) : 0.0);
  backbone::print_dispatch_stats(chosen, "essaim run");
  if (chosen.dispatching() && g.n_gen > 0) {
    const uint64_t calls = backbone::labelled_stats(chosen).layer_calls;
    std::fprintf(stderr, "essaim run: %llu layer calls for %d tokens (prompt included): %.2f per generated token\n",
                 (unsigned long long)calls, g.n_gen, double(calls) / double(g.n_gen));
  }
  if (a.load.source.is_backbone()) print_backbone_memory(model, "essaim run");
}

Status print_json(const RunArgs& a, const Model& model, const backbone::ExecutorChoice& chosen, const ThreadPool& pool,
                  double load_s, uint32_t seed, int32_t n_ctx, size_t chunk, size_t n_prompt, const Generation& g) {
  const nlohmann::json spec = g.spec ? nlohmann::json{{"drafter", a.spec.drafter}, {"draft_max", a.spec.draft_max},
                                                      {"steps", g.spec->rounds}, {"drafted", g.spec->drafted},
                                                      {"accepted", g.spec->accepted}}
                                     : nlohmann::json(nullptr);
  nlohmann::json j{{"command", "run"},
                   {"model", a.model},
                   {"arch", model.info().arch},
                   {"seed", seed},
                   {"threads", pool.size()},
                   {"n_ctx", n_ctx},
                   {"batch", chunk},
                   {"sampling", {{"temp", a.sampling.temperature}, {"top_k", a.sampling.top_k},
                                 {"top_p", a.sampling.top_p}, {"min_p", a.sampling.min_p},
                                 {"repeat_penalty", a.sampling.repeat_penalty},
                                 {"repeat_last_n", a.sampling.repeat_last_n}}},
                   {"load_s", load_s},
                   {"prompt_tokens", n_prompt},
                   {"prompt_s", g.prompt_s},
                   {"prompt_tok_s", g.prompt_s > 0 ? double(n_prompt) / g.prompt_s : 0.0},
                   {"generated_tokens", g.n_gen},
                   {"generation_s", g.generation_s},
                   {"generation_tok_s", g.generation_s > 0 ? double(g.n_gen) / g.generation_s : 0.0},
                   {"tokens", g.ids},
                   {"text", g.text},
                   {"files", nlohmann::json::array()},
                   {"speculative", spec},
                   {"dispatch", chosen.dispatching() ? nlohmann::json::parse(backbone::labelled_stats(chosen).to_json())
                                                         : nlohmann::json(nullptr)}};
  std::fputs((j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n").c_str(), stdout);
  if (std::fflush(stdout) != 0) return Status::error("cannot write the output");
  return Status::ok();
}

// -p as it is, or with --chat the model's own chat template (docs/serve.md: the Jinja engine serve uses) around
// a system message (--system) and the user's prompt; --no-think renders it with enable_thinking false.
Result<std::string> prompt_text(const RunArgs& a, const std::string& chat_template, const Tokenizer& tok) {
  if (!a.chat) return a.prompt;
  ESSAIM_ASSIGN_OR_RETURN(ChatTemplate tmpl, ChatTemplate::create(chat_template, tok));
  ChatTemplateInput input;
  if (!a.system.empty()) input.messages.push_back({{"role", "system"}, {"content", a.system}});
  input.messages.push_back({{"role", "user"}, {"content", a.prompt}});
  if (a.no_think) input.kwargs["enable_thinking"] = false;
  return tmpl.render(input);
}

Status run_generate(const RunArgs& a) {
  const auto t_load = Clock::now();
  keep_freed_memory_for_reuse();
  ESSAIM_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, load_model_for_cli(a.load));
  const double load_s = seconds_since(t_load);
  ESSAIM_ASSIGN_OR_RETURN(Vocab vocab, vocab_from_gguf(model->file()));
  const std::string chat_template = vocab.chat_template;
  ESSAIM_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::create(std::move(vocab)));

  ESSAIM_ASSIGN_OR_RETURN(const std::string text, prompt_text(a, chat_template, tok));
  const std::vector<TokenId> prompt = tok.encode(text, /*parse_special=*/true);
  if (prompt.empty()) return Status::error("the prompt encodes to no tokens");

  ThreadPool pool(size_t(a.threads > 0 ? a.threads : 0));
  ESSAIM_ASSIGN_OR_RETURN(backbone::ExecutorChoice chosen, make_executor(*model, &pool, a.swarm));
  const CacheOptions cache{.kv_type = a.load.kv(), .n_ctx = a.n_ctx};
  // The context size, from a cache that allocates nothing (speculative decoding makes its own caches).
  const int32_t n_ctx = model->new_nextn_cache(cache).n_ctx();
  if (int64_t(prompt.size()) >= n_ctx)
    return Status::error("the prompt (" + std::to_string(prompt.size()) + " tokens) does not fit the context (" +
                         std::to_string(n_ctx) + ")");
  Sampler sampler(a.sampling);
  for (TokenId id : prompt) sampler.accept(id);

  const bool stream = !a.json;
  if (stream && !a.chat) std::fputs(text.c_str(), stdout);
  std::fflush(stdout);
  // Each sampled token: counted, printed as whole characters complete; false once generation ends.
  Generation g;
  Detokenizer out(tok);
  const auto emit = [&](const std::string& piece) {
    g.text += piece;
    if (stream) {
      std::fputs(piece.c_str(), stdout);
      std::fflush(stdout);
    }
  };
  const auto on_token = [&](TokenId id) {
    if (g.n_gen >= a.n_predict) return false;
    ++g.n_gen;
    g.ids.push_back(id);
    if (tok.is_eog(id)) return false;
    emit(out.push(id));
    return g.n_gen < a.n_predict;
  };
  const size_t chunk = a.batch > 0 ? size_t(a.batch) : prompt.size();
  if (a.spec.enabled())
    ESSAIM_RETURN_IF_ERROR(generate_speculative(a, *model, chosen, pool, cache, prompt, chunk, sampler, on_token, g));
  else
    ESSAIM_RETURN_IF_ERROR(
        generate_plain(*model, chosen.executor.get(), pool, cache, prompt, chunk, sampler, on_token, g));
  emit(out.flush());
  if (stream) std::fputs("\n", stdout);
  std::fflush(stdout);

  print_summary(a, *model, chosen, pool, load_s, sampler.seed(), prompt.size(), g);
  if (a.json) return print_json(a, *model, chosen, pool, load_s, sampler.seed(), g.n_ctx, chunk, prompt.size(), g);
  return Status::ok();
}

}  // namespace

void register_run(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<RunArgs>();
  CLI::App* cmd = app.add_subcommand("run", "Generate text from a prompt, streaming it");
  add_model_load_flags(*cmd, a->load);
  cmd->add_option("-p,--prompt", a->prompt, "Prompt text (the user message with --chat)")->required();
  cmd->add_option("-n,--n-predict", a->n_predict, "Tokens to generate (default 128)")->check(kNonNegative);
  add_sampling_flags(*cmd, a->sampling);
  cmd->add_flag("--chat", a->chat, "Wrap the prompt in the model's chat template");
  cmd->add_option("--system", a->system, "System message (with --chat)");
  cmd->add_flag("--no-think", a->no_think, "Chat: disable the thinking block");
  add_threads_flag(*cmd, a->threads);
  add_batch_flag(*cmd, a->batch, "Prompt chunk size (default: whole prompt)");
  add_ctx_flag(*cmd, a->n_ctx, "Context size (default: the model's, at most 8192)");
  add_json_flag(*cmd, a->json);
  add_dispatch_flags(*cmd, a->swarm);
  add_spec_flags(*cmd, a->spec);
  cmd->callback([a, &exit_code] {
    check_model_source(a->load.source, a->swarm);
    a->model = a->load.source.path();
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
