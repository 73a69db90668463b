// One generation request in flight, from the scheduler's token events to the HTTP answer: streaming
// detokenisation, stop strings, one choice per prompt (/v1/completions takes lists of prompts), SSE chunks
// or one JSON body, usage, and the ending — finished, failed, or cut by shutdown, which a stream reports as
// an error event so a client never mistakes it for a complete answer. Thread-safe: events arrive on the
// scheduler thread, attach() on an I/O thread.
//
//   auto g = std::make_shared<Generation>(GenerationSetup{.out = logged, .chat = true, ...});
//   g->attach(0, sched.submit(req, [g](const SequenceEvent& e) { g->on_event(0, e); }).handle);
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <optional>

#include <nlohmann/json.hpp>

#include "serve/access_log.h"
#include "serve/chat_output.h"
#include "serve/scheduler.h"
#include "serve/stop_strings.h"
#include "text/tokenizer.h"

namespace essaim::serve {

struct GenerationSetup {
  std::shared_ptr<LoggedResponder> out;
  const Tokenizer* tokenizer = nullptr;
  bool chat = true;
  bool anthropic = false;     // chat answered in Anthropic's Messages shapes (serve/anthropic_api.h)
  int32_t prompt_tokens = 0;  // anthropic: message_start's input_tokens
  bool stream = false;
  bool include_usage = false;
  std::string id;
  std::string model;
  int64_t created = 0;
  std::vector<std::string> stop;
  size_t n_choices = 1;
  // Chat: where the prompt left the model (inside <think>) and the tools it was offered (their calls are
  // parsed out of the text; null or empty: none are).
  bool in_reasoning = false;
  nlohmann::ordered_json tools;
  // --reasoning-budget N > 0: after N tokens of reasoning, `close_reasoning` ("\n</think>\n\n" as ids) is
  // forced in, and the model goes on to its answer.
  int32_t reasoning_budget = -1;
  std::vector<TokenId> close_reasoning;
  std::function<void(const std::string& outcome)> count_outcome;  // "stop", "length", "error", "cancelled", ...
  std::function<void()> settled;  // once: the last bytes are written, or the client is gone
};

class Generation : public std::enable_shared_from_this<Generation> {
 public:
  explicit Generation(GenerationSetup setup);
  // The stream's head and first chunk (streams only); call once every choice is submitted.
  void begin();
  void attach(size_t choice, std::shared_ptr<SequenceHandle> handle);
  void on_event(size_t choice, const SequenceEvent& e);
  void client_gone();  // cancels every choice
  // Fails the whole answer (500 or an error event), cancelling every choice.
  void fail(int status, const std::string& message, const std::string& code);

 private:
  struct Choice {
    Detokenizer detok;
    StopMatcher stops;
    std::shared_ptr<SequenceHandle> handle;
    std::string text;            // non-streaming: the whole answer (content)
    std::string reasoning;       // non-streaming chat: reasoning_content
    nlohmann::ordered_json calls = nlohmann::ordered_json::array();  // non-streaming chat: tool_calls
    std::optional<ChatOutputSplitter> split;  // chat only
    int32_t reasoning_tokens = 0;
    nlohmann::ordered_json blocks = nlohmann::ordered_json::array();  // anthropic, whole answer: content blocks
    int block_index = -1;      // anthropic stream: the open content block, if block_open
    bool block_open = false;
    ChatDelta::Kind block_kind = ChatDelta::Kind::CONTENT;
    const char* finish = nullptr;  // set once the choice is over
    int32_t n_prompt = 0;
    int32_t n_generated = 0;
  };
  void begin_locked();
  void emit_locked(size_t choice, const std::string& piece);
  void emit_deltas_locked(size_t choice, const std::vector<ChatDelta>& deltas);
  void anthropic_delta_locked(Choice& c, const ChatDelta& d);
  std::string anthropic_close_block_locked(Choice& c);
  std::string anthropic_message_locked(const Choice& c, int64_t n_prompt, int64_t n_generated) const;
  void end_choice_locked(size_t choice, const char* reason, const SequenceEvent& e);
  void complete_locked();
  void fail_locked(int status, const std::string& message, const std::string& code);
  void finish_bytes_locked(std::string last_sse);  // stream: last bytes, then close; settles once written
  // One SSE event: a chat chunk with `delta`, or a completion chunk with `delta["text"]`.
  std::string chunk_json(size_t choice, const nlohmann::ordered_json& delta, const char* finish_reason) const;
  nlohmann::ordered_json tool_call_json(const ToolCall& call) const;
  static nlohmann::ordered_json message_json(const Choice& c);
  // Fires `settled` once: when fired, or when the last holder lets go (a write callback the connection
  // dropped unrun), so a shutdown waiting on it is never left hanging.
  struct SettleToken {
    std::function<void()> fn;
    std::atomic<bool> done{false};
    void fire() {
      if (!done.exchange(true) && fn) fn();
    }
    ~SettleToken() { fire(); }
  };
  void settle() { settle_->fire(); }

  GenerationSetup s_;
  std::shared_ptr<SettleToken> settle_ = std::make_shared<SettleToken>();
  std::mutex mu_;
  std::vector<Choice> choices_;
  size_t open_choices_;
  bool began_ = false;
  bool finished_ = false;
};

}  // namespace essaim::serve
