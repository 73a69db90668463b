// A load of streaming OpenAI requests against one server, as concurrent clients send them: each request
// is sent at its arrival time (or as soon as one of `max_in_flight` client connections is free, whichever is
// later), and its server-sent events are timed as they arrive. The same code drives `essaim serve` and
// llama-server (both speak /v1/completions and /v1/chat/completions with `stream: true`).
//
//   std::vector<LoadRequest> reqs = {{.arrival_s = 0.0, .body = R"({"prompt":"...","stream":true,...})"}};
//   std::vector<LoadResult> got = run_streaming_load({.port = 8080, .target = "/v1/completions",
//                                                     .max_in_flight = 4}, reqs);
//   // got[i].sent_s, first_s, chunk_s (one time per event that carried text), completion_tokens (usage)
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace essaim::bench {

struct LoadRequest {
  double arrival_s = 0;  // since the load started
  std::string body;      // JSON with "stream": true (and stream_options.include_usage for token counts)
};

struct LoadResult {
  bool ok = false;
  std::string error;             // why not ok: the transport, a non-200 status, an error event
  double sent_s = 0;             // connection opened and request written (times since the load started)
  double first_s = 0;            // the first event carrying text
  double done_s = 0;             // the end of the stream
  std::vector<double> chunk_s;   // every event carrying text, in order
  int64_t prompt_tokens = -1;    // from the usage chunk; -1 without one
  int64_t completion_tokens = -1;
  std::string text;              // the streamed text (content and reasoning), for comparisons between runs
};

struct LoadOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  std::string target = "/v1/completions";
  int max_in_flight = 1;                       // client connections (one request each at a time)
  std::chrono::milliseconds timeout{600'000};  // per request: the longest silence in a stream
};

// Runs every request (one thread per client connection) and returns their results in request order.
std::vector<LoadResult> run_streaming_load(const LoadOptions& options, std::span<const LoadRequest> requests);

// The incremental parser of one SSE stream: feed() bytes as they come; each complete `data:` event is
// applied to `into` at time `now_s`. Exposed for tests.
class SseTimer {
 public:
  static constexpr size_t kMaxEventBytes = 1 << 20;  // a longer event is an error, not a growing buffer
  explicit SseTimer(LoadResult& into) : into_(into) {}
  void feed(std::string_view bytes, double now_s);

 private:
  void event(std::string_view data, double now_s);
  LoadResult& into_;
  std::string pending_;
};

}  // namespace essaim::bench
