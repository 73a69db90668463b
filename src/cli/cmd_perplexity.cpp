// `essaim perplexity -m FILE -f TEXT [-c N] [--chunks N] [-b N] [-t N] [--kv-type f16|f32] [--router-stats]
//  [--mtp] [--json] [swarm flags]`: llama-perplexity's figure for a text (model/perplexity.h), its output form
// ("[1]a,[2]b,..." running estimates, then "Final estimate: PPL = x +/- y"), computed here or through a swarm.
//
//   essaim perplexity -m models/kjv-q4_k_m.gguf -f models/heldout.txt -c 256
//   essaim perplexity -m models/kjv-bf16.gguf -f models/heldout.txt -c 256 --router-stats --json
//
// With --router-stats the router's picks on the text are recorded and summarised per layer (expert usage
// entropy, share of the top 10 % of experts, reuse of the previous token's experts: moe/routing_stats.h).
// With --mtp the MTP block drafts from every scored position, teacher-forced, and its top-1 agreement with the
// main model's greedy next-next token and with the text is reported (model/perplexity.h DraftTally).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/dispatch_flags.h"
#include "cli/model_load.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "model/perplexity.h"
#include "moe/routing_stats.h"
#include "text/tokenizer.h"

namespace essaim::cli {
namespace {

struct PerplexityArgs {
  ModelSource source;
  std::string text_file;
  int32_t n_ctx = 512;
  int32_t max_chunks = -1;
  int32_t batch = 0;
  int32_t threads = 0;
  std::string kv_type = "f16";
  bool router_stats = false;
  bool mtp = false;
  bool json = false;
  backbone::SwarmSetup swarm;
};

Result<std::string> read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::error("cannot open " + path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

struct TextTokens {
  std::vector<int32_t> ids;
  std::optional<int32_t> bos;  // set when the vocabulary adds BOS: each chunk then starts with it
};

Result<TextTokens> tokenize_file(const Model& model, const std::string& path, const std::string& text) {
  Result<Vocab> vocab = vocab_from_gguf(model.file());
  if (!vocab) return vocab.status().with_context(path);
  TextTokens out;
  if (vocab->add_bos && vocab->bos_id) out.bos = int32_t(*vocab->bos_id);
  Result<Tokenizer> tok = Tokenizer::create(std::move(*vocab));
  if (!tok) return tok.status().with_context(path);
  out.ids = tok->encode(text, /*parse_special=*/false);
  return out;
}

nlohmann::json routing_json(const std::vector<LayerRoutingStats>& stats) {
  nlohmann::json layers = nlohmann::json::array();
  for (const LayerRoutingStats& s : stats)
    layers.push_back({{"layer", s.layer},
                      {"tokens", s.tokens},
                      {"entropy_bits", s.entropy_bits},
                      {"max_entropy_bits", s.max_entropy_bits},
                      {"top_experts", s.top_experts},
                      {"top_share", s.top_share},
                      {"reuse", s.reuse},
                      {"reuse_if_random", s.reuse_if_random},
                      {"picks", s.picks}});
  return layers;
}

void print_routing(const std::vector<LayerRoutingStats>& stats) {
  std::fprintf(stderr, "router: layer  entropy (bits, of max)  top %d%% share  reuse (random)\n", 10);
  for (const LayerRoutingStats& s : stats)
    std::fprintf(stderr, "router: %5d  %6.3f of %.3f         %6.3f (%d experts)  %.3f (%.3f)\n", s.layer,
                 s.entropy_bits, s.max_entropy_bits, s.top_share, s.top_experts, s.reuse, s.reuse_if_random);
}

double share(uint64_t k, uint64_t n) { return n ? double(k) / double(n) : 0.0; }

struct RunShape {
  size_t n_ctx = 0, chunks = 0, tokens = 0;
  double seconds = 0;
};

// The --json document (docs/cli.md).
nlohmann::json perplexity_json(const PerplexityArgs& a, const RunShape& r, const PerplexityTally& tally,
                               const DraftTally& drafts, const nlohmann::json& routing) {
  return {{"command", "perplexity"}, {"model", a.source.path()}, {"text", a.text_file},
          {"n_ctx", r.n_ctx},        {"chunks", r.chunks},        {"tokens", r.tokens},
          {"scored", tally.count},   {"ppl", tally.ppl()},        {"ppl_error", tally.ppl_error()},
          {"mean_nll", tally.count ? tally.nll / double(tally.count) : 0.0},
          {"seconds", r.seconds},    {"router", routing},
          {"mtp", a.mtp ? nlohmann::json{{"positions", drafts.count},
                                         {"agree_greedy", share(drafts.agree_greedy, drafts.count)},
                                         {"agree_text", share(drafts.agree_text, drafts.count)},
                                         {"main_top1", share(drafts.main_text, drafts.count)}}
                        : nlohmann::json(nullptr)}};
}

Status run_perplexity(const PerplexityArgs& a) {
  using clock = std::chrono::steady_clock;
  keep_freed_memory_for_reuse();
  const std::string& path = a.source.path();
  ESSAIM_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                          load_model_for_cli(path, {.backbone_file = a.source.is_backbone()}));
  ESSAIM_ASSIGN_OR_RETURN(const std::string text, read_text(a.text_file));
  ESSAIM_ASSIGN_OR_RETURN(TextTokens tokens, tokenize_file(*model, a.text_file, text));
  const std::vector<int32_t>& ids = tokens.ids;
  const size_t n_ctx = size_t(a.n_ctx);
  if (ids.size() < 2 * n_ctx)
    return Status::error(a.text_file + " has " + std::to_string(ids.size()) + " tokens; -c " +
                         std::to_string(n_ctx) + " needs at least " + std::to_string(2 * n_ctx));
  size_t n_chunks = ids.size() / n_ctx;
  if (a.max_chunks > 0) n_chunks = std::min(n_chunks, size_t(a.max_chunks));

  ThreadPool pool(size_t(a.threads > 0 ? a.threads : 0));
  ESSAIM_ASSIGN_OR_RETURN(backbone::ExecutorChoice chosen,
                          backbone::make_expert_executor(*model, &pool, a.swarm, "essaim perplexity"));
  RoutingRecorder recorder(*chosen.executor);
  ExpertExecutor& experts = a.router_stats ? static_cast<ExpertExecutor&>(recorder) : *chosen.executor;
  const size_t V = size_t(model->info().n_vocab);
  const size_t step = a.batch > 0 ? size_t(a.batch) : n_ctx;
  std::vector<float> logits(n_ctx * V);
  std::fprintf(stderr, "perplexity: calculating perplexity over %zu chunks, n_ctx=%zu, batch_size=%zu\n", n_chunks,
               n_ctx, step);
  PerplexityTally tally;
  FILE* human = a.json ? stderr : stdout;  // with --json, stdout holds the JSON document alone
  const auto t0 = clock::now();
  DraftTally drafts;
  const size_t E = size_t(model->info().n_embd);
  std::vector<float> hidden(a.mtp ? n_ctx * E : 0), draft_logits(a.mtp ? (n_ctx - 1) * V : 0);
  if (a.mtp && !model->has_nextn()) return Status::error("--mtp needs a model with an MTP (nextn) block");
  for (size_t c = 0; c < n_chunks; ++c) {
    std::vector<int32_t> chunk(ids.begin() + std::ptrdiff_t(c * n_ctx), ids.begin() + std::ptrdiff_t((c + 1) * n_ctx));
    if (tokens.bos) chunk[0] = *tokens.bos;  // as llama-perplexity: the chunk's first token becomes BOS
    SequenceCache cache = model->new_cache(
        {.kv_type = kv_type_from_flag(a.kv_type), .n_ctx = int32_t(n_ctx)});
    recorder.start_sequence();
    for (size_t b = 0; b < n_ctx; b += step) {
      const size_t n = std::min(step, n_ctx - b);
      const BatchItem item{.tokens = std::span<const int32_t>(chunk).subspan(b, n), .cache = &cache,
                           .logits_mode = LogitsMode::ALL, .logits = std::span<float>(logits).subspan(b * V, n * V),
                           .hidden = a.mtp ? std::span<float>(hidden).subspan(b * E, n * E) : std::span<float>()};
      ESSAIM_RETURN_IF_ERROR(model->forward_batch({.items = std::span(&item, 1), .experts = &experts, .pool = &pool}));
    }
    tally.add_chunk(logits, chunk, V);
    if (a.mtp) {  // the draft head over the chunk: position j from hidden j and token j+1
      SequenceCache nc = model->new_nextn_cache(
          {.kv_type = kv_type_from_flag(a.kv_type), .n_ctx = int32_t(n_ctx)});
      const NextnItem d{.hidden = std::span<const float>(hidden).subspan(0, (n_ctx - 1) * E),
                        .tokens = std::span<const int32_t>(chunk).subspan(1), .cache = &nc, .logits = draft_logits};
      ESSAIM_RETURN_IF_ERROR(model->forward_nextn_batch({.items = std::span(&d, 1), .experts = &experts, .pool = &pool}));
      drafts.add_chunk(logits, draft_logits, chunk, V);
    }
    std::fprintf(human, "[%zu]%.4f,", c + 1, tally.ppl());
    std::fflush(human);
  }
  const double seconds = std::chrono::duration<double>(clock::now() - t0).count();
  std::fprintf(human, "\nFinal estimate: PPL = %.4f +/- %.5f\n", tally.ppl(), tally.ppl_error());
  std::fflush(human);
  std::fprintf(stderr, "perplexity: %zu tokens scored in %.2f s, %zu thread%s\n", size_t(tally.count), seconds,
               pool.size(), pool.size() == 1 ? "" : "s");
  backbone::print_dispatch_stats(chosen, "essaim perplexity");
  if (a.mtp)
    std::fprintf(human, "MTP draft top-1 over %llu positions: %.4f agree with the main model's greedy next-next token, "
                 "%.4f with the text (the main model's own next-token top-1: %.4f)\n",
                 (unsigned long long)drafts.count, share(drafts.agree_greedy, drafts.count),
                 share(drafts.agree_text, drafts.count), share(drafts.main_text, drafts.count));
  nlohmann::json routing = nullptr;
  if (a.router_stats) {
    ESSAIM_ASSIGN_OR_RETURN(std::vector<LayerRoutingStats> stats,
                            routing_stats(recorder.picks(), int32_t(model->info().n_expert)));
    print_routing(stats);
    routing = routing_json(stats);
  }
  if (a.json) {
    const nlohmann::json j = perplexity_json(a, {.n_ctx = n_ctx, .chunks = n_chunks, .tokens = ids.size(),
                                                 .seconds = seconds}, tally, drafts, routing);
    std::fputs((j.dump() + "\n").c_str(), stdout);
  }
  if (std::fflush(stdout) != 0) return Status::error("cannot write the output");
  return Status::ok();
}

}  // namespace

void register_perplexity(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<PerplexityArgs>();
  CLI::App* cmd = app.add_subcommand("perplexity", "Perplexity of a text file, as llama-perplexity computes it");
  add_model_source_flags(*cmd, args->source);
  cmd->add_option("-f,--file", args->text_file, "Text file to score")->required()->check(CLI::ExistingFile);
  cmd->add_option("-c,--ctx-size", args->n_ctx, "Tokens per chunk; each chunk is scored on its second half")
      ->capture_default_str()
      ->check(CLI::Range(4, 1 << 20));
  cmd->add_option("--chunks", args->max_chunks, "Score at most N chunks (default: every whole chunk)")
      ->check(CLI::Range(1, 1 << 30));
  add_batch_flag(*cmd, args->batch, "Evaluate each chunk in pieces of N tokens (default: the whole chunk)");
  add_threads_flag(*cmd, args->threads);
  add_kv_type_flag(*cmd, args->kv_type);
  cmd->add_flag("--router-stats", args->router_stats,
                "Also summarise the router's picks per layer: usage entropy, top 10% share, reuse of the previous "
                "token's experts");
  cmd->add_flag("--mtp", args->mtp,
                "Also run the MTP draft head at every scored position: its top-1 agreement with the main model's "
                "greedy next-next token and with the text");
  add_json_flag(*cmd, args->json);
  add_dispatch_flags(*cmd, args->swarm);
  cmd->callback([args, &exit_code] {
    check_model_source(args->source, args->swarm);
    Status s = run_perplexity(*args);
    if (!s) {
      std::fprintf(stderr, "essaim perplexity: %s\n", s.message().c_str());
      exit_code = kExitFailure;
      return;
    }
    exit_code = kExitOk;
  });
}

}  // namespace essaim::cli
