// `essaim serve` as an object: listens at once (so /health can say "loading"), loads the model, tokenizer and
// expert executor on a background thread, then serves the OpenAI API over the continuous-batching
// scheduler. Tests run it in-process on a port the OS chooses.
//
//   ESSAIM_ASSIGN_OR_RETURN(std::unique_ptr<Server> s, Server::start({.model_path = "tiny.gguf", .port = 0}));
//   std::printf("listening on %s:%u\n", "127.0.0.1", s->port());
//   ESSAIM_RETURN_IF_ERROR(s->wait_ready(std::chrono::seconds(60)));
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "backbone/dispatch_stats.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "moe/executor.h"
#include "net/http_limits.h"
#include "net/http_server.h"
#include "serve/openai_api.h"
#include "serve/scheduler.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace essaim::serve {

// Builds the expert executor once the model is loaded (the CLI passes the swarm dispatcher of its --worker
// flags); the second function, when set, reads the dispatcher's counters for /metrics.
struct ExecutorChoiceFn {
  std::function<Result<std::unique_ptr<ExpertExecutor>>(const Model&, ThreadPool*)> make;
  std::function<std::optional<backbone::DispatchStats>(const ExpertExecutor&)> stats;
  // Why the executor cannot serve every expert now (/health's 503 reason), or nothing when it can.
  std::function<std::optional<std::string>(const Model&, const ExpertExecutor&)> unavailable;
};

struct ServerOptions {
  std::string model_path;
  bool backbone_file = false;    // model_path is a backbone file: experts only through `executor` (a swarm)
  bool keep_page_cache = false;  // no re-read of a mapped model cached in 4 KiB pages (core/huge_pages.h)
  bool no_mmap = false;          // read the model into private memory (--no-mmap) instead of mapping it
  std::string host = "127.0.0.1";
  uint16_t port = 8080;
  int32_t parallel = 4;          // sequences in flight
  int32_t n_ctx = 0;             // per sequence; 0: the model's, at most 8192
  int32_t batch_tokens = 512;    // rows per step
  int32_t queue_capacity = 64;   // waiting sequences beyond --parallel
  SpecOptions spec{.draft_max = 0};  // speculative decoding with the MTP block (--draft-max), K adapting per sequence
  bool drafts_on_backbone = true;    // the MTP block's experts computed here when the model file holds them
  int32_t threads = 0;           // compute threads; 0: all cores
  int io_threads = 2;
  std::string model_id;          // /v1/models id; empty: the file's name
  std::string chat_template_file;  // --chat-template-file: a Jinja template used instead of the model's
  int32_t reasoning_budget = -1; // --reasoning-budget: -1 unlimited, 0 no thinking, N: reasoning ends after N tokens
  net::HttpLimits limits;
  ExecutorChoiceFn executor;     // empty: the model's local replica
  // --cache-ram: prompt prefixes kept for later prompts (serve/prompt_cache.h); 8192 MiB as llama-server.
  PromptCacheOptions prompt_cache{.budget_bytes = int64_t(8192) << 20};
  bool access_log = true;        // one line per request on stderr (serve/access_log.h)
  std::chrono::milliseconds drain{2000};  // at stop: how long open answers get to write their last event
};

class Server {
 public:
  static Result<std::unique_ptr<Server>> start(ServerOptions options);
  ~Server();  // stop()
  uint16_t port() const { return http_->port(); }
  // Blocks until the model is loaded (ok) or loading failed (its error), at most `timeout`.
  Status wait_ready(std::chrono::milliseconds timeout);
  // Without waiting: nothing while the model is still loading, then ok or loading's error.
  std::optional<Status> load_result() const;
  // Stops accepting generations, ends every open answer (streams get an error event, never a silent
  // close), waits up to options.drain for those bytes to go out, then stops listening.
  void stop();

  ServeApi& api() { return *api_; }
  Scheduler* scheduler() { return scheduler_.get(); }  // null until ready
  const Model* model() const { return model_.get(); }
  const Tokenizer* tokenizer() const { return tokenizer_ ? &*tokenizer_ : nullptr; }  // null until loaded

 private:
  explicit Server(ServerOptions options) : options_(std::move(options)) {}
  Status load();

  ServerOptions options_;
  std::unique_ptr<ServeApi> api_;
  std::unique_ptr<net::HttpServer> http_;
  std::unique_ptr<Model> model_;
  std::optional<Tokenizer> tokenizer_;
  std::optional<ChatTemplate> chat_template_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<ExpertExecutor> executor_;
  std::unique_ptr<ExpertExecutor> draft_executor_;  // the MTP block's experts on this process, or null
  std::unique_ptr<Scheduler> scheduler_;
  std::thread loader_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool loaded_ = false;
  Status load_status_;
  bool stopped_ = false;
};

}  // namespace essaim::serve
