#include "serve/openai_api.h"

#include <chrono>
#include <nlohmann/json.hpp>

#include "serve/anthropic_api.h"
#include "serve/api_request.h"
#include "net/metrics_text.h"
#include "serve/generation.h"
#include "text/json_schema_grammar.h"

namespace essaim::serve {
namespace {

using json = nlohmann::json;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string path_of(const std::string& target) { return target.substr(0, target.find('?')); }

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

void ServeApi::set_ready(ServeModel model) {
  model_ = std::move(model);
  ready_.store(true);
}

void ServeApi::set_failed(std::string why) {
  std::lock_guard<std::mutex> lock(mu_);
  failure_ = std::move(why);
}

void ServeApi::count_outcome(const std::string& outcome) {
  std::lock_guard<std::mutex> lock(mu_);
  ++outcomes_[outcome];
}

uint64_t ServeApi::outcome_count(const std::string& outcome) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = outcomes_.find(outcome);
  return it == outcomes_.end() ? 0 : it->second;
}

void ServeApi::error_reply(net::HttpResponder& out, int status, std::string message, std::string code, std::string type,
                           std::string outcome, std::string retry_after) {
  if (type.empty()) type = status >= 500 ? "server_error" : "invalid_request_error";
  if (status == 401) type = "authentication_error";
  count_outcome(outcome);
  net::HttpReply r{.status = status, .content_type = "application/json",
              .body = api_error_json({.status = status, .message = std::move(message), .type = std::move(type),
                                      .code = std::move(code), .param = {}}),
              .headers = {}};
  if (!retry_after.empty()) r.headers.emplace_back("Retry-After", retry_after);
  out.reply(std::move(r));
}

void ServeApi::authorize(const net::HttpRequestHead& head, const std::function<void(net::HttpCredentials)>& done) {
  if (path_of(head.target) == "/health") return done({.kind = net::HttpCredentials::Kind::PUBLIC, .refusal = {}});
  if (net::api_key_ok(options_.api_key, head.authorization)) {
    return done({.kind = net::HttpCredentials::Kind::VALID, .refusal = {}});
  }
  count_outcome("unauthorized");
  if (options_.access_log)  // refused from the head: the request never reaches handle()
    options_.access_log(access_line_text({.method = head.method, .path = path_of(head.target), .status = 401, .prompt_tokens = -1, .completion_tokens = -1, .ms = 0, .note = {}}));
  done({.kind = net::HttpCredentials::Kind::REFUSED,
        .refusal = {.status = 401, .content_type = "application/json",
                    .body = api_error_json({.status = 401, .message = "invalid or missing API key (send 'Authorization: Bearer <key>')",
                                            .type = "authentication_error", .code = "invalid_api_key", .param = {}}),
                    .headers = {}}});
}

void ServeApi::answer_health(net::HttpResponder& out) {
  if (shutting_down_.load()) return error_reply(out, 503, "the server is shutting down", "shutting_down", "unavailable_error", "loading");
  if (ready_.load()) {
    if (model_.unavailable) {
      if (const std::optional<std::string> why = model_.unavailable())
        return error_reply(out, 503, "the swarm cannot serve: " + *why, "swarm_unavailable", "unavailable_error", "unavailable", "1");
    }
    return out.reply({.status = 200, .content_type = "application/json", .body = R"({"status":"ok"})", .headers = {}});
  }
  std::string failure;
  {
    std::lock_guard<std::mutex> lock(mu_);
    failure = failure_;
  }
  if (!failure.empty()) return error_reply(out, 500, "the model failed to load: " + failure, "load_failed", {}, "error");
  return error_reply(out, 503, "Loading model", "loading", "unavailable_error", "loading", "1");
}

void ServeApi::handle(const net::HttpRequestView& req, std::shared_ptr<net::HttpResponder> raw_out) {
  const std::string path = path_of(req.target);
  auto out = std::make_shared<LoggedResponder>(std::move(raw_out), req.method, path, options_.access_log);
  if (path == "/health") return answer_health(*out);  // no key: load balancers and orchestrators probe it
  if (!net::api_key_ok(options_.api_key, req.authorization)) {
    return error_reply(*out, 401, "invalid or missing API key (send 'Authorization: Bearer <key>')", "invalid_api_key",
                       {}, "unauthorized");
  }
  const bool get = req.method == "GET", post = req.method == "POST";
  const bool known = path == "/metrics" || path == "/v1/models" || path == "/models" || path == "/v1/chat/completions" ||
                     path == "/chat/completions" || path == "/v1/completions" || path == "/completions" ||
                     path == "/v1/messages";
  if (!known) return error_reply(*out, 404, "no endpoint " + path, "not_found", {}, "not_found");
  if (path == "/metrics") {
    if (!get) return error_reply(*out, 405, "use GET " + path, "method_not_allowed", {}, "invalid");
    return out->reply({.status = 200, .content_type = "text/plain; version=0.0.4", .body = metrics_text(), .headers = {}});
  }
  if (!ready_.load()) return error_reply(*out, 503, "Loading model", "loading", "unavailable_error", "loading", "1");
  if (path == "/v1/models" || path == "/models") {
    if (!get) return error_reply(*out, 405, "use GET " + path, "method_not_allowed", {}, "invalid");
    const json body = {{"object", "list"},
                       {"data", json::array({{{"id", model_.id}, {"object", "model"}, {"created", model_.created},
                                              {"owned_by", "essaim"}}})}};
    return out->reply({.status = 200, .content_type = "application/json", .body = dump(body), .headers = {}});
  }
  if (!post) return error_reply(*out, 405, "use POST " + path, "method_not_allowed", {}, "invalid");
  if (shutting_down_.load())
    return error_reply(*out, 503, "the server is shutting down", "shutting_down", "unavailable_error", "overloaded");
  generate(req, std::move(out),
           path == "/v1/messages" ? ApiEndpoint::MESSAGES
           : path.ends_with("/chat/completions") ? ApiEndpoint::CHAT : ApiEndpoint::COMPLETION);
}

bool ServeApi::wait_settled(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(settle_mu_);
  return settle_cv_.wait_for(lock, timeout, [this] { return unsettled_ == 0; });
}

namespace {

// The prompts of a request as token ids: the rendered chat, or each completion prompt (text encoded, ids
// checked against the vocabulary and the context).
struct PromptIds {
  std::vector<std::vector<TokenId>> ids;
  std::optional<ApiError> error;
  bool in_reasoning = false;  // chat: the rendered prompt ends inside <think>
};

PromptIds prompt_ids(const ApiRequest& r, const ServeModel& m) {
  PromptIds p;
  const auto add = [&](std::vector<TokenId> ids) {
    if (ids.empty()) p.error = ApiError{.status = 400, .message = "the prompt encodes to no tokens", .code = "empty_prompt", .param = "prompt"};
    const int32_t n_ctx = m.scheduler->n_ctx();
    if (int64_t(ids.size()) >= n_ctx)
      p.error = ApiError{.status = 400,
                         .message = "the prompt has " + std::to_string(ids.size()) + " tokens; the context holds " +
                                    std::to_string(n_ctx) + " (prompt + generated)",
                         .code = "context_length_exceeded", .param = {}};
    p.ids.push_back(std::move(ids));
  };
  if (r.endpoint == ApiEndpoint::CHAT) {
    ChatTemplateInput in{.messages = r.messages, .tools = r.tool_choice == ToolChoice::NONE ? nlohmann::ordered_json() : r.tools,
                         .add_generation_prompt = true, .kwargs = r.template_kwargs};
    // --reasoning-budget 0 is llama-server's "no thinking": the template's own switch, unless the request set it.
    if (m.reasoning_budget == 0 && !in.kwargs.contains("enable_thinking")) in.kwargs["enable_thinking"] = false;
    Result<std::string> text = m.chat_template->render(in);
    if (!text) {
      p.error = ApiError{.status = 400, .message = "the model's chat template refused these messages: " + text.status().message(),
                         .code = "chat_template_error", .param = "messages"};
      return p;
    }
    p.in_reasoning = prompt_opens_reasoning(*text);
    add(m.tokenizer->encode(*text, /*parse_special=*/true));
    return p;
  }
  for (const PromptInput& in : r.prompts) {
    if (!in.is_tokens) {
      add(m.tokenizer->encode(in.text, /*parse_special=*/true));
    } else {
      for (int32_t t : in.tokens)
        if (!m.tokenizer->valid(t))
          p.error = ApiError{.status = 400, .message = "token id " + std::to_string(t) + " is not in the vocabulary (0.." +
                                                       std::to_string(m.tokenizer->n_vocab() - 1) + ")",
                             .code = "invalid_value", .param = "prompt"};
      add(in.tokens);
    }
    if (p.error) return p;
  }
  return p;
}

// The grammar a request's response_format or tool_choice asks for (null: none), or the 400 that refuses its
// schema, naming the keyword.
std::optional<ApiError> request_grammar(const ApiRequest& r, const ServeModel& m, bool in_reasoning,
                                        std::shared_ptr<const Grammar>& out) {
  const StructuredOutputOptions options{.in_reasoning = in_reasoning, .limits = {}};
  Result<std::shared_ptr<const Grammar>> g = Status::error("none");
  std::string param = "response_format";
  if (r.tool_choice == ToolChoice::REQUIRED || r.tool_choice == ToolChoice::FUNCTION) {
    g = tool_call_grammar(r.tools, r.tool_choice == ToolChoice::FUNCTION ? r.tool_choice_name : std::string(),
                          m.chat_template->tool_call_syntax(), options);
    param = "tools";
  } else if (r.response_format == ResponseFormat::JSON_OBJECT) {
    g = json_object_grammar(options);
  } else if (r.response_format == ResponseFormat::JSON_SCHEMA) {
    g = json_schema_grammar(r.response_schema, options);
    param = "response_format.json_schema.schema";
  } else {
    return std::nullopt;
  }
  if (!g) return ApiError{.status = 400, .message = param + ": " + g.status().message(), .code = "unsupported_schema", .param = param};
  out = *g;
  return std::nullopt;
}

}  // namespace

std::shared_ptr<const TokenTrie> ServeApi::token_trie() {
  std::lock_guard<std::mutex> lock(trie_mu_);
  if (!trie_) trie_ = std::make_shared<const TokenTrie>(*model_.tokenizer);
  return trie_;
}

void ServeApi::generate(const net::HttpRequestView& req, std::shared_ptr<LoggedResponder> out, ApiEndpoint endpoint) {
  const bool chat = endpoint != ApiEndpoint::COMPLETION, anthropic = endpoint == ApiEndpoint::MESSAGES;
  ApiParse parsed = anthropic ? parse_anthropic_request(req.body) : parse_api_request(endpoint, req.body);
  if (!parsed.error && anthropic) parsed.request->endpoint = ApiEndpoint::CHAT;  // rendered as a chat from here on
  PromptIds prompts;
  std::shared_ptr<const Grammar> grammar;
  if (!parsed.error) prompts = prompt_ids(*parsed.request, model_);
  if (!parsed.error && !prompts.error) prompts.error = request_grammar(*parsed.request, model_, prompts.in_reasoning, grammar);
  if (std::optional<ApiError> e = parsed.error ? parsed.error : prompts.error) {
    count_outcome("invalid");
    return out->reply({.status = e->status, .content_type = "application/json",
                       .body = anthropic ? anthropic_error_json(*e) : api_error_json(*e), .headers = {}});
  }
  const ApiRequest& r = *parsed.request;
  {
    std::lock_guard<std::mutex> lock(settle_mu_);
    ++unsettled_;
  }
  auto g = std::make_shared<Generation>(GenerationSetup{
      .out = out, .tokenizer = model_.tokenizer, .chat = chat, .anthropic = anthropic,
      .prompt_tokens = int32_t(prompts.ids[0].size()), .stream = r.stream, .include_usage = r.include_usage,
      .id = std::string(anthropic ? "msg_" : chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id_.fetch_add(1)),
      .model = model_.id,
      .created = unix_now(), .stop = r.stop, .n_choices = prompts.ids.size(), .in_reasoning = prompts.in_reasoning,
      .tools = r.tool_choice == ToolChoice::NONE ? nlohmann::ordered_json() : r.tools,
      .reasoning_budget = model_.reasoning_budget,
      .close_reasoning = model_.tokenizer->encode("\n</think>\n\n", /*parse_special=*/true),
      .count_outcome = [this](const std::string& o) { count_outcome(o); },
      .settled = [this] {
        std::lock_guard<std::mutex> lock(settle_mu_);
        --unsettled_;
        settle_cv_.notify_all();
      }});
  const std::shared_ptr<const TokenTrie> trie = grammar ? token_trie() : nullptr;
  for (size_t i = 0; i < prompts.ids.size(); ++i) {
    const int32_t room = model_.scheduler->n_ctx() - int32_t(prompts.ids[i].size());
    SequenceRequest sreq{.prompt = std::move(prompts.ids[i]), .max_tokens = std::min(r.max_tokens.value_or(room), room),
                         .sampling = r.sampling, .eog = model_.tokenizer->eog_ids(),
                         .may_force = model_.reasoning_budget > 0,  // the budget closes reasoning by forcing
                         .grammar = grammar, .trie = trie, .ignore_eog = r.ignore_eos};
    SubmitResult submitted = model_.scheduler->submit(std::move(sreq), [g, i](const SequenceEvent& e) { g->on_event(i, e); });
    if (!submitted.handle) {
      const bool busy = submitted.error == SubmitError::QUEUE_FULL || submitted.error == SubmitError::STOPPED;
      if (i > 0) return g->fail(busy ? 503 : 400, submitted.message, busy ? "overloaded" : "invalid_value");
      // Nothing submitted yet: a plain refusal (g settles as it goes).
      if (anthropic) return g->fail(busy ? 503 : 400, submitted.message, busy ? "overloaded" : "invalid_value");
      if (busy) return error_reply(*out, 503, submitted.message, "overloaded", "server_error", "overloaded", "1");
      return error_reply(*out, 400, submitted.message, "invalid_value");
    }
    g->attach(i, submitted.handle);
  }
  g->begin();
  // The client leaving frees its sequences at the next step.
  out->on_disconnect([g] { g->client_gone(); });
}

namespace {

// --cache-ram (serve/prompt_cache.h).
void append_prompt_cache_metrics(net::MetricsText& m, const PromptCacheStats& c) {
  m.family("essaim_serve_prompt_cache_lookups_total", "counter", "Prompts looked up in the prompt cache, by result");
  m.sample("essaim_serve_prompt_cache_lookups_total", {{"result", "hit"}}, double(c.hits));
  m.sample("essaim_serve_prompt_cache_lookups_total", {{"result", "miss"}}, double(c.misses));
  m.family("essaim_serve_prompt_cache_tokens_reused_total", "counter", "Prompt tokens restored from the cache instead of computed");
  m.sample("essaim_serve_prompt_cache_tokens_reused_total", {}, double(c.tokens_reused));
  m.family("essaim_serve_prompt_cache_evictions_total", "counter", "Cached prompts dropped, by reason");
  m.sample("essaim_serve_prompt_cache_evictions_total", {{"reason", "budget"}}, double(c.evictions));
  m.sample("essaim_serve_prompt_cache_evictions_total", {{"reason", "replaced"}}, double(c.replaced));
  m.sample("essaim_serve_prompt_cache_evictions_total", {{"reason", "too_large"}}, double(c.too_large));
  m.family("essaim_serve_prompt_cache_bytes", "gauge",
           "Bytes the prompt cache holds, those of prefills in progress, and its budget (-1: none)");
  m.sample("essaim_serve_prompt_cache_bytes", {{"kind", "held"}}, double(c.bytes));
  m.sample("essaim_serve_prompt_cache_bytes", {{"kind", "pending"}}, double(c.pending_bytes));
  m.sample("essaim_serve_prompt_cache_bytes", {{"kind", "budget"}}, double(c.budget_bytes));
  m.family("essaim_serve_prompt_cache_checkpoints_skipped_total", "counter",
           "Recurrent-state checkpoints a prefill did not take, for the budget");
  m.sample("essaim_serve_prompt_cache_checkpoints_skipped_total", {}, double(c.checkpoints_skipped));
  m.family("essaim_serve_prompt_cache_entries", "gauge", "Cached prompts, and the recurrent-state checkpoints they hold");
  m.sample("essaim_serve_prompt_cache_entries", {{"kind", "prompts"}}, double(c.entries));
  m.sample("essaim_serve_prompt_cache_entries", {{"kind", "checkpoints"}}, double(c.checkpoints));
}

void append_http_metrics(net::MetricsText& m, const net::HttpServerStats& h) {
  m.family("essaim_serve_connections", "gauge", "Open HTTP connections");
  m.sample("essaim_serve_connections", {}, h.connections);
  m.family("essaim_serve_connections_refused_total", "counter", "Connections refused over the connection cap");
  m.sample("essaim_serve_connections_refused_total", {}, double(h.refused_connections));
  m.family("essaim_serve_http_refused_total", "counter", "Requests refused by the listener (400/413/431)");
  m.sample("essaim_serve_http_refused_total", {}, double(h.refused_requests));
  m.family("essaim_serve_client_disconnects_total", "counter", "Clients gone before their answer was complete");
  m.sample("essaim_serve_client_disconnects_total", {}, double(h.disconnects));
  m.append_raw(h.admission.to_prometheus("essaim_serve"));
}

void append_scheduler_metrics(net::MetricsText& m, const SchedulerStats& s) {
  m.family("essaim_serve_sequences_active", "gauge", "Sequences in flight (in the batch)");
  m.sample("essaim_serve_sequences_active", {}, s.active);
  m.family("essaim_serve_sequences_queued", "gauge", "Sequences waiting for a slot");
  m.sample("essaim_serve_sequences_queued", {}, s.queued);
  m.family("essaim_serve_parallel", "gauge", "Most sequences in flight (--parallel)");
  m.sample("essaim_serve_parallel", {}, s.parallel);
  m.family("essaim_serve_sequences_finished_total", "counter", "Sequences that left the scheduler, by reason");
  for (FinishReason r : {FinishReason::STOP, FinishReason::LENGTH, FinishReason::CANCELLED, FinishReason::ERROR})
    m.sample("essaim_serve_sequences_finished_total", {{"reason", finish_reason_name(r)}}, double(s.finished[size_t(r)]));
  m.family("essaim_serve_prompt_tokens_total", "counter", "Prompt tokens computed");
  m.sample("essaim_serve_prompt_tokens_total", {}, double(s.prompt_tokens));
  m.family("essaim_serve_generated_tokens_total", "counter", "Tokens generated");
  m.sample("essaim_serve_generated_tokens_total", {}, double(s.generated_tokens));
  m.family("essaim_serve_generated_tokens_per_second", "gauge", "Generated tokens per second over the last 10 s");
  m.sample("essaim_serve_generated_tokens_per_second", {}, s.tokens_per_second);
  m.family("essaim_serve_steps_total", "counter", "Batched forward steps");
  m.sample("essaim_serve_steps_total", {}, double(s.steps));
  m.family("essaim_serve_steps_failed_total", "counter", "Steps whose forward pass failed");
  m.sample("essaim_serve_steps_failed_total", {}, double(s.failed_steps));
  m.family("essaim_serve_scheduler_seconds_total", "counter",
           "The step thread's time: forward passes, sampling and emitting tokens, admission, idle (nothing in flight)");
  m.sample("essaim_serve_scheduler_seconds_total", {{"phase", "forward"}}, s.forward_seconds);
  m.sample("essaim_serve_scheduler_seconds_total", {{"phase", "emit"}}, s.emit_seconds);
  m.sample("essaim_serve_scheduler_seconds_total", {{"phase", "admit"}}, s.admit_seconds);
  m.sample("essaim_serve_scheduler_seconds_total", {{"phase", "idle"}}, s.idle_seconds);
  m.histogram("essaim_serve_batch_rows", "Token rows per forward step", s.batch_rows);
  m.histogram("essaim_serve_batch_sequences", "Sequences per forward step", s.batch_sequences);
  m.family("essaim_serve_spec_drafted_total", "counter", "Speculative decoding: draft tokens proposed by the MTP block");
  m.sample("essaim_serve_spec_drafted_total", {}, double(s.spec_drafted));
  m.family("essaim_serve_spec_accepted_total", "counter", "Speculative decoding: draft tokens accepted");
  m.sample("essaim_serve_spec_accepted_total", {}, double(s.spec_accepted));
  m.family("essaim_serve_spec_verifications_total", "counter",
           "Speculative decoding: sequence-steps that verified drafts (each gives accepted + 1 tokens)");
  m.sample("essaim_serve_spec_verifications_total", {}, double(s.spec_rounds));
  m.family("essaim_serve_spec_tokens_per_step", "gauge",
           "Speculative decoding: tokens a sequence got per verifying step, since start");
  m.sample("essaim_serve_spec_tokens_per_step", {},
           s.spec_rounds ? double(s.spec_tokens) / double(s.spec_rounds) : 0.0);
}

// --expert-cache-mb (docs/dispatch.md, "The hot-expert cache").
void append_hot_cache_metrics(net::MetricsText& m, const backbone::HotCacheReport& h) {
  m.family("essaim_hot_cache_hits_total", "counter", "Pairs computed from the hot-expert cache instead of sent");
  m.sample("essaim_hot_cache_hits_total", {}, double(h.hits));
  m.family("essaim_hot_cache_fetches_total", "counter", "Expert downloads verified and cached");
  m.sample("essaim_hot_cache_fetches_total", {}, double(h.fetches));
  m.family("essaim_hot_cache_refusals_total", "counter", "Expert downloads refused (digest or format not the expected one)");
  m.sample("essaim_hot_cache_refusals_total", {}, double(h.refusals));
  m.family("essaim_hot_cache_fetch_failures_total", "counter", "Expert downloads that did not complete");
  m.sample("essaim_hot_cache_fetch_failures_total", {}, double(h.fetch_failures));
  m.family("essaim_hot_cache_evictions_total", "counter", "Experts dropped from the cache for hotter ones");
  m.sample("essaim_hot_cache_evictions_total", {}, double(h.evictions));
  m.family("essaim_hot_cache_bytes", "gauge", "Expert bytes held by the cache, and its budget");
  m.sample("essaim_hot_cache_bytes", {{"kind", "held"}}, double(h.bytes_held));
  m.sample("essaim_hot_cache_bytes", {{"kind", "budget"}}, double(h.budget_bytes));
  m.family("essaim_hot_cache_experts", "gauge", "Experts held by the cache");
  m.sample("essaim_hot_cache_experts", {}, double(h.experts_held));
}

void append_dispatch_metrics(net::MetricsText& m, const backbone::DispatchStats& stats) {
  const backbone::DispatchStats* d = &stats;
  m.family("essaim_dispatch_pairs_total", "counter", "(row, expert) pairs by where they were computed");
  m.sample("essaim_dispatch_pairs_total", {{"where", "remote"}}, double(d->pairs_remote));
  m.sample("essaim_dispatch_pairs_total", {{"where", "local"}}, double(d->pairs_local));
  m.sample("essaim_dispatch_pairs_total", {{"where", "fallback"}}, double(d->pairs_fallback));
  if (d->hot.enabled) m.sample("essaim_dispatch_pairs_total", {{"where", "hot_cache"}}, double(d->pairs_cached));
  m.family("essaim_dispatch_fallback_pairs_total", "counter", "Pairs of a worker recomputed locally, by reason");
  for (size_t i = 0; i < backbone::kFallbackReasonCount; ++i) {
    m.sample("essaim_dispatch_fallback_pairs_total",
             {{"reason", std::string(backbone::fallback_reason_name(backbone::FallbackReason(i)))}}, double(d->fallback_pairs[i]));
  }
  m.family("essaim_dispatch_bytes_total", "counter", "Expert protocol bytes on the wire");
  m.sample("essaim_dispatch_bytes_total", {{"direction", "sent"}}, double(d->bytes_sent()));
  m.sample("essaim_dispatch_bytes_total", {{"direction", "received"}}, double(d->bytes_received()));
  m.family("essaim_dispatch_requests_total", "counter", "Expert requests sent");
  m.sample("essaim_dispatch_requests_total", {}, double(d->requests));
  if (d->hot.enabled) append_hot_cache_metrics(m, d->hot);
  struct PerWorker {
    const char* name;
    const char* type;
    const char* help;
    double (*value)(const backbone::WorkerReport&);
  };
  static constexpr PerWorker kPerWorker[] = {
      {"essaim_dispatch_worker_pairs_served_total", "counter", "Pairs each worker computed and the backbone accepted",
       [](const backbone::WorkerReport& w) { return double(w.pairs_served); }},
      {"essaim_dispatch_worker_requests_total", "counter", "Requests sent to each worker",
       [](const backbone::WorkerReport& w) { return double(w.requests); }},
      {"essaim_dispatch_worker_failures_total", "counter", "Requests to each worker that fell back",
       [](const backbone::WorkerReport& w) { return double(w.failures); }},
      {"essaim_dispatch_worker_connected", "gauge", "1 while a session with the worker is up",
       [](const backbone::WorkerReport& w) { return w.connected ? 1.0 : 0.0; }},
  };
  for (const PerWorker& f : kPerWorker) {  // a family's samples must be contiguous
    m.family(f.name, f.type, f.help);
    for (const backbone::WorkerReport& w : d->workers) m.sample(f.name, {{"worker", w.address}}, f.value(w));
  }
}

}  // namespace

std::string ServeApi::metrics_text() const {
  net::MetricsText m;
  m.family("essaim_serve_ready", "gauge", "1 once the model is loaded and requests are served");
  m.sample("essaim_serve_ready", {}, ready_.load() ? 1 : 0);
  m.family("essaim_serve_requests_total", "counter", "Requests answered, by outcome");
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [outcome, n] : outcomes_) m.sample("essaim_serve_requests_total", {{"outcome", outcome}}, double(n));
  }
  if (options_.http_stats) append_http_metrics(m, options_.http_stats());
  if (!ready_.load()) return m.text();
  const SchedulerStats s = model_.scheduler->stats();
  append_scheduler_metrics(m, s);
  append_prompt_cache_metrics(m, s.prompt_cache);
  if (!model_.dispatch_stats) return m.text();
  if (const std::optional<backbone::DispatchStats> d = model_.dispatch_stats()) append_dispatch_metrics(m, *d);
  return m.text();
}

}  // namespace essaim::serve
