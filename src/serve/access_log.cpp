#include "serve/access_log.h"

namespace essaim::serve {

std::string access_line_text(const AccessLine& l) {
  std::string s = l.method + " " + l.path + " " + std::to_string(l.status);
  if (l.prompt_tokens >= 0) s += " prompt=" + std::to_string(l.prompt_tokens);
  if (l.completion_tokens >= 0) s += " completion=" + std::to_string(l.completion_tokens);
  s += " " + std::to_string(l.ms) + " ms";
  if (!l.note.empty()) s += " (" + l.note + ")";
  return s;
}

LoggedResponder::LoggedResponder(std::shared_ptr<net::HttpResponder> inner, std::string method, std::string path,
                                 AccessLogFn log)
    : inner_(std::move(inner)), log_(std::move(log)) {
  // The path only: a query string could carry what a client did not mean to have logged.
  line_.method = std::move(method);
  line_.path = std::move(path);
}

void LoggedResponder::set_tokens(int64_t prompt, int64_t completion) {
  std::lock_guard<std::mutex> lock(mu_);
  line_.prompt_tokens = prompt;
  line_.completion_tokens = completion;
}

void LoggedResponder::set_note(std::string note) {
  std::lock_guard<std::mutex> lock(mu_);
  line_.note = std::move(note);
}

void LoggedResponder::reply(net::HttpReply reply) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    line_.status = reply.status;
    answered_ = true;
  }
  inner_->reply(std::move(reply));
  write_line({});
}

void LoggedResponder::stream_begin(net::HttpReply head) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    line_.status = head.status;
  }
  inner_->stream_begin(std::move(head));
}

void LoggedResponder::stream_end() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    answered_ = true;
  }
  inner_->stream_end();
  write_line({});
}

void LoggedResponder::on_disconnect(std::function<void()> callback) {
  std::weak_ptr<LoggedResponder> weak = weak_from_this();  // the connection must not keep this alive
  inner_->on_disconnect([weak, callback = std::move(callback)] {
    if (auto self = weak.lock()) self->write_line("client gone");
    if (callback) callback();
  });
}

void LoggedResponder::write_line(const std::string& note) {
  AccessLine line;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (written_) return;
    written_ = true;
    line_.ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start_).count();
    if (!answered_ && !note.empty()) line_.note = note;
    line = line_;
  }
  if (log_) log_(access_line_text(line));
}

}  // namespace essaim::serve
