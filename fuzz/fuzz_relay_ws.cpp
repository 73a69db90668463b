// libFuzzer target for the relay's listener as a stranger meets it (docs/relay.md): the HTTP upgrade
// request (net/http_feed.h), WebSocket framing under the relay's limits (the 1 KiB first message, then
// --max-message), the preamble, the token check, pairing and forwarding. One real RelayServer on loopback
// lives for the whole run; each input is one TCP connection's bytes, sent, then the write side shut, then
// whatever the relay answers read until it closes (at most 500 ms). A relay that stops answering `GET /`
// (checked every 256 inputs) aborts the run; ASan/UBSan catch the rest.
//
// Input: byte 0 picks how the rest is sent (byte 0 % 3):
//   0  raw: the rest is the whole connection (request line, headers, anything)
//   1  a valid upgrade request, then the rest as raw WebSocket bytes
//   2  a valid upgrade request, then the rest as records, each made into one client frame:
//        [flags u8][length u16 LE][payload]   flags: bits 0-3 opcode; bit 4 FIN clear; bit 5 RSV1 set;
//                                              bit 6 unmasked; bit 7 a 64-bit length field for any size
//      When the first record's payload is a backbone preamble naming w1 with tok-backbone-1, a worker end
//      (tok-worker-1, the same build) is registered first, so the backbone pairs and its later messages
//      are forwarded.
//
//   build-asan/fuzz/fuzz_relay_ws -max_total_time=60 fuzz/corpus/fuzz_relay_ws
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "net/websocket.h"
#include "relay/preamble.h"
#include "relay/relay_server.h"
#include "relay/token_check.h"

namespace {

using namespace essaim;
using namespace std::chrono_literals;

const char kUpgrade[] =
    "GET /node/w1 HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";

// Short deadlines everywhere, so that an input that stops mid-way costs milliseconds, not the defaults' seconds.
relay::RelayServer& relay_server() {
  static relay::RelayServer* server = [] {
    auto tokens = relay::FileTokenChecker::parse("w1 tok-worker-1\nb1 tok-backbone-1\n");
    if (!tokens) std::abort();
    relay::RelayOptions o;
    o.limits.max_message_bytes = 64 << 10;
    o.limits.handshake_timeout = 300ms;
    o.limits.idle_timeout = 1000ms;
    o.preamble_timeout = 300ms;
    o.pair_wait = 100ms;
    o.write_stall = 300ms;
    auto r = relay::RelayServer::start("127.0.0.1", 0, o, std::move(*tokens));
    if (!r) {
      std::fprintf(stderr, "fuzz_relay_ws: cannot start the relay: %s\n", r.status().message().c_str());
      std::abort();
    }
    return r->release();  // lives until the process ends
  }();
  return *server;
}

int connect_loopback(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Sends everything (the relay may close first: then the rest is dropped), shuts the write side, reads
// until the relay closes or `budget` passes; returns what it answered. Closes with a reset, so that a
// fast run leaves no TIME_WAIT sockets behind.
std::string exchange(uint16_t port, const std::string& bytes, std::chrono::milliseconds budget) {
  const int fd = connect_loopback(port);
  if (fd < 0) return {};
  for (size_t sent = 0; sent < bytes.size();) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += size_t(n);
  }
  ::shutdown(fd, SHUT_WR);
  std::string answer;
  const auto until = std::chrono::steady_clock::now() + budget;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
    if (left.count() <= 0 || ::poll(&p, 1, int(left.count())) <= 0) break;
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    if (answer.size() < 4096) answer.append(buf, size_t(n));
  }
  linger l{.l_onoff = 1, .l_linger = 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  ::close(fd);
  return answer;
}

// One client frame (RFC 6455 5.2) from a record's flags and payload.
void append_frame(std::string& out, uint8_t flags, std::span<const uint8_t> payload) {
  const uint8_t opcode = flags & 0x0f;
  out.push_back(char(((flags & 0x10) ? 0x00 : 0x80) | ((flags & 0x20) ? 0x40 : 0x00) | opcode));
  const bool masked = (flags & 0x40) == 0;
  const uint8_t mask_bit = masked ? 0x80 : 0x00;
  const size_t n = payload.size();
  if ((flags & 0x80) != 0) {
    out.push_back(char(mask_bit | 127));
    for (int i = 7; i >= 0; --i) out.push_back(char(uint64_t(n) >> (8 * i)));
  } else if (n < 126) {
    out.push_back(char(mask_bit | n));
  } else {
    out.push_back(char(mask_bit | 126));
    out.push_back(char(n >> 8));
    out.push_back(char(n));
  }
  const uint8_t key[4] = {0x12, 0x34, 0x56, 0x78};
  if (masked) out.append(reinterpret_cast<const char*>(key), 4);
  for (size_t i = 0; i < n; ++i) out.push_back(char(masked ? payload[i] ^ key[i % 4] : payload[i]));
}

struct Records {
  std::string frames;
  std::vector<uint8_t> first_payload;
};
Records frames_of(std::span<const uint8_t> in) {
  Records r;
  size_t pos = 0;
  bool first = true;
  while (in.size() - pos >= 3) {
    const uint8_t flags = in[pos];
    const size_t want = size_t(in[pos + 1]) | size_t(in[pos + 2]) << 8;
    pos += 3;
    const size_t n = std::min(want, in.size() - pos);
    std::span<const uint8_t> payload = in.subspan(pos, n);
    pos += n;
    if (first) r.first_payload.assign(payload.begin(), payload.end());
    first = false;
    append_frame(r.frames, flags, payload);
  }
  return r;
}

// A worker end waiting under w1 with the build of `backbone`, for a backbone preamble to pair with.
std::unique_ptr<net::WsStream> worker_for(uint16_t port, const relay::Preamble& backbone) {
  if (backbone.role != relay::RelayRole::BACKBONE || backbone.node_id != "w1" || backbone.token != "tok-backbone-1")
    return nullptr;
  net::WsClientOptions ws;
  ws.limits.idle_timeout = 1000ms;
  auto s = net::ws_connect(net::WsUrl{.tls = false, .host = "127.0.0.1", .port = port, .path = "/"}, ws,
                           net::deadline_in(1s));
  if (!s) return nullptr;
  const relay::Preamble p{.role = relay::RelayRole::WORKER, .token = "tok-worker-1", .build = backbone.build, .node_id = {}};
  if (!(*s)->write_message(relay::encode_preamble(p), net::deadline_in(1s))) return nullptr;
  std::this_thread::sleep_for(5ms);  // registered as idle before the backbone asks
  return std::move(*s);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || size > (256 << 10)) return -1;
  relay::RelayServer& relay = relay_server();
  const uint16_t port = relay.port();
  std::span<const uint8_t> rest(data + 1, size - 1);
  std::string bytes;
  std::unique_ptr<net::WsStream> worker;
  switch (data[0] % 3) {
    case 0:
      bytes.assign(reinterpret_cast<const char*>(rest.data()), rest.size());
      break;
    case 1:
      bytes = kUpgrade;
      bytes.append(reinterpret_cast<const char*>(rest.data()), rest.size());
      break;
    default: {
      Records r = frames_of(rest);
      if (Result<relay::Preamble> p = relay::decode_preamble(r.first_payload)) worker = worker_for(port, *p);
      bytes = kUpgrade + r.frames;
      break;
    }
  }
  (void)exchange(port, bytes, 500ms);
  if (worker) {
    // What the backbone's messages became on the worker's side (forwarded, or the pair's close).
    for (int i = 0; i < 8 && worker->read_message(net::deadline_in(50ms)); ++i) {
    }
    worker->close();
  }
  static uint64_t runs = 0;
  if (++runs % 256 == 0) {
    const std::string home = exchange(port, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 5000ms);
    if (home.find("essaim relay") == std::string::npos) {
      std::fprintf(stderr, "fuzz_relay_ws: the relay no longer answers GET / (got %zu bytes: %.200s)\n", home.size(),
                   home.c_str());
      std::abort();
    }
  }
  return 0;
}
