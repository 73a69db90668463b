// `essaim serve -m FILE [--host H] [--port P] [-np/--parallel N] [-c/--ctx-size N] [-b/--batch-size N]
//  [-t/--threads N] [--api-key K] [--worker HOST:PORT]... [--expert-map FILE] [--worker-timeout-ms MS]`:
// an OpenAI-compatible HTTP server (docs/serve.md) with continuous batching over --parallel sequences.
// Flag spellings follow llama-server's.
//
//   essaim serve -m tiny.gguf --port 0                 # prints "listening on 127.0.0.1:PORT"
//   essaim serve -m big.gguf --host 0.0.0.0 --port 8080 -np 16 --worker 10.0.0.2:9000 --api-key secret
//
// The listener is up before the model is loaded: /health answers 503 until it is, then 200. SIGINT or
// SIGTERM stop the server.
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <ctime>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/dispatch_flags.h"
#include "cli/spec_flags.h"
#include "cli/model_load.h"
#include "serve/server.h"

namespace essaim::cli {
namespace {

struct ServeArgs {
  ModelSource source;
  serve::ServerOptions server;
  backbone::SwarmSetup swarm;
  SpecFlags spec;
  bool no_access_log = false;
  int64_t cache_ram_mib = 8192;  // --cache-ram
};

// llama-server flags that mean nothing here, accepted so that a llama-server command line starts essaim
// serve unchanged; each one given gets a one-line note on stderr instead of a parse error.
struct IgnoredLlamaFlag {
  const char* names;    // CLI11 spelling (the single-dash ones are rewritten by rewrite_llama_spellings)
  bool takes_value;
  const char* why;
};
constexpr IgnoredLlamaFlag kIgnoredLlamaFlags[] = {
    {"--n-gpu-layers,--gpu-layers", true, "the backbone runs on the CPU; GPUs serve experts as workers (essaim worker --cuda)"},
    {"--flash-attn", true, "attention has one exact kernel here"},
    {"--split-mode", true, "there is one device per process; experts are split across workers instead"},
    {"--main-gpu", true, "the backbone runs on the CPU"},
    {"--mlock", false, "serve maps the model (--no-mmap reads it into private memory)"},
    {"--cont-batching", false, "continuous batching is always on"},
    {"--jinja", false, "the model's own chat template is always used"},
    {"--metrics", false, "/metrics is always served"},
    {"--no-webui", false, "there is no web UI"},
};

void add_ignored_llama_flags(CLI::App& cmd, std::vector<std::pair<CLI::Option*, const char*>>& given) {
  for (const IgnoredLlamaFlag& f : kIgnoredLlamaFlags) {
    CLI::Option* o = f.takes_value ? cmd.add_option(std::string(f.names))->description("llama-server flag, accepted and ignored")
                                         ->expected(0, 1)
                                   : cmd.add_flag(std::string(f.names))->description("llama-server flag, accepted and ignored");
    o->group("llama-server compatibility");
    given.emplace_back(o, f.why);
  }
}

void note_ignored_llama_flags(const std::vector<std::pair<CLI::Option*, const char*>>& given) {
  for (const auto& [o, why] : given) {
    if (o->count() == 0) continue;
    std::string value;
    if (!o->results().empty() && !o->results().front().empty()) value = " " + o->results().front();
    std::fprintf(stderr, "essaim serve: note: %s%s is ignored: %s\n", o->get_name().c_str(), value.c_str(), why);
  }
}

// The layers whose experts no connected worker of `remote` serves, or nothing.
std::optional<std::string> coverage_holes(const Model& model, const backbone::RemoteExpertExecutor& remote) {
  const backbone::CoverageReport report = backbone::swarm_coverage(model, remote);
  std::string why;
  for (const std::string& line : report.lines) {
    if (line.rfind("layer", 0) != 0) continue;  // a worker down whose experts others serve is no hole
    why += (why.empty() ? "" : "; ") + line;
  }
  if (why.empty()) return std::nullopt;
  return why;
}

// /health's 503 reason: with no local copy of the experts (a backbone file), the layers whose experts no
// connected worker serves — of the --worker/--expert-map swarm, or of the market's current map (--coordinator;
// an empty map is a reason of its own).
std::optional<std::string> swarm_unavailable(const Model& model, const ExpertExecutor& ex) {
  if (!ex.may_fail()) return std::nullopt;
  if (const auto* market = dynamic_cast<const backbone::MarketExpertExecutor*>(&ex)) {
    return market->ask_current([&](const backbone::RemoteExpertExecutor* remote) -> std::optional<std::string> {
      if (remote == nullptr) return "the market's expert map is empty: no worker holds any expert yet";
      return coverage_holes(model, *remote);
    });
  }
  const auto* remote = dynamic_cast<const backbone::RemoteExpertExecutor*>(&ex);
  return remote == nullptr ? std::nullopt : coverage_holes(model, *remote);
}

int run_serve(ServeArgs& a) {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);  // before any thread starts: every thread inherits it

  if (!a.swarm.workers.empty() || !a.swarm.expert_map.empty() || !a.swarm.coordinator.empty() ||
      a.swarm.expert_output != "f32") {
    const backbone::SwarmSetup swarm = a.swarm;
    a.server.executor.make = [swarm](const Model& model, ThreadPool* pool) -> Result<std::unique_ptr<ExpertExecutor>> {
      ESSAIM_ASSIGN_OR_RETURN(backbone::ExecutorChoice chosen,
                              backbone::make_expert_executor(model, pool, swarm, "essaim serve"));
      return std::move(chosen.executor);
    };
    a.server.executor.stats = [](const ExpertExecutor& ex) -> std::optional<backbone::DispatchStats> {
      if (const auto* market = dynamic_cast<const backbone::MarketExpertExecutor*>(&ex)) return market->stats();
      const auto* remote = dynamic_cast<const backbone::RemoteExpertExecutor*>(&ex);
      if (remote == nullptr) return std::nullopt;
      return remote->stats();
    };
    a.server.executor.unavailable = swarm_unavailable;
  }
  keep_freed_memory_for_reuse();
  Result<std::unique_ptr<serve::Server>> server = serve::Server::start(a.server);
  if (!server) {
    std::fprintf(stderr, "essaim serve: %s\n", server.status().message().c_str());
    return 1;
  }
  // Tests and scripts wait for this line and read the port from it.
  std::printf("listening on %s:%u\n", a.server.host.c_str(), unsigned((*server)->port()));
  std::fflush(stdout);

  bool reported = false;
  for (;;) {
    const timespec tick{.tv_sec = 0, .tv_nsec = 100'000'000};
    const int sig = sigtimedwait(&stop_signals, nullptr, &tick);
    if (sig == SIGINT || sig == SIGTERM) {
      std::fprintf(stderr, "essaim serve: %s, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
      break;
    }
    if (!reported) {
      const std::optional<Status> st = (*server)->load_result();
      if (st && *st) {
        reported = true;
        const serve::Scheduler* s = (*server)->scheduler();
        std::fprintf(stderr, "essaim serve: %s ready: %d parallel, context %d per sequence, %d-token batches\n",
                     a.server.model_path.c_str(), a.server.parallel, s->n_ctx(), a.server.batch_tokens);
        if (a.source.is_backbone()) {
          const MemoryUse u = memory_use();
          std::error_code ec;
          const uintmax_t mapped = std::filesystem::file_size(a.source.path(), ec);
          std::fprintf(stderr, "essaim serve: backbone file %.1f MiB mapped, peak resident %.1f MiB\n",
                       ec ? 0.0 : double(mapped) / (1 << 20), double(u.peak_rss) / (1 << 20));
        }
      } else if (st) {
        std::fprintf(stderr, "essaim serve: %s\n", st->message().c_str());
        return 1;
      }
    }
  }
  (*server)->stop();
  return 0;
}

}  // namespace

void register_serve(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<ServeArgs>();
  serve::ServerOptions& o = a->server;
  CLI::App* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server with continuous batching");
  add_model_source_flags(*cmd, a->source);
  cmd->add_option("--host", o.host, "Address to listen on (default 127.0.0.1)");
  cmd->add_option("--port", o.port, "Port (default 8080; 0: the OS chooses)");
  cmd->add_option("--parallel", o.parallel, "Sequences in flight at once (default 4; -np also works)")->check(CLI::Range(1, 1024));
  cmd->add_option("-c,--ctx-size,--ctx", o.n_ctx, "Context per sequence (default: the model's, at most 8192)")
      ->check(kNonNegative);
  cmd->add_option("-b,--batch-size", o.batch_tokens, "Most token rows per forward step (default 512)")
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--queue", o.queue_capacity, "Requests waiting beyond --parallel before 503 (default 64)")
      ->check(CLI::Range(0, 1 << 16));
  cmd->add_option("-t,--threads", o.threads, "Compute threads (default: all cores)")->check(kNonNegative);
  cmd->add_option("--api-key", o.limits.api_key, "Require 'Authorization: Bearer KEY' (not for /health)");
  cmd->add_option("--chat-template-file", o.chat_template_file,
                  "A Jinja chat template to use instead of the model's own (llama-server's flag)");
  cmd->add_option("--reasoning-budget", o.reasoning_budget,
                  "Reasoning tokens allowed per answer: -1 unlimited (default), 0 no thinking (the template's "
                  "enable_thinking=false unless a request sets it), N: the reasoning is closed after N tokens")
      ->check(CLI::Range(-1, 1 << 30));
  cmd->add_option("-a,--alias", o.model_id, "Model id in answers and /v1/models (default: the file name)");
  add_admission_flags(*cmd, o.limits.max_connections, o.limits.max_per_address);
  cmd->add_option("--max-body-bytes", o.limits.max_body_bytes, "Largest request body (default 1 MiB; 413 beyond)")
      ->check(CLI::Range(size_t(1024), size_t(1) << 30));
  add_no_mmap_flag(*cmd, o.no_mmap);
  add_keep_page_cache_flag(*cmd, o.keep_page_cache);
  add_dispatch_flags(*cmd, a->swarm);
  add_spec_flags(*cmd, a->spec);
  cmd->add_option("--cache-ram", a->cache_ram_mib,
                  "Prompt cache in MiB (llama-server's flag; -cram also works): prefixes of earlier prompts are "
                  "resumed from exactly instead of computed again (default 8192; 0: off; -1: no limit)")
      ->check(CLI::Range(int64_t(-1), int64_t(1) << 30));
  cmd->add_flag("--no-access-log", a->no_access_log, "No per-request line (method, path, status, tokens, ms) on stderr");
  auto ignored = std::make_shared<std::vector<std::pair<CLI::Option*, const char*>>>();
  add_ignored_llama_flags(*cmd, *ignored);
  cmd->callback([a, ignored, &exit_code] {
    note_ignored_llama_flags(*ignored);
    a->server.access_log = !a->no_access_log;
    a->server.prompt_cache.budget_bytes = a->cache_ram_mib < 0 ? -1 : a->cache_ram_mib << 20;
    check_model_source(a->source, a->swarm);
    a->server.model_path = a->source.path();
    a->server.backbone_file = a->source.is_backbone();
    if (a->spec.enabled()) a->server.spec = a->spec.options(/*adaptive=*/true);
    a->server.drafts_on_backbone = a->spec.draft_experts == "backbone";
    exit_code = run_serve(*a);
  });
}

}  // namespace essaim::cli
