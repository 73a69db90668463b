// Helpers for the relay tests: a relay on a free loopback port with a token file, a worker end and a
// backbone end dialled through it, and the throw-away certificate of tests/support/test_cert.h.
#pragma once

#include <gtest/gtest.h>
#include <openssl/sha.h>

#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "relay/relay_client.h"
#include "relay/relay_server.h"
#include "temp_dir.h"
#include "test_cert.h"

namespace essaim::relay::testing {

using namespace std::chrono_literals;

inline RelayBuild test_build(uint8_t seed = 7) {
  RelayBuild b;
  for (size_t i = 0; i < b.model.size(); ++i) b.model[i] = uint8_t(seed + i);
  b.kernel_abi = 3;
  return b;
}

inline std::string kTokens = "w1 tok-worker-1\nw2 tok-worker-2\nb1 tok-backbone-1\n";

inline std::unique_ptr<RelayServer> start_relay(RelayOptions o = {}, const std::string& tokens = kTokens) {
  auto checker = FileTokenChecker::parse(tokens);
  EXPECT_TRUE(checker) << checker.status().message();
  auto r = RelayServer::start("127.0.0.1", 0, std::move(o), std::move(*checker));
  EXPECT_TRUE(r) << r.status().message();
  return std::move(*r);
}

inline net::WsUrl relay_url(uint16_t port, bool tls = false, const std::string& path = "/") {
  return net::WsUrl{.tls = tls, .host = "127.0.0.1", .port = port, .path = path};
}

// A worker connection registered at the relay and waiting for PAIRED (read it with read_message).
inline std::unique_ptr<net::WsStream> worker_end(uint16_t port, const std::string& token = "tok-worker-1",
                                                 RelayBuild build = test_build(), net::WsClientOptions ws = {}) {
  auto s = net::ws_connect(relay_url(port), ws, net::deadline_in(5s));
  EXPECT_TRUE(s) << s.error().message;
  if (!s) return nullptr;
  Preamble p{.role = RelayRole::WORKER, .token = token, .build = build, .node_id = {}};
  EXPECT_TRUE((*s)->write_message(encode_preamble(p), net::deadline_in(5s)));
  return std::move(*s);
}

inline net::NetResult<std::unique_ptr<net::WsStream>> backbone_end(uint16_t port, const std::string& node = "w1",
                                                                   const std::string& token = "tok-backbone-1",
                                                                   RelayBuild build = test_build(), net::WsClientOptions ws = {}) {
  Preamble p{.role = RelayRole::BACKBONE, .token = token, .build = build, .node_id = node};
  return relay_connect(relay_url(port, false, "/node/" + node), p, ws, net::deadline_in(5s));
}

inline std::string sha256_hex(std::span<const uint8_t> b) {
  uint8_t d[SHA256_DIGEST_LENGTH];
  SHA256(b.data(), b.size(), d);
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (uint8_t x : d) s += hex[x >> 4], s += hex[x & 15];
  return s;
}

inline std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; i += 4) {
    uint32_t r = rng();
    for (size_t k = 0; k < 4 && i + k < n; ++k) v[i + k] = uint8_t(r >> (8 * k));
  }
  return v;
}

using essaim::testing::make_test_cert;  // tests/support/test_cert.h
using essaim::testing::TestCert;

}  // namespace essaim::relay::testing
