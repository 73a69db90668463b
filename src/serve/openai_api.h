// The OpenAI-compatible endpoints over a Scheduler: routing, the API key, chat templating, tokenising,
// streaming detokenisation, stop strings, SSE chunks, usage, and /health, /v1/models, /metrics.
// Field-by-field behaviour: docs/serve.md.
//
//   ServeApi api({.api_key = "k"});
//   auto http = net::HttpServer::listen(host, port, limits, [&](auto& req, auto out) { api.handle(req, out); });
//   ...load the model...
//   api.set_ready({.model = m.get(), .tokenizer = &tok, .chat_template = &tmpl, .scheduler = &sched, .id = "tiny"});
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "backbone/dispatch_stats.h"
#include "model/model.h"
#include "net/http_server.h"
#include "serve/access_log.h"
#include "serve/api_request.h"
#include "serve/scheduler.h"
#include "text/chat_template.h"
#include "text/grammar.h"
#include "text/tokenizer.h"

namespace essaim::serve {

struct ServeModel {
  const Model* model = nullptr;
  const Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat_template = nullptr;  // the model's own (text/chat_template.h)
  int32_t reasoning_budget = -1;  // --reasoning-budget: -1 unlimited, 0 no thinking, N: at most N reasoning tokens
  Scheduler* scheduler = nullptr;
  std::string id;        // what /v1/models lists and answers carry
  int64_t created = 0;   // unix seconds, when the model was loaded
  // The swarm dispatcher's counters, when workers are used (for /metrics); empty otherwise.
  std::function<std::optional<backbone::DispatchStats>()> dispatch_stats;
  // Why the swarm cannot serve now (some expert with no live holder and no local copy), or nothing when it
  // can; /health answers 503 with the reason meanwhile. Empty: always can (the local replica).
  std::function<std::optional<std::string>()> unavailable;
};

struct ServeApiOptions {
  std::string api_key;  // empty: none needed
  std::function<net::HttpServerStats()> http_stats;  // for /metrics, may be empty
  AccessLogFn access_log;  // one line per request (serve/access_log.h); empty: none
};

class ServeApi {
 public:
  explicit ServeApi(ServeApiOptions options) : options_(std::move(options)) {}
  void set_ready(ServeModel model);  // /health answers 200 from now on
  void set_failed(std::string why);  // loading failed: /health answers 500 with why
  bool ready() const { return ready_.load(); }
  // Shutdown, first step: /health answers 503 "shutting down" and new generations are refused with 503.
  void begin_shutdown() { shutting_down_.store(true); }
  // Blocks until every answer in flight has written its last bytes (or lost its client), at most `timeout`;
  // returns whether all did.
  bool wait_settled(std::chrono::milliseconds timeout);

  void handle(const net::HttpRequestView& request, std::shared_ptr<net::HttpResponder> out);
  // The listener's credentials check (net::HttpAuthorizer), from the request head: /health is public;
  // every other path is VALID with the key (or when none is set) and REFUSED with a 401 without it.
  void authorize(const net::HttpRequestHead& head, const std::function<void(net::HttpCredentials)>& done);
  std::string metrics_text() const;

  // Requests answered, by outcome ("stop", "length", "cancelled", "error", "invalid", "unauthorized",
  // "overloaded", "not_found", "loading").
  uint64_t outcome_count(const std::string& outcome) const;
  void count_outcome(const std::string& outcome);

 private:
  void generate(const net::HttpRequestView& request, std::shared_ptr<LoggedResponder> out, ApiEndpoint endpoint);
  void answer_health(net::HttpResponder& out);
  std::shared_ptr<const TokenTrie> token_trie();  // built on the first constrained request
  void error_reply(net::HttpResponder& out, int status, std::string message, std::string code, std::string type = {},
                   std::string outcome = "invalid", std::string retry_after = {});

  ServeApiOptions options_;
  std::atomic<bool> ready_{false};
  std::atomic<bool> shutting_down_{false};
  std::mutex settle_mu_;
  std::condition_variable settle_cv_;
  int64_t unsettled_ = 0;  // answers submitted and not yet settled (guarded by settle_mu_)
  ServeModel model_;  // set once, before ready_
  std::atomic<uint64_t> next_id_{1};
  mutable std::mutex mu_;
  std::string failure_;
  std::map<std::string, uint64_t> outcomes_;
  std::mutex trie_mu_;
  std::shared_ptr<const TokenTrie> trie_;
};

}  // namespace essaim::serve
