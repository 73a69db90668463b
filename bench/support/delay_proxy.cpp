#include "delay_proxy.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <span>
#include <thread>
#include <vector>

namespace essaim::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Reads wait at most this long before re-checking for shutdown (bounded loops, no wait forever).
constexpr auto kPoll = std::chrono::milliseconds(100);
constexpr size_t kReadChunk = 256 * 1024;

// One direction of one connection: src → (delay) → dst.
struct Direction {
  net::ByteStream* src = nullptr;
  net::ByteStream* dst = nullptr;
  std::chrono::microseconds delay{0};
  std::chrono::microseconds jitter{0};
  uint64_t bytes_per_s = 0;           // 0: unlimited
  std::mt19937_64 rng;                // the jitter draws (read_loop only)
  Clock::time_point last_release{};  // read_loop only: releases never go backwards
  std::mutex mu;
  std::condition_variable cv;
  struct Chunk {
    Clock::time_point release;
    std::vector<uint8_t> bytes;  // empty: end of stream
  };
  std::deque<Chunk> queue;  // guarded by mu, release times ascending
  bool stopping = false;    // guarded by mu

  void push(Chunk c) {
    std::lock_guard lock(mu);
    queue.push_back(std::move(c));
    cv.notify_one();
  }
  void stop() {
    std::lock_guard lock(mu);
    stopping = true;
    cv.notify_one();
  }
  void read_loop(const std::atomic<bool>& closing) {
    std::vector<uint8_t> buf(kReadChunk);
    while (!closing.load()) {
      net::NetResult<size_t> n = src->read_some(buf, Clock::now() + kPoll);
      if (!n) {
        if (n.error().kind == net::NetErrorKind::TIMEOUT) continue;
        break;
      }
      push({release_time(), std::vector<uint8_t>(buf.begin(), buf.begin() + long(*n))});
    }
    push({release_time(), {}});
  }
  Clock::time_point release_time() {
    auto extra = std::chrono::microseconds(0);
    if (jitter.count() > 0) extra = std::chrono::microseconds(int64_t(rng() % uint64_t(jitter.count() + 1)));
    last_release = std::max(last_release, Clock::now() + delay + extra);
    return last_release;
  }
  // Returns when the end of stream was delivered, a write failed, or stop() was called.
  void write_loop() {
    std::unique_lock lock(mu);
    while (true) {
      cv.wait(lock, [&] { return stopping || !queue.empty(); });
      if (stopping) return;
      const Clock::time_point release = queue.front().release;
      if (cv.wait_until(lock, release, [&] { return stopping; })) return;
      Chunk c = std::move(queue.front());
      queue.pop_front();
      lock.unlock();
      if (c.bytes.empty()) return;
      if (!write_paced(c.bytes)) return;
      lock.lock();
    }
  }
  // Writes `bytes` to dst, at `bytes_per_s` when set. False when a write failed or stop() was called.
  bool write_paced(std::span<const uint8_t> bytes) {
    const size_t piece = bytes_per_s == 0 ? bytes.size() : std::max<size_t>(1, bytes_per_s / 10);
    for (size_t at = 0; at < bytes.size(); at += piece) {
      const std::span<const uint8_t> p = bytes.subspan(at, std::min(piece, bytes.size() - at));
      const Clock::time_point due = Clock::now() + std::chrono::microseconds(bytes_per_s == 0 ? 0 : p.size() * 1000000 / bytes_per_s);
      if (!dst->write_all(p, Clock::now() + std::chrono::seconds(60))) return false;
      std::unique_lock lock(mu);
      if (cv.wait_until(lock, due, [&] { return stopping; })) return false;
    }
    return true;
  }
};

struct Connection {
  std::unique_ptr<net::ByteStream> client, target;
  Direction up, down;  // client → target, target → client
  std::atomic<bool> closing{false};
  std::vector<std::thread> threads;

  void close_both() {
    closing = true;
    client->close();
    target->close();
  }
  void run() {
    up.src = client.get();
    up.dst = target.get();
    down.src = target.get();
    down.dst = client.get();
    threads.emplace_back([this] { up.read_loop(closing); });
    threads.emplace_back([this] { down.read_loop(closing); });
    // A writer that is done (end of stream delivered, or a write failed) closes both sides: the proxy
    // never half-closes, which the protocol does not use.
    threads.emplace_back([this] { up.write_loop(); close_both(); });
    threads.emplace_back([this] { down.write_loop(); close_both(); });
  }
  void shutdown() {
    close_both();
    up.stop();
    down.stop();
    for (std::thread& t : threads) t.join();
  }
};

}  // namespace

struct DelayProxy::State {
  std::unique_ptr<net::TcpListener> listener;
  std::string target_host;
  std::atomic<uint16_t> target_port{0};
  LinkDelay delay;
  std::atomic<bool> stopping{false};
  std::atomic<uint64_t> accepted{0};
  std::mutex mu;
  std::vector<std::unique_ptr<Connection>> connections;  // guarded by mu
  std::thread acceptor;

  void accept_loop() {
    while (!stopping.load()) {
      net::NetResult<std::unique_ptr<net::ByteStream>> c = listener->accept(Clock::now() + kPoll);
      if (!c) continue;
      net::NetResult<std::unique_ptr<net::TcpStream>> t =
          net::tcp_connect(target_host, target_port, Clock::now() + std::chrono::seconds(10));
      if (!t) {
        (*c)->close();
        continue;
      }
      auto conn = std::make_unique<Connection>();
      conn->client = std::move(*c);
      conn->target = std::move(*t);
      conn->up.delay = conn->down.delay = delay.one_way;
      conn->up.jitter = conn->down.jitter = delay.jitter;
      conn->up.bytes_per_s = conn->down.bytes_per_s = delay.bytes_per_s;
      const uint64_t n = accepted.load();
      for (uint32_t d = 0; d < 2; ++d) {
        std::seed_seq seq{uint32_t(delay.seed), uint32_t(delay.seed >> 32), uint32_t(n), d};
        (d == 0 ? conn->up : conn->down).rng.seed(seq);
      }
      std::lock_guard lock(mu);
      if (stopping.load()) {
        conn->close_both();
        return;
      }
      conn->run();
      connections.push_back(std::move(conn));
      ++accepted;
    }
  }
};

net::NetResult<std::unique_ptr<DelayProxy>> DelayProxy::start(const std::string& target_host, uint16_t target_port,
                                                              LinkDelay delay) {
  auto s = std::make_unique<State>();
  net::NetResult<std::unique_ptr<net::TcpListener>> l = net::TcpListener::listen("127.0.0.1", 0);
  if (!l) return l.error();
  s->listener = std::move(*l);
  s->target_host = target_host;
  s->target_port = target_port;
  s->delay = delay;
  State* raw = s.get();
  s->acceptor = std::thread([raw] { raw->accept_loop(); });
  return std::unique_ptr<DelayProxy>(new DelayProxy(std::move(s)));
}

DelayProxy::DelayProxy(std::unique_ptr<State> state) : state_(std::move(state)) {}

DelayProxy::~DelayProxy() {
  state_->stopping = true;
  state_->acceptor.join();
  std::lock_guard lock(state_->mu);
  for (auto& c : state_->connections) c->shutdown();
}

uint16_t DelayProxy::port() const { return state_->listener->port(); }
uint64_t DelayProxy::connections() const { return state_->accepted.load(); }
void DelayProxy::retarget(uint16_t target_port) { state_->target_port = target_port; }

}  // namespace essaim::bench
