// Concurrency stress of net::HttpServer, the listener of `essaim serve` and the coordinator (label tsan:
// scripts/test.sh runs it in the ThreadSanitizer build; it also runs, faster, with the unit tests). Sixteen
// clients on four I/O threads for a bounded time, each mixing what real and hostile clients do at once:
// keep-alive requests, answers given later from other threads, streams reset mid-way, refused keys, a
// handler that throws, garbage, idle connections evicted by newer ones; meanwhile the stats are read and
// the server is finally stopped with connections still open. Every answer that has a fixed status is
// checked, and the seeded mix is checked to have done every kind of operation.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "raw_http_client.h"
#include "net/http_server.h"

namespace essaim::net {
namespace {

using namespace std::chrono_literals;
using testing::RawClient;

struct Streamer : std::enable_shared_from_this<Streamer> {
  explicit Streamer(std::shared_ptr<HttpResponder> o) : out(std::move(o)) {}
  void next() {
    if (left-- == 0) return out->stream_end();
    out->stream_write_then(std::string(16 << 10, 'z'), [self = shared_from_this()] { self->next(); });
  }
  std::shared_ptr<HttpResponder> out;
  int left = 16;
};

// Answers handed to another thread, as the scheduler's thread answers serve's requests. Owned by the test
// and stopped after the server, so that no responder outlives the listener it points into.
class Deferred {
 public:
  Deferred() : thread_([this] { run(); }) {}
  ~Deferred() { stop(); }
  void push(std::shared_ptr<HttpResponder> out) {
    std::lock_guard lk(mu_);
    queue_.push_back(std::move(out));
    cv_.notify_one();
  }
  void stop() {
    {
      std::lock_guard lk(mu_);
      stopping_ = true;
      cv_.notify_one();
    }
    if (thread_.joinable()) thread_.join();
    queue_.clear();
  }

 private:
  void run() {
    std::unique_lock lk(mu_);
    while (!stopping_) {
      if (queue_.empty()) {
        cv_.wait(lk);
        continue;
      }
      std::shared_ptr<HttpResponder> out = std::move(queue_.front());
      queue_.pop_front();
      lk.unlock();
      out->reply({.status = 200, .content_type = "text/plain", .body = "later", .headers = {}});
      out.reset();
      lk.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<HttpResponder>> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

void handle(Deferred& deferred, const HttpRequestView& req, std::shared_ptr<HttpResponder> out) {
  if (req.target == "/throw") throw std::runtime_error("a handler's bug");
  if (req.target == "/later") return deferred.push(std::move(out));
  if (req.target == "/stream") {
    out->on_disconnect([] {});
    out->stream_begin({.status = 200, .content_type = "application/octet-stream", .body = {}, .headers = {}});
    std::make_shared<Streamer>(out)->next();
    return;
  }
  out->reply({.status = 200, .content_type = "text/plain", .body = req.body.empty() ? "ok" : req.body, .headers = {}});
}

enum class Op : uint8_t { KEEP_ALIVE, LATER, STREAM_RESET, WRONG_KEY, THROW, GARBAGE, IDLE_FLOOD, COUNT };

TEST(HttpServerStress, ManyConcurrentClientsMixingEveryKindOfRequest) {
  Deferred deferred;
  Result<std::unique_ptr<HttpServer>> listening = HttpServer::listen(
      "127.0.0.1", 0, {.api_key = "k", .max_unauthenticated_per_address = 8},
      [&deferred](const HttpRequestView& req, std::shared_ptr<HttpResponder> out) { handle(deferred, req, std::move(out)); },
      4);
  ASSERT_TRUE(listening) << listening.status().message();
  std::unique_ptr<HttpServer> server = std::move(*listening);
  const uint16_t port = server->port();
  const auto until = std::chrono::steady_clock::now() + 3s;
  std::array<std::atomic<uint64_t>, size_t(Op::COUNT)> done{};
  std::atomic<uint64_t> wrong{0}, evicted{0};
  std::vector<std::thread> clients;
  for (uint32_t t = 0; t < 16; ++t) {
    clients.emplace_back([&, t] {
      std::mt19937 rng(1234 + t);
      // Odd clients play one more host: evictions then happen per address and across addresses.
      const std::string from = t % 2 == 0 ? "127.0.0.1" : "127.0.0." + std::to_string(2 + t % 3);
      // At least 8 operations each however slow the build (TSan), then until the deadline.
      for (int i = 0; i < 400 && (i < 8 || std::chrono::steady_clock::now() < until); ++i) {
        const Op op = Op(rng() % uint32_t(Op::COUNT));
        auto expect = [&](const std::string& got, const char* status) {
          // An eviction can hit any connection still unauthenticated: a 503, or nothing when our request
          // arrived after the close and the reset came first. Nothing else may differ.
          if (got.starts_with(status)) return;
          if (got.empty() || got.starts_with("HTTP/1.1 503")) return void(++evicted);
          ++wrong;
          ADD_FAILURE() << "wanted " << status << ", got " << got.substr(0, 200);
        };
        RawClient c(port, from);
        if (!c.connected()) {
          ++wrong;
          continue;
        }
        switch (op) {
          case Op::KEEP_ALIVE:
            for (int k = 0; k < 5; ++k) {
              const std::string body(rng() % 2000, 'b');
              c.send("POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\nContent-Length: " +
                     std::to_string(body.size()) + "\r\n\r\n" + body);
              const std::string r = c.read_response(5s);
              expect(r, "HTTP/1.1 200");
              if (r.starts_with("HTTP/1.1 200") && !body.empty() && !r.ends_with(body)) ++wrong;
            }
            break;
          case Op::LATER:
            c.send("GET /later HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n\r\n");
            expect(c.read_response(5s), "HTTP/1.1 200");
            break;
          case Op::STREAM_RESET:
            c.send("GET /stream HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n\r\n");
            (void)c.read_all(std::chrono::milliseconds(rng() % 5));
            c.reset();
            break;
          case Op::WRONG_KEY:
            c.send("POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer nope\r\nContent-Length: 100000\r\n\r\n");
            expect(c.read_response(5s), "HTTP/1.1 401");
            break;
          case Op::THROW:
            c.send("GET /throw HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n\r\n");
            expect(c.read_response(5s), "HTTP/1.1 500");
            break;
          case Op::GARBAGE:
            c.send("\x16\x03\x01 not http\r\n\r\n");
            expect(c.read_response(5s), "HTTP/1.1 400");
            break;
          case Op::IDLE_FLOOD: {
            std::vector<std::unique_ptr<RawClient>> idle;
            for (int k = 0; k < 12; ++k) idle.push_back(std::make_unique<RawClient>(port, from));
            break;  // closed here, some of them evicted already
          }
          case Op::COUNT:
            break;
        }
        ++done[size_t(op)];
      }
    });
  }
  uint64_t stats_reads = 0;
  while (std::chrono::steady_clock::now() < until) {
    const HttpServerStats s = server->stats();
    EXPECT_GE(s.connections, 0);
    ++stats_reads;
    std::this_thread::sleep_for(5ms);
  }
  // Stopped while clients may still be mid-request: their connections end, no thread is left behind.
  RawClient open_at_stop(port);
  open_at_stop.send("POST /echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\nContent-Length: 100\r\n\r\nabc");
  for (std::thread& c : clients) c.join();
  const HttpServerStats s = server->stats();
  server->stop();
  deferred.stop();
  EXPECT_EQ(wrong.load(), 0u);
  for (size_t k = 0; k < size_t(Op::COUNT); ++k) EXPECT_GT(done[k].load(), 0u) << "operation " << k << " never ran";
  EXPECT_GT(s.exceptions, 0u);
  EXPECT_GT(s.refused_credentials, 0u);
  EXPECT_GT(stats_reads, 0u);
  RecordProperty("connections_total", std::to_string(s.connections_total));
  RecordProperty("evicted_answers", std::to_string(evicted.load()));
}

}  // namespace
}  // namespace essaim::net
