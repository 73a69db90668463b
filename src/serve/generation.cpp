#include "serve/generation.h"

#include <nlohmann/json.hpp>

#include "serve/anthropic_api.h"
#include "serve/api_request.h"

namespace essaim::serve {
namespace {

using json = nlohmann::ordered_json;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json usage_json(int64_t n_prompt, int64_t n_generated) {
  return {{"prompt_tokens", n_prompt}, {"completion_tokens", n_generated}, {"total_tokens", n_prompt + n_generated}};
}

}  // namespace

// The assistant message of a whole answer: content (null when the answer is only tool calls), reasoning_content
// when the model reasoned, tool_calls when it called.
json Generation::message_json(const Choice& c) {
  json m = {{"role", "assistant"}};
  m["content"] = c.calls.empty() || !c.text.empty() ? json(c.text) : json(nullptr);
  if (!c.reasoning.empty()) m["reasoning_content"] = c.reasoning;
  if (!c.calls.empty()) m["tool_calls"] = c.calls;
  return m;
}

Generation::Generation(GenerationSetup setup) : s_(std::move(setup)), open_choices_(s_.n_choices) {
  settle_->fn = s_.settled;
  choices_.reserve(s_.n_choices);
  for (size_t i = 0; i < s_.n_choices; ++i)
    choices_.push_back(Choice{.detok = Detokenizer(*s_.tokenizer), .stops = StopMatcher(s_.stop), .handle = {},
                              .text = {}, .reasoning = {}, .calls = json::array(), .split = std::nullopt,
                              .reasoning_tokens = 0, .blocks = json::array(), .block_index = -1,
                              .block_open = false, .block_kind = ChatDelta::Kind::CONTENT, .finish = nullptr, .n_prompt = 0, .n_generated = 0});
  if (s_.chat)
    for (Choice& c : choices_) c.split.emplace(ChatOutputOptions{.in_reasoning = s_.in_reasoning, .tools = &s_.tools});
}

std::string Generation::chunk_json(size_t choice, const json& delta, const char* finish_reason) const {
  json c = {{"index", choice}};
  if (s_.chat) c["delta"] = delta;
  else c["text"] = delta.value("text", "");
  c["logprobs"] = nullptr;
  c["finish_reason"] = finish_reason ? json(finish_reason) : json(nullptr);
  return "data: " +
         dump({{"id", s_.id}, {"object", s_.chat ? "chat.completion.chunk" : "text_completion"}, {"created", s_.created},
               {"model", s_.model}, {"choices", json::array({c})}}) +
         "\n\n";
}

json Generation::tool_call_json(const ToolCall& call) const {
  return {{"id", "call_" + s_.id.substr(s_.id.find('-') + 1) + "_" + std::to_string(call.index)},
          {"type", "function"},
          {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
}

void Generation::begin() {
  std::lock_guard<std::mutex> lock(mu_);
  begin_locked();
}

void Generation::begin_locked() {
  if (began_ || !s_.stream || finished_) return;
  began_ = true;
  s_.out->stream_begin({.status = 200, .content_type = "text/event-stream", .body = {}, .headers = {}});
  if (s_.anthropic) {
    json message = {{"id", s_.id}, {"type", "message"}, {"role", "assistant"}, {"model", s_.model},
                    {"content", json::array()}, {"stop_reason", nullptr}, {"stop_sequence", nullptr},
                    {"usage", {{"input_tokens", s_.prompt_tokens}, {"output_tokens", 0}}}};
    s_.out->stream_write(anthropic_event("message_start", {{"type", "message_start"}, {"message", message}}));
    return;
  }
  if (s_.chat)
    for (size_t i = 0; i < choices_.size(); ++i)
      s_.out->stream_write(chunk_json(i, {{"role", "assistant"}, {"content", ""}}, nullptr));
}

void Generation::attach(size_t choice, std::shared_ptr<SequenceHandle> handle) {
  std::lock_guard<std::mutex> lock(mu_);
  choices_[choice].handle = std::move(handle);
  // The answer may be over already (a stop string matched, another choice failed): the sequence leaves.
  if (finished_ || choices_[choice].finish) choices_[choice].handle->finish();
}

void Generation::emit_locked(size_t choice, const std::string& piece) {
  if (piece.empty()) return;
  Choice& c = choices_[choice];
  if (c.split) return emit_deltas_locked(choice, c.split->push(piece));
  if (s_.stream) {
    begin_locked();
    s_.out->stream_write(chunk_json(choice, {{"text", piece}}, nullptr));
  } else {
    c.text += piece;
  }
}

// A tool call streams as OpenAI's do: its id, type and name with empty arguments, then the arguments.
void Generation::emit_deltas_locked(size_t choice, const std::vector<ChatDelta>& deltas) {
  Choice& c = choices_[choice];
  for (const ChatDelta& d : deltas) {
    if (s_.anthropic) {
      anthropic_delta_locked(c, d);
      continue;
    }
    if (!s_.stream) {
      if (d.kind == ChatDelta::Kind::CONTENT) c.text += d.text;
      else if (d.kind == ChatDelta::Kind::REASONING) c.reasoning += d.text;
      else c.calls.push_back(tool_call_json(d.call));
      continue;
    }
    begin_locked();
    if (d.kind == ChatDelta::Kind::CONTENT) {
      s_.out->stream_write(chunk_json(choice, {{"content", d.text}}, nullptr));
    } else if (d.kind == ChatDelta::Kind::REASONING) {
      s_.out->stream_write(chunk_json(choice, {{"reasoning_content", d.text}}, nullptr));
    } else {
      json head = tool_call_json(d.call);
      head["function"]["arguments"] = "";
      head = {{"index", d.call.index}, {"id", head["id"]}, {"type", "function"}, {"function", head["function"]}};
      s_.out->stream_write(chunk_json(choice, {{"tool_calls", json::array({head})}}, nullptr));
      const json args = {{"index", d.call.index}, {"function", {{"arguments", d.call.arguments}}}};
      s_.out->stream_write(chunk_json(choice, {{"tool_calls", json::array({args})}}, nullptr));
    }
  }
}

void Generation::on_event(size_t index, const SequenceEvent& e) {
  std::lock_guard<std::mutex> lock(mu_);
  Choice& c = choices_[index];
  if (finished_ || c.finish) return;
  c.n_prompt = e.n_prompt;
  c.n_generated = e.n_generated;
  for (TokenId id : e.tokens) {
    if (c.split && c.split->in_reasoning() && s_.reasoning_budget > 0 && e.handle != nullptr &&
        ++c.reasoning_tokens == s_.reasoning_budget)
      e.handle->force(s_.close_reasoning);  // sampled next, in place of the model's choice
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
  if (c.split) {
    emit_deltas_locked(index, c.split->finish());
    if (c.split->tool_calls() > 0 && std::string_view(reason) == "stop") reason = "tool_calls";
  }
  c.finish = reason;
  c.n_prompt = e.n_prompt;
  c.n_generated = e.n_generated;
  if (s_.stream && !s_.anthropic) {
    begin_locked();
    s_.out->stream_write(chunk_json(index, json::object(), reason));
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
  if (s_.anthropic) {
    if (!s_.stream) {
      s_.out->reply({.status = 200, .content_type = "application/json",
                     .body = anthropic_message_locked(choices_[0], n_prompt, n_generated), .headers = {}});
      return settle();
    }
    Choice& c = choices_[0];
    std::string tail = anthropic_close_block_locked(c);
    tail += anthropic_event("message_delta",
                            {{"type", "message_delta"},
                             {"delta", {{"stop_reason", anthropic_stop_reason(c.finish, c.stops.matched())}, {"stop_sequence", nullptr}}},
                             {"usage", {{"output_tokens", n_generated}}}});
    return finish_bytes_locked(tail + anthropic_event("message_stop", {{"type", "message_stop"}}));
  }
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
    if (s_.chat) c["message"] = message_json(choices_[i]);
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
  if (s_.anthropic) {
    if (s_.stream && began_)
      return finish_bytes_locked(anthropic_event("error", json::parse(anthropic_error_json(e))));
    s_.out->reply({.status = status, .content_type = "application/json", .body = anthropic_error_json(e), .headers = {}});
    return settle();
  }
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

namespace essaim::serve {

// Anthropic: a whole answer collects its blocks in order (consecutive text or thinking merged); a stream opens a
// block when the kind changes (content_block_start), sends its deltas, and closes it (content_block_stop).
void Generation::anthropic_delta_locked(Choice& c, const ChatDelta& d) {
  const std::string call_id = "toolu_" + s_.id.substr(s_.id.find('_') + 1) + "_" + std::to_string(d.call.index);
  if (!s_.stream) {
    const bool merge = d.kind != ChatDelta::Kind::TOOL_CALL && !c.blocks.empty() &&
                       c.blocks.back()["type"] == anthropic_block(d, call_id)["type"];
    if (!merge) c.blocks.push_back(anthropic_block(d, call_id));
    else if (d.kind == ChatDelta::Kind::CONTENT) c.blocks.back()["text"] = c.blocks.back()["text"].get<std::string>() + d.text;
    else c.blocks.back()["thinking"] = c.blocks.back()["thinking"].get<std::string>() + d.text;
    return;
  }
  begin_locked();
  std::string bytes;
  if (!c.block_open || c.block_kind != d.kind || d.kind == ChatDelta::Kind::TOOL_CALL) {
    bytes += anthropic_close_block_locked(c);
    json start = anthropic_block(d, call_id);
    if (d.kind == ChatDelta::Kind::CONTENT) start["text"] = "";
    if (d.kind == ChatDelta::Kind::REASONING) start["thinking"] = "";
    if (d.kind == ChatDelta::Kind::TOOL_CALL) start["input"] = json::object();
    c.block_open = true;
    c.block_kind = d.kind;
    ++c.block_index;
    bytes += anthropic_event("content_block_start", {{"type", "content_block_start"}, {"index", c.block_index}, {"content_block", start}});
  }
  json delta;
  if (d.kind == ChatDelta::Kind::CONTENT) delta = {{"type", "text_delta"}, {"text", d.text}};
  else if (d.kind == ChatDelta::Kind::REASONING) delta = {{"type", "thinking_delta"}, {"thinking", d.text}};
  else delta = {{"type", "input_json_delta"}, {"partial_json", d.call.arguments}};
  bytes += anthropic_event("content_block_delta", {{"type", "content_block_delta"}, {"index", c.block_index}, {"delta", delta}});
  s_.out->stream_write(std::move(bytes));
}

std::string Generation::anthropic_close_block_locked(Choice& c) {
  if (!c.block_open) return {};
  c.block_open = false;
  return anthropic_event("content_block_stop", {{"type", "content_block_stop"}, {"index", c.block_index}});
}

std::string Generation::anthropic_message_locked(const Choice& c, int64_t n_prompt, int64_t n_generated) const {
  const json body = {{"id", s_.id}, {"type", "message"}, {"role", "assistant"}, {"model", s_.model},
                     {"content", c.blocks}, {"stop_reason", anthropic_stop_reason(c.finish, c.stops.matched())},
                     {"stop_sequence", nullptr},
                     {"usage", {{"input_tokens", n_prompt}, {"output_tokens", n_generated}}}};
  return dump(body);
}

}  // namespace essaim::serve
