// Hostile clients against a whole `essaim serve` (the in-process Server over the tiny synth model, with its
// real API, authorizer and HTTP listener), label sanitize: the cases of issue 46 seen from the service a
// user runs. A chunked body's trailer with one field over 64 KiB; trailers of megabytes never finished; a
// handler that throws (the dispatcher's counters, read by /metrics); idle keep-alive connections that asked
// only /health or were refused 401; one address past --max-per-address. Every case ends with serve still
// answering a completion.
#include <gtest/gtest.h>

#include <cstdio>
#include <stdexcept>

#include "process_memory.h"
#include "raw_http_client.h"
#include "serve_test_util.h"

namespace essaim::serve::testing {
namespace {

using net::testing::RawClient;

const std::string kCompletion = R"({"prompt":"Hi","max_tokens":1,"temperature":0})";
const std::map<std::string, std::string> kKey = {{"Authorization", "Bearer k"}};

std::string chunked_head(const std::string& target = "/v1/completions") {
  return "POST " + target + " HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
}
std::string hex(size_t n) {
  char b[32];
  std::snprintf(b, sizeof b, "%zx", n);
  return b;
}

void expect_completing(uint16_t port, const std::map<std::string, std::string>& headers = {}) {
  const HttpResult r = http_call(port, "POST", "/v1/completions", kCompletion, headers, 20s);
  EXPECT_EQ(r.status, 200) << r.error << r.body;
}

using test_support::rss_kib;

// Before (adf167f): Beast threw std::length_error on an I/O thread and serve died with SIGABRT, before any
// key was looked at.
TEST(ServeListenerHostile, ATrailerFieldOver64KiBIsRefusedAndServeLives) {
  auto server = start_server({.parallel = 1, .api_key = "k"});
  ASSERT_TRUE(server);
  for (const bool keyed : {false, true}) {
    RawClient c(server->port());
    ASSERT_TRUE(c.connected());
    std::string head = chunked_head();
    if (keyed) head.insert(head.size() - 2, "Authorization: Bearer k\r\n");
    c.send(head + hex(kCompletion.size()) + "\r\n" + kCompletion + "\r\n0\r\nX-Big: " + std::string(70000, 'a') +
           "\r\n\r\n");
    const std::string r = c.read_response(5s);
    // Without the key the 401 comes from the head, before the body; with it, the trailer is refused.
    EXPECT_TRUE(r.starts_with(keyed ? "HTTP/1.1 431" : "HTTP/1.1 401")) << r.substr(0, 300);
  }
  expect_completing(server->port(), kKey);
}

// Before: each connection buffered its unfinished trailer (up to the body limit and beyond: the trailer was
// not counted) and got no answer until the read deadline; 8 of them grew serve by ~46 MB.
TEST(ServeListenerHostile, UnfinishedMegabyteTrailersAreRefusedAndCostLittle) {
  auto server = start_server({.parallel = 1, .read_deadline = 20s});
  ASSERT_TRUE(server);
  std::string fields;
  while (fields.size() < (2 << 20)) fields += "X-Pad: " + std::string(100, 'p') + "\r\n";
  const long before = rss_kib();
  std::vector<std::unique_ptr<RawClient>> clients;
  for (int i = 0; i < 8; ++i) {
    auto c = std::make_unique<RawClient>(server->port());
    c->send(chunked_head() + hex(kCompletion.size()) + "\r\n" + kCompletion + "\r\n0\r\n");
    c->send(fields);  // never the final empty line; fails once serve has refused and stopped reading
    clients.push_back(std::move(c));
  }
  const long during = rss_kib();
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& c : clients) {
    const std::string r = c->read_response(5s);
    EXPECT_TRUE(r.starts_with("HTTP/1.1 431")) << r.substr(0, 300);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  RecordProperty("rss_growth_kib", std::to_string(during - before));
  EXPECT_LT(during - before, 16 * 1024) << before << " -> " << during << " KiB";
  expect_completing(server->port());
}

// A handler that throws: the swarm dispatcher's counters, which /metrics reads on the I/O thread, fail.
// Before: the exception left the I/O thread and serve died (SIGABRT). Now that request gets a 500 with the
// error object and serve goes on.
TEST(ServeListenerHostile, AHandlerThatThrowsGets500AndServeLives) {
  ExecutorChoiceFn executor{
      .make = [](const Model& m, ThreadPool* pool) -> Result<std::unique_ptr<ExpertExecutor>> {
        return std::unique_ptr<ExpertExecutor>(std::make_unique<LocalExpertExecutor>(m.expert_store(), pool));
      },
      .stats = [](const ExpertExecutor&) -> std::optional<backbone::DispatchStats> {
        throw std::runtime_error("the dispatcher's counters are broken");
      }};
  auto server = start_server({.parallel = 1, .executor = executor});
  ASSERT_TRUE(server);
  for (int i = 0; i < 3; ++i) {
    const HttpResult m = http_call(server->port(), "GET", "/metrics", "", {}, 10s);
    expect_error_object(m, 500, "internal_error");
  }
  EXPECT_EQ(http_call(server->port(), "GET", "/health").status, 200);
  expect_completing(server->port());
}

// 300 keep-alive connections of one address that each asked /health (public) and stay open.
std::vector<std::unique_ptr<RawClient>> idle_health_flood(uint16_t port, size_t& served) {
  std::vector<std::unique_ptr<RawClient>> held;
  served = 0;
  for (int i = 0; i < 300; ++i) {
    auto c = std::make_unique<RawClient>(port, "127.0.0.1");
    c->send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    served += c->read_response(5s).starts_with("HTTP/1.1 200");
    held.push_back(std::move(c));
  }
  return held;
}

// Without --api-key. Before: any complete request made its connection authenticated, so 300 idle
// connections that had asked /health held every one of the 256 slots: from the 257th on, every connection
// (the flood's and a real client's, from any address) got 503 until they left.
TEST(ServeListenerHostile, IdleHealthProbesCannotLockOutAClient) {
  auto server = start_server({.parallel = 1});
  ASSERT_TRUE(server);
  size_t served = 0;
  auto held = idle_health_flood(server->port(), served);
  EXPECT_EQ(served, 300u);  // each is served; the oldest idle ones are evicted to admit the next
  const auto t0 = std::chrono::steady_clock::now();
  expect_completing(server->port());
  RawClient other(server->port(), "127.0.0.2");
  other.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(kCompletion.size()) +
             "\r\n\r\n" + kCompletion);
  const std::string r = other.read_response(20s);
  EXPECT_TRUE(r.starts_with("HTTP/1.1 200")) << r.substr(0, 300);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s);
}

// With --api-key: connections refused 401 are closed (never authenticated), /health probes stay
// unauthenticated and evictable, so a keyed client of the same address is served at once.
TEST(ServeListenerHostile, RefusedAndPublicConnectionsCannotLockOutAKeyedClient) {
  auto server = start_server({.parallel = 1, .api_key = "k"});
  ASSERT_TRUE(server);
  size_t refused = 0;
  std::vector<std::unique_ptr<RawClient>> held;
  for (int i = 0; i < 150; ++i) {
    auto c = std::make_unique<RawClient>(server->port(), "127.0.0.1");
    c->send("GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n\r\n");
    refused += c->read_response(5s).starts_with("HTTP/1.1 401");
    held.push_back(std::move(c));
  }
  EXPECT_EQ(refused, 150u);
  size_t served = 0;
  auto probes = idle_health_flood(server->port(), served);
  EXPECT_EQ(served, 300u);
  const auto t0 = std::chrono::steady_clock::now();
  expect_completing(server->port(), kKey);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s);
  const HttpResult metrics = http_call(server->port(), "GET", "/metrics", "", kKey);
  ASSERT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.body.find("essaim_serve_requests_total{outcome=\"unauthorized\"} 150"), std::string::npos)
      << metrics.body.substr(0, 2000);
}

// --max-per-address 4: authenticated connections of one address past 4 get 503 (another address is still
// served), and unauthenticated ones past 4 evict the oldest of that address (told 503 before the close).
// Before: no per-address cap on authenticated connections (max_per_address did not exist): one address
// could hold every slot.
TEST(ServeListenerHostile, PerAddressCapAndEviction) {
  auto server = start_server({.parallel = 1, .api_key = "k", .max_per_address = 4});
  ASSERT_TRUE(server);
  const uint16_t port = server->port();
  const std::string keyed_models = "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n\r\n";
  std::vector<std::unique_ptr<RawClient>> mine;
  std::vector<std::string> answers;
  for (int i = 0; i < 6; ++i) {
    auto c = std::make_unique<RawClient>(port, "127.0.0.3");
    c->send(keyed_models);
    answers.push_back(c->read_response(5s).substr(0, 12));
    mine.push_back(std::move(c));
  }
  EXPECT_EQ(answers, (std::vector<std::string>{"HTTP/1.1 200", "HTTP/1.1 200", "HTTP/1.1 200", "HTTP/1.1 200",
                                               "HTTP/1.1 503", "HTTP/1.1 503"}));
  RawClient other(port, "127.0.0.4");
  other.send(keyed_models);
  EXPECT_TRUE(other.read_response(5s).starts_with("HTTP/1.1 200"));
  // Ten idle connections of one address: the six oldest are evicted, each told why.
  std::vector<std::unique_ptr<RawClient>> idle;
  for (int i = 0; i < 10; ++i) idle.push_back(std::make_unique<RawClient>(port, "127.0.0.5"));
  size_t evicted = 0;
  for (auto& c : idle) {
    const std::string r = c->read_response(std::chrono::milliseconds(evicted < 6 ? 2000 : 200));
    if (r.starts_with("HTTP/1.1 503") && r.find("too_many_connections") != std::string::npos) ++evicted;
  }
  EXPECT_EQ(evicted, 6u);
  RawClient late(port, "127.0.0.5");
  late.send(keyed_models);
  EXPECT_TRUE(late.read_response(5s).starts_with("HTTP/1.1 200"));
  expect_completing(port, kKey);
}

}  // namespace
}  // namespace essaim::serve::testing
