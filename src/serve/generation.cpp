#include "serve/generation.h"

#include <nlohmann/json.hpp>

#include "serve/api_request.h"

namespace essaim::serve {
namespace {

using json = nlohmann::json;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json usage_json(int64_t n_prompt, int64_t n_generated) {
  return {{"prompt_tokens", n_prompt}, {"completion_tokens", n_generated}, {"total_tokens", n_prompt + n_generated}};
}

}  // namespace

Generation::Generation(GenerationSetup setup) : s_(std::move(setup)), open_choices_(s_.n_choices) {
  settle_->fn = s_.settled;
  choices_.reserve(s_.n_choices);
  for (size_t i = 0; i < s_.n_choices; ++i)
    choices_.push_back(Choice{.detok = Detokenizer(*s_.tokenizer), .stops = StopMatcher(s_.stop), .handle = {},
                              .text = {}, .finish = nullptr, .n_prompt = 0, .n_generated = 0});
}

std::string Generation::chunk_json(size_t choice, const std::string& piece, const char* finish_reason, bool role) const {
  json c;
  if (s_.chat) {
    json delta = json::object();
    if (role) delta["role"] = "assistant";
    if (!piece.empty() || role) delta["content"] = piece;
    c = {{"index", choice}, {"delta", delta}, {"logprobs", nullptr}};
  } else {
    c = {{"index", choice}, {"text", piece}, {"logprobs", nullptr}};
  }
  c["finish_reason"] = finish_reason ? json(finish_reason) : json(nullptr);
  return "data: " +
         dump({{"id", s_.id}, {"object", s_.chat ? "chat.completion.chunk" : "text_completion"}, {"created", s_.created},
               {"model", s_.model}, {"choices", json::array({c})}}) +
         "\n\n";
}

void Generation::begin() {
  std::lock_guard<std::mutex> lock(mu_);
  begin_locked();
}

void Generation::begin_locked() {
  if (began_ || !s_.stream || finished_) return;
  began_ = true;
  s_.out->stream_begin({.status = 200, .content_type = "text/event-stream", .body = {}, .headers = {}});
  if (s_.chat)
    for (size_t i = 0; i < choices_.size(); ++i) s_.out->stream_write(chunk_json(i, "", nullptr, true));
}

void Generation::attach(size_t choice, std::shared_ptr<SequenceHandle> handle) {
  std::lock_guard<std::mutex> lock(mu_);
  choices_[choice].handle = std::move(handle);
  // The answer may be over already (a stop string matched, another choice failed): the sequence leaves.
  if (finished_ || choices_[choice].finish) choices_[choice].handle->finish();
}

void Generation::emit_locked(size_t choice, const std::string& piece) {
  if (piece.empty()) return;
  if (s_.stream) {
    begin_locked();
    s_.out->stream_write(chunk_json(choice, piece, nullptr, false));
  } else {
    choices_[choice].text += piece;
  }
}

void Generation::on_event(size_t index, const SequenceEvent& e) {
  std::lock_guard<std::mutex> lock(mu_);
  Choice& c = choices_[index];
  if (finished_ || c.finish) return;
  c.n_prompt = e.n_prompt;
  c.n_generated = e.n_generated;
  for (TokenId id : e.tokens) {
    emit_locked(index, c.stops.push(c.detok.push(id)));
    if (c.stops.matched()) {
      if (c.handle) c.handle->finish();  // the sequence leaves at the next step
      return end_choice_locked(index, "stop", e);
    }
  }
  if (!e.done) return;
  switch (e.reason) {
    case FinishReason::STOP:
    case FinishReason::LENGTH:
      emit_locked(index, c.stops.push(c.detok.flush()));
      if (!c.stops.matched()) emit_locked(index, c.stops.flush());
      return end_choice_locked(index, e.reason == FinishReason::LENGTH && !c.stops.matched() ? "length" : "stop", e);
    case FinishReason::CANCELLED:
      if (c.handle && c.handle->leave_reason() == FinishReason::CANCELLED) {  // the client left
        finished_ = true;
        s_.count_outcome("cancelled");
        if (s_.stream) s_.out->stream_end();
        settle();
        return;
      }
      // Not asked for by the client: the server is stopping. Said as an error, never as a finished answer.
      return fail_locked(503, e.error.empty() ? "the server is shutting down" : e.error, "server_shutting_down");
    case FinishReason::ERROR:
    case FinishReason::NONE:
      return fail_locked(500, e.error.empty() ? "generation failed" : e.error, "generation_failed");
  }
}

void Generation::end_choice_locked(size_t index, const char* reason, const SequenceEvent& e) {
  Choice& c = choices_[index];
  c.finish = reason;
  c.n_prompt = e.n_prompt;
  c.n_generated = e.n_generated;
  if (s_.stream) {
    begin_locked();
    s_.out->stream_write(chunk_json(index, "", reason, false));
  }
  if (--open_choices_ == 0) complete_locked();
}

void Generation::complete_locked() {
  finished_ = true;
  int64_t n_prompt = 0, n_generated = 0;
  for (const Choice& c : choices_) {
    n_prompt += c.n_prompt;
    n_generated += c.n_generated;
  }
  s_.out->set_tokens(n_prompt, n_generated);
  s_.count_outcome(choices_.size() == 1 ? choices_[0].finish : "stop");
  const char* object = s_.chat ? "chat.completion" : "text_completion";
  if (s_.stream) {
    std::string tail;
    if (s_.include_usage) {
      tail = "data: " +
             dump({{"id", s_.id}, {"object", s_.chat ? "chat.completion.chunk" : "text_completion"},
                   {"created", s_.created}, {"model", s_.model}, {"choices", json::array()},
                   {"usage", usage_json(n_prompt, n_generated)}}) +
             "\n\n";
    }
    return finish_bytes_locked(tail + "data: [DONE]\n\n");
  }
  json list = json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    json c = {{"index", i}, {"logprobs", nullptr}, {"finish_reason", choices_[i].finish}};
    if (s_.chat) c["message"] = {{"role", "assistant"}, {"content", choices_[i].text}};
    else c["text"] = choices_[i].text;
    list.push_back(std::move(c));
  }
  const json body = {{"id", s_.id}, {"object", object}, {"created", s_.created}, {"model", s_.model},
                     {"choices", list}, {"usage", usage_json(n_prompt, n_generated)}};
  s_.out->reply({.status = 200, .content_type = "application/json", .body = dump(body), .headers = {}});
  settle();
}

void Generation::fail(int status, const std::string& message, const std::string& code) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!finished_) fail_locked(status, message, code);
}

void Generation::fail_locked(int status, const std::string& message, const std::string& code) {
  finished_ = true;
  s_.count_outcome("error");
  for (Choice& c : choices_)
    if (c.handle) c.handle->finish();
  int64_t n_prompt = 0, n_generated = 0;
  for (const Choice& c : choices_) {
    n_prompt += c.n_prompt;
    n_generated += c.n_generated;
  }
  s_.out->set_tokens(n_prompt, n_generated);
  s_.out->set_note(code);
  const ApiError e{.status = status, .message = message, .type = status == 503 ? "unavailable_error" : "server_error",
                   .code = code, .param = {}};
  if (s_.stream && began_) {
    // The 200 head has gone: the error travels as an event (as llama-server sends it; the openai client
    // raises it as an APIError), and no [DONE] follows, so no client takes the stream for a whole answer.
    return finish_bytes_locked("data: " + api_error_json(e) + "\n\n");
  }
  s_.out->reply({.status = status, .content_type = "application/json", .body = api_error_json(e), .headers = {}});
  settle();
}

void Generation::finish_bytes_locked(std::string last) {
  s_.out->stream_write_then(std::move(last), [token = settle_] { token->fire(); });
  s_.out->stream_end();
}

void Generation::client_gone() {
  std::lock_guard<std::mutex> lock(mu_);
  for (Choice& c : choices_)
    if (c.handle) c.handle->cancel();
  settle();
}

}  // namespace essaim::serve
