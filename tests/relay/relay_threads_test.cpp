// The relay's thread count does not grow with idle connections: 300 idle authenticated worker connections
// and 100 half-sent upgrades (four source addresses, 25 each: under the per-address pending cap, so none is
// evicted) are held open against a relay in this process, and the process's threads (/proc/self/task)
// stay under the I/O pool plus a fixed margin. The clients are raw sockets (no thread of their own).
#include <gtest/gtest.h>

#include <dirent.h>

#include <thread>

#include "raw_http_client.h"
#include "relay_test_util.h"

namespace essaim::relay {
namespace {

using namespace testing;
using namespace std::chrono_literals;

const std::string kUpgrade =
    "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";

size_t thread_count() {
  size_t n = 0;
  DIR* d = ::opendir("/proc/self/task");
  if (!d) return 0;
  while (const dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return n;
}

// One masked binary client frame (a zero mask key), for payloads under 126 bytes.
std::string masked_frame(const std::vector<uint8_t>& payload) {
  std::string f = "\x82";
  f += char(0x80 | payload.size());
  f += std::string(4, '\0');
  f.append(payload.begin(), payload.end());
  return f;
}

TEST(RelayThreads, IdleConnectionsDoNotAddThreads) {
  constexpr int kIdleWorkers = 300, kHalfSent = 100;
  RelayOptions o;
  o.max_connections_per_node = 1024;
  // Under load a worker may still wait for its token check when the next ones connect: no eviction here
  // (this test counts threads; eviction has its own tests in relay_hostile_test).
  o.max_pending = 1024;
  o.max_pending_per_address = 1024;
  o.threads = 2;
  const size_t before = thread_count();
  auto relay = start_relay(o);
  ASSERT_TRUE(relay);
  const uint16_t port = relay->port();
  const std::string preamble =
      masked_frame(encode_preamble({.role = RelayRole::WORKER, .token = "tok-worker-1", .build = test_build(), .node_id = {}}));
  std::vector<std::unique_ptr<net::testing::RawClient>> clients;
  for (int i = 0; i < kIdleWorkers; ++i) {
    auto c = std::make_unique<net::testing::RawClient>(port);
    c->send(kUpgrade);
    ASSERT_TRUE(c->read_response(5s).starts_with("HTTP/1.1 101")) << i;
    c->send(preamble);
    clients.push_back(std::move(c));
  }
  for (int i = 0; i < kHalfSent; ++i) {
    auto c = std::make_unique<net::testing::RawClient>(port, "127.0.0." + std::to_string(10 + i % 4));
    c->send("GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n");  // never finished
    clients.push_back(std::move(c));
  }
  const net::Deadline until = net::deadline_in(20s);
  while ((relay->stats().idle_workers < kIdleWorkers || relay->stats().listener.admission.admitted < kIdleWorkers + kHalfSent) &&
         net::Clock::now() < until) {
    std::this_thread::sleep_for(20ms);
  }
  const size_t during = thread_count();
  const RelayStats s = relay->stats();
  std::printf("threads: %zu before the relay, %zu with %d idle workers and %d half-sent upgrades\n", before, during,
              kIdleWorkers, kHalfSent);
  std::printf("idle workers %lld, connections %llu, pending %llu, evicted %llu\n", (long long)s.idle_workers,
              (unsigned long long)s.connections_total, (unsigned long long)s.listener.admission.live_unauthenticated,
              (unsigned long long)s.listener.admission.evicted_address_full);
  ASSERT_EQ(s.idle_workers, kIdleWorkers);
  ASSERT_EQ(s.listener.admission.live_unauthenticated, uint64_t(kHalfSent));
  RecordProperty("threads_before", std::to_string(before));
  RecordProperty("threads_with_400_idle_connections", std::to_string(during));
  EXPECT_LE(during, before + size_t(o.threads) + 16);
  // The relay still pairs at once beside them.
  auto w = worker_end(port, "tok-worker-2");
  auto b = backbone_end(port, "w2");
  ASSERT_TRUE(b) << b.error().message;
  ASSERT_TRUE(w->read_message(net::deadline_in(5s)));
}

}  // namespace
}  // namespace essaim::relay
