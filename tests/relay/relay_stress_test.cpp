// Concurrency stress of the relay's listener and pairing (label tsan: scripts/test.sh runs it in the
// ThreadSanitizer build; it also runs with the unit tests). For a bounded time, six nodes each pair a
// worker with a backbone over and over and echo messages of random sizes both ways, checking every byte;
// pairs end every way a pair ends (the backbone closes: 1000 to the worker; the worker closes: 1000 to the
// backbone; the backbone vanishes without a close frame: 1011 to the worker). Beside them, strangers send
// bad tokens, garbage and half-sent upgrades, and /metrics and the stats are read throughout.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "raw_http_client.h"
#include "relay_test_util.h"

namespace essaim::relay {
namespace {

using namespace testing;
using namespace std::chrono_literals;

constexpr int kNodes = 6;

std::string tokens() {
  std::string t = "b1 tok-backbone-1\n";
  for (int i = 0; i < kNodes; ++i) t += "w" + std::to_string(i) + " tok-w" + std::to_string(i) + "\n";
  return t;
}

const std::string kUpgrade =
    "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";

// One masked binary client frame (a zero mask key), for payloads under 64 KiB.
std::string masked_frame(const std::vector<uint8_t>& payload) {
  std::string f = "\x82";
  if (payload.size() < 126) {
    f += char(0x80 | payload.size());
  } else {
    f += char(0x80 | 126);
    f += char(payload.size() >> 8);
    f += char(payload.size());
  }
  f += std::string(4, '\0');
  f.append(payload.begin(), payload.end());
  return f;
}

enum class Ending : uint8_t { BACKBONE_CLOSES, WORKER_CLOSES, BACKBONE_VANISHES, COUNT };

TEST(RelayStress, PairsChurnAndEchoWhileStrangersKnock) {
  auto relay = start_relay({}, tokens());
  ASSERT_TRUE(relay);
  const uint16_t port = relay->port();
  const auto until = std::chrono::steady_clock::now() + 4s;
  std::atomic<uint64_t> pairs{0}, messages{0}, failures{0};
  std::array<std::atomic<uint64_t>, size_t(Ending::COUNT)> endings{};
  auto fail = [&](const std::string& what) {
    ++failures;
    ADD_FAILURE() << what;
  };
  std::vector<std::thread> threads;
  for (int node = 0; node < kNodes; ++node) {
    threads.emplace_back([&, node] {
      std::mt19937 rng(99 + uint32_t(node));
      const std::string id = "w" + std::to_string(node);
      // At least three rounds (one of each ending) however slow the build (TSan), then until the deadline.
      for (int round = 0; round < 50 && (round < 3 || std::chrono::steady_clock::now() < until); ++round) {
        const Ending ending = Ending(round % int(Ending::COUNT));
        auto w = worker_end(port, "tok-" + id);
        if (!w) return fail(id + ": no worker end");
        // The vanishing backbone is a raw socket (a WsStream always says goodbye with a close frame).
        std::unique_ptr<net::testing::RawClient> raw;
        net::NetResult<std::unique_ptr<net::WsStream>> b = net::net_error(net::NetErrorKind::CLOSED, "unused");
        if (ending == Ending::BACKBONE_VANISHES) {
          raw = std::make_unique<net::testing::RawClient>(port);
          raw->send(kUpgrade);
          if (!raw->read_response(5s).starts_with("HTTP/1.1 101")) return fail(id + ": no upgrade");
          raw->send(masked_frame(encode_preamble(
              {.role = RelayRole::BACKBONE, .token = "tok-backbone-1", .build = test_build(), .node_id = id})));
        } else {
          b = backbone_end(port, id);
          if (!b) return fail(id + ": " + b.error().message);
        }
        auto paired = w->read_message(net::deadline_in(5s));
        if (!paired || *paired != std::vector<uint8_t>{kPairedMessage}) return fail(id + ": worker not told PAIRED");
        ++pairs;
        // The worker echoes on its own thread, as a worker's session does.
        std::thread echo([&w] {
          for (;;) {
            auto m = w->read_message(net::deadline_in(5s));
            if (!m || !w->write_message(*m, net::deadline_in(5s))) return;
          }
        });
        if (raw) {
          raw->send(masked_frame(random_bytes(100, rng())));
          std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 3));
          raw->reset();  // no close frame: the worker is told 1011
        } else {
          for (int k = 0; k < 8; ++k) {
            const std::vector<uint8_t> m = random_bytes(1 + rng() % (96 << 10), rng());
            if (!(*b)->write_message(m, net::deadline_in(5s))) {
              fail(id + ": backbone write failed");
              break;
            }
            auto back = (*b)->read_message(net::deadline_in(5s));
            if (!back || *back != m) {
              fail(id + ": echo differs or missing");
              break;
            }
            ++messages;
          }
        }
        if (ending == Ending::WORKER_CLOSES) {
          w->close();  // the echo thread's read ends; the backbone is told 1000
          auto m = (*b)->read_message(net::deadline_in(5s));
          if (m || (*b)->peer_close_code() != 1000)
            fail(id + ": backbone told " + std::to_string((*b)->peer_close_code()) + " when the worker closed, not 1000");
        } else if (ending == Ending::BACKBONE_CLOSES) {
          (*b)->close();
        }
        echo.join();
        if (ending != Ending::WORKER_CLOSES) {
          const uint16_t want = ending == Ending::BACKBONE_CLOSES ? 1000 : 1011;
          if (w->peer_close_code() != want)
            fail(id + ": worker told " + std::to_string(w->peer_close_code()) + ", wanted " + std::to_string(want));
        }
        ++endings[size_t(ending)];
      }
    });
  }
  // Strangers on two more threads: bad tokens, garbage, half-sent upgrades (evicted in turn), /metrics.
  for (int s = 0; s < 2; ++s) {
    threads.emplace_back([&, s] {
      std::mt19937 rng(7 + uint32_t(s));
      while (std::chrono::steady_clock::now() < until) {
        switch (rng() % 4) {
          case 0: {
            auto w = worker_end(port, "tok-nobody");
            if (w) (void)w->read_message(net::deadline_in(2s));
            break;
          }
          case 1: {
            net::testing::RawClient c(port, "127.0.0.9");
            c.send("\x16\x03\x01 garbage\r\n\r\n");
            (void)c.read_all(200ms);
            break;
          }
          case 2: {
            std::vector<std::unique_ptr<net::testing::RawClient>> half;
            for (int k = 0; k < 40; ++k) {
              half.push_back(std::make_unique<net::testing::RawClient>(port, "127.0.0.8"));
              half.back()->send("GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n");
            }
            break;
          }
          default: {
            net::testing::RawClient c(port, "127.0.0.7");
            c.send("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
            const std::string r = c.read_all(2s);
            if (!r.starts_with("HTTP/1.1 200") || r.find("essaim_relay_pairs_total") == std::string::npos)
              fail("/metrics: " + r.substr(0, 200));
            (void)relay->stats();
          }
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0u);
  for (size_t k = 0; k < size_t(Ending::COUNT); ++k) EXPECT_GT(endings[k].load(), 0u) << "ending " << k << " never happened";
  EXPECT_GE(pairs.load(), uint64_t(kNodes) * 3);
  RecordProperty("pairs", std::to_string(pairs.load()));
  RecordProperty("messages", std::to_string(messages.load()));
  relay->stop();
}

}  // namespace
}  // namespace essaim::relay
