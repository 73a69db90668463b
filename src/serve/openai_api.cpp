#include "serve/openai_api.h"

#include <chrono>
#include <nlohmann/json.hpp>

#include "serve/api_request.h"
#include "net/metrics_text.h"
#include "serve/stop_strings.h"

namespace essaim::serve {
namespace {

using json = nlohmann::json;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string path_of(const std::string& target) { return target.substr(0, target.find('?')); }

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// One generation request in flight: its way back, the streaming detokeniser and the stop strings. Touched
// by the scheduler thread (events) and once by the I/O thread (begin), hence the mutex.
struct Generation {
  ServeApi* api = nullptr;
  std::shared_ptr<net::HttpResponder> out;
  std::shared_ptr<SequenceHandle> handle;
  bool chat = true;
  bool stream = false;
  bool include_usage = false;
  std::string id;
  std::string model;
  int64_t created = 0;

  std::mutex mu;
  bool began = false;     // stream head sent
  bool finished = false;  // final answer sent (stop string, end, error)
  Detokenizer detok;
  StopMatcher stops;
  std::string text;       // non-streaming: the whole answer

  Generation(const Tokenizer& tok, std::vector<std::string> stop_strings) : detok(tok), stops(std::move(stop_strings)) {}

  json chunk(const std::string& piece, const char* finish_reason, bool role) const {
    json choice;
    if (chat) {
      json delta = json::object();
      if (role) delta["role"] = "assistant";
      if (!piece.empty() || role) delta["content"] = piece;
      choice = {{"index", 0}, {"delta", delta}, {"logprobs", nullptr}};
    } else {
      choice = {{"index", 0}, {"text", piece}, {"logprobs", nullptr}};
    }
    choice["finish_reason"] = finish_reason ? json(finish_reason) : json(nullptr);
    return {{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", created},
            {"model", model}, {"choices", json::array({choice})}};
  }
  static json usage(int32_t n_prompt, int32_t n_generated) {
    return {{"prompt_tokens", n_prompt}, {"completion_tokens", n_generated}, {"total_tokens", n_prompt + n_generated}};
  }
  void sse(const json& j) { out->stream_write("data: " + dump(j) + "\n\n"); }

  void begin_locked() {
    if (began || !stream) return;
    began = true;
    out->stream_begin({.status = 200, .content_type = "text/event-stream", .body = {}, .headers = {}});
    if (chat) sse(chunk("", nullptr, true));
  }

  void emit_locked(const std::string& piece) {
    if (piece.empty()) return;
    if (stream) {
      begin_locked();
      sse(chunk(piece, nullptr, false));
    } else {
      text += piece;
    }
  }

  void complete_locked(const char* reason, int32_t n_prompt, int32_t n_generated) {
    finished = true;
    api->count_outcome(reason);
    if (stream) {
      begin_locked();
      sse(chunk("", reason, false));
      if (include_usage) {
        sse({{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", created},
             {"model", model}, {"choices", json::array()}, {"usage", usage(n_prompt, n_generated)}});
      }
      out->stream_write("data: [DONE]\n\n");
      out->stream_end();
      return;
    }
    json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", reason}};
    if (chat) choice["message"] = {{"role", "assistant"}, {"content", text}};
    else choice["text"] = text;
    const json body = {{"id", id}, {"object", chat ? "chat.completion" : "text_completion"}, {"created", created},
                       {"model", model}, {"choices", json::array({choice})}, {"usage", usage(n_prompt, n_generated)}};
    out->reply({.status = 200, .content_type = "application/json", .body = dump(body), .headers = {}});
  }

  void fail_locked(const std::string& message) {
    finished = true;
    api->count_outcome("error");
    const ApiError e{.status = 500, .message = message, .type = "server_error", .code = "generation_failed", .param = {}};
    if (stream) {
      // A stream's 200 head goes out at submit (or has gone): the error travels as an event, as llama-server
      // sends it.
      begin_locked();
      out->stream_write("data: " + api_error_json(e) + "\n\n");
      out->stream_end();
    } else {
      out->reply({.status = 500, .content_type = "application/json", .body = api_error_json(e), .headers = {}});
    }
  }

  void on_event(const SequenceEvent& e) {
    std::lock_guard<std::mutex> lock(mu);
    if (finished) return;
    for (TokenId id : e.tokens) {
      emit_locked(stops.push(detok.push(id)));
      if (stops.matched()) {
        if (handle) handle->finish();  // the sequence leaves at the next step
        return complete_locked("stop", e.n_prompt, e.n_generated);
      }
    }
    if (!e.done) return;
    switch (e.reason) {
      case FinishReason::STOP:
      case FinishReason::LENGTH: {
        emit_locked(stops.push(detok.flush()));
        if (!stops.matched()) emit_locked(stops.flush());
        return complete_locked(e.reason == FinishReason::LENGTH && !stops.matched() ? "length" : "stop", e.n_prompt,
                               e.n_generated);
      }
      case FinishReason::CANCELLED:
        finished = true;
        api->count_outcome("cancelled");
        if (stream) out->stream_end();
        else out->reply({.status = 503, .content_type = "application/json",
                         .body = api_error_json({.status = 503, .message = e.error.empty() ? "cancelled" : e.error,
                                                 .type = "server_error", .code = "cancelled", .param = {}}),
                         .headers = {}});
        return;
      case FinishReason::ERROR:
      case FinishReason::NONE:
        return fail_locked(e.error.empty() ? "generation failed" : e.error);
    }
  }
};

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
  done({.kind = net::HttpCredentials::Kind::REFUSED,
        .refusal = {.status = 401, .content_type = "application/json",
                    .body = api_error_json({.status = 401, .message = "invalid or missing API key (send 'Authorization: Bearer <key>')",
                                            .type = "authentication_error", .code = "invalid_api_key", .param = {}}),
                    .headers = {}}});
}

void ServeApi::handle(const net::HttpRequestView& req, std::shared_ptr<net::HttpResponder> out) {
  const std::string path = path_of(req.target);
  if (path == "/health") {  // no key: load balancers and orchestrators probe it
    if (ready_.load()) return out->reply({.status = 200, .content_type = "application/json", .body = R"({"status":"ok"})", .headers = {}});
    std::string failure;
    {
      std::lock_guard<std::mutex> lock(mu_);
      failure = failure_;
    }
    if (!failure.empty()) return error_reply(*out, 500, "the model failed to load: " + failure, "load_failed", {}, "error");
    return error_reply(*out, 503, "Loading model", "loading", "unavailable_error", "loading", "1");
  }
  if (!net::api_key_ok(options_.api_key, req.authorization)) {
    return error_reply(*out, 401, "invalid or missing API key (send 'Authorization: Bearer <key>')", "invalid_api_key",
                       {}, "unauthorized");
  }
  const bool get = req.method == "GET", post = req.method == "POST";
  const bool known = path == "/metrics" || path == "/v1/models" || path == "/models" || path == "/v1/chat/completions" ||
                     path == "/chat/completions" || path == "/v1/completions" || path == "/completions";
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
  generate(req, std::move(out), path.ends_with("/chat/completions"));
}

void ServeApi::generate(const net::HttpRequestView& req, std::shared_ptr<net::HttpResponder> out, bool chat) {
  ApiParse parsed = parse_api_request(chat ? ApiEndpoint::CHAT : ApiEndpoint::COMPLETION, req.body);
  if (parsed.error) {
    count_outcome("invalid");
    return out->reply({.status = parsed.error->status, .content_type = "application/json",
                       .body = api_error_json(*parsed.error), .headers = {}});
  }
  ApiRequest& r = *parsed.request;
  const std::string text = chat ? chat_render(model_.chat_format, r.messages,
                                              {.add_generation_prompt = true, .enable_thinking = r.enable_thinking})
                                : r.prompt;
  std::vector<TokenId> prompt = model_.tokenizer->encode(text, /*parse_special=*/true);
  if (prompt.empty()) return error_reply(*out, 400, "the prompt encodes to no tokens", "empty_prompt");
  const int32_t n_ctx = model_.scheduler->n_ctx();
  if (int64_t(prompt.size()) >= n_ctx) {
    return error_reply(*out, 400,
                       "the prompt has " + std::to_string(prompt.size()) + " tokens; the context holds " +
                           std::to_string(n_ctx) + " (prompt + generated)",
                       "context_length_exceeded");
  }
  const int32_t room = n_ctx - int32_t(prompt.size());
  SequenceRequest sreq{.prompt = std::move(prompt), .max_tokens = std::min(r.max_tokens.value_or(room), room),
                       .sampling = r.sampling, .eog = model_.tokenizer->eog_ids()};

  auto g = std::make_shared<Generation>(*model_.tokenizer, r.stop);
  g->api = this;
  g->out = out;
  g->chat = chat;
  g->stream = r.stream;
  g->include_usage = r.include_usage;
  g->id = std::string(chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id_.fetch_add(1));
  g->model = model_.id;
  g->created = unix_now();
  SubmitResult submitted = model_.scheduler->submit(std::move(sreq), [g](const SequenceEvent& e) { g->on_event(e); });
  if (!submitted.handle) {
    if (submitted.error == SubmitError::QUEUE_FULL || submitted.error == SubmitError::STOPPED)
      return error_reply(*out, 503, submitted.message, "overloaded", "server_error", "overloaded", "1");
    return error_reply(*out, 400, submitted.message, "invalid_value");
  }
  {
    std::lock_guard<std::mutex> lock(g->mu);
    g->handle = submitted.handle;
    if (g->finished) g->handle->finish();  // a stop string matched before we got here
    g->begin_locked();
  }
  // The client leaving frees its sequence at the next step.
  out->on_disconnect([h = submitted.handle] { h->cancel(); });
}

std::string ServeApi::metrics_text() const {
  net::MetricsText m;
  m.family("essaim_serve_ready", "gauge", "1 once the model is loaded and requests are served");
  m.sample("essaim_serve_ready", {}, ready_.load() ? 1 : 0);
  m.family("essaim_serve_requests_total", "counter", "Requests answered, by outcome");
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [outcome, n] : outcomes_) m.sample("essaim_serve_requests_total", {{"outcome", outcome}}, double(n));
  }
  if (options_.http_stats) {
    const net::HttpServerStats h = options_.http_stats();
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
  if (!ready_.load()) return m.text();
  const SchedulerStats s = model_.scheduler->stats();
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

  if (!model_.dispatch_stats) return m.text();
  const std::optional<backbone::DispatchStats> d = model_.dispatch_stats();
  if (!d) return m.text();
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
  if (d->hot.enabled) {  // --expert-cache-mb (docs/dispatch.md, "The hot-expert cache")
    const backbone::HotCacheReport& h = d->hot;
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
  return m.text();
}

}  // namespace essaim::serve
