// One access-log line per request: method, path, status, tokens and milliseconds — never prompt or answer
// text. A responder wrapper sees the status as it goes out and writes the line once the response is
// complete, or when the client leaves first.
//
//   auto logged = std::make_shared<LoggedResponder>(out, "POST", "/v1/completions", log);
//   logged->set_tokens(12, 8);     // from the generation, before its final write
//   logged->reply({.status = 200, .body = "..."});
//   // log("POST /v1/completions 200 prompt=12 completion=8 35 ms")
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "net/http_server.h"

namespace essaim::serve {

using AccessLogFn = std::function<void(const std::string& line)>;

struct AccessLine {
  std::string method;
  std::string path;
  int status = 0;
  int64_t prompt_tokens = -1;      // -1: not a generation
  int64_t completion_tokens = -1;
  int64_t ms = 0;
  std::string note;  // "client gone", or empty
};
// "POST /v1/completions 200 prompt=12 completion=8 35 ms" (tokens only for generations; note at the end).
std::string access_line_text(const AccessLine& line);

class LoggedResponder final : public net::HttpResponder, public std::enable_shared_from_this<LoggedResponder> {
 public:
  LoggedResponder(std::shared_ptr<net::HttpResponder> inner, std::string method, std::string path, AccessLogFn log);
  void set_tokens(int64_t prompt, int64_t completion);
  void set_note(std::string note);  // why an answer ended early ("server_shutting_down", ...)

  void reply(net::HttpReply reply) override;
  void stream_begin(net::HttpReply head) override;
  void stream_write(std::string bytes) override { inner_->stream_write(std::move(bytes)); }
  void stream_write_then(std::string bytes, std::function<void()> written) override {
    inner_->stream_write_then(std::move(bytes), std::move(written));
  }
  void stream_end() override;
  void on_disconnect(std::function<void()> callback) override;

 private:
  void write_line(const std::string& note);  // once

  std::shared_ptr<net::HttpResponder> inner_;
  AccessLogFn log_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::mutex mu_;
  AccessLine line_;
  bool answered_ = false;  // reply() or stream_end() called: a disconnect after is no "client gone"
  bool written_ = false;
};

}  // namespace essaim::serve
