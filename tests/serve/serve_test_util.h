// Helpers of the serve tests: an in-process `essaim serve` on a tiny synth model and a port the OS chooses,
// a small Beast HTTP client with deadlines (whole responses, and streams it can drop mid-way), and an
// expert executor that adds a fixed delay per layer call (the real local computation, only slower) so that
// long generations last long enough to be cancelled or to fill a queue.
//
//   auto srv = start_server({.parallel = 2});
//   HttpResult r = http_call(srv->port(), "POST", "/v1/completions", R"({"prompt":"Hi","max_tokens":4})");
//   EXPECT_EQ(r.status, 200);
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moe/executor.h"
#include "serve/server.h"

namespace essaim::serve::testing {

using namespace std::chrono_literals;
using json = nlohmann::json;

// The tiny qwen3moe q4_k_m synth model the backbone tests use (written once per test program).
const std::string& tiny_model_path();

struct TestServerOptions {
  int32_t parallel = 4;
  int32_t queue_capacity = 64;
  int32_t n_ctx = 512;
  int32_t batch_tokens = 64;
  std::string api_key;
  size_t max_body_bytes = 1 << 20;
  int32_t max_connections = 256;
  std::chrono::milliseconds read_deadline{30'000};
  size_t max_unauthenticated_per_address = net::HttpLimits{}.max_unauthenticated_per_address;
  size_t max_per_address = net::HttpLimits{}.max_per_address;  // --max-per-address
  std::chrono::milliseconds delay_per_layer_call{0};  // > 0: a DelayedExecutor around the local replica
  ExecutorChoiceFn executor;                           // overrides the above when set
};
std::unique_ptr<Server> start_server(const TestServerOptions& o = {});

struct HttpResult {
  int status = 0;  // 0: no answer (the error says why)
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  std::string error;
};
HttpResult http_call(uint16_t port, const std::string& method, const std::string& target, const std::string& body = {},
                     const std::map<std::string, std::string>& headers = {}, std::chrono::milliseconds timeout = 60s);

// Raw bytes to the server; returns what it answered before closing (bounded by `timeout`).
std::string raw_exchange(uint16_t port, const std::string& bytes, std::chrono::milliseconds timeout = 10s);

// Every "data: ..." payload of an SSE body, in order.
std::vector<std::string> sse_events(const std::string& body);

// Checks the OpenAI error object: {"error":{"message": non-empty string, "type": string, "code": ...}}.
void expect_error_object(const HttpResult& r, int status, const std::string& code = {});

// Polls `condition` every 10 ms until it holds or `timeout` passes; returns whether it held.
bool wait_until(const std::function<bool()>& condition, std::chrono::milliseconds timeout = 20s);

// A streaming request left open: reads the head and the first events, then close() drops the connection.
class OpenStream {
 public:
  OpenStream(uint16_t port, const std::string& target, const std::string& body);
  ~OpenStream();
  bool read_events(size_t n, std::chrono::milliseconds timeout = 20s);  // true once n "data:" events arrived
  void close();
  int status() const { return status_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int status_ = 0;
};

// The local replica, plus a sleep before each layer call.
class DelayedExecutor final : public ExpertExecutor {
 public:
  DelayedExecutor(const ExpertStore& store, ThreadPool* pool, std::chrono::milliseconds delay)
      : local_(store, pool), delay_(delay) {}
  Status compute(const ExpertBatch& batch, std::span<float> out) override;

 private:
  LocalExpertExecutor local_;
  std::chrono::milliseconds delay_;
};

}  // namespace essaim::serve::testing
