// The relay forwards every message byte-identical (sizes at each WebSocket length-encoding edge, up to the
// frame limit; the limit + 1 is refused with 1009), pairs several backbones with one worker, runs over TLS
// with the certificate verified, and checks tokens through a coordinator's /api/whoami.
#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>

#include "net/http_server.h"
#include "net/tcp.h"
#include "relay/preamble.h"
#include "relay/token_check.h"
#include "relay_test_util.h"

namespace essaim::relay {
namespace {

using namespace testing;
using namespace std::chrono_literals;

struct Paired {
  std::unique_ptr<net::WsStream> worker, backbone;
};

Paired pair_up(uint16_t port) {
  Paired p;
  p.worker = worker_end(port);
  auto b = backbone_end(port);
  EXPECT_TRUE(b) << b.error().message;
  if (b) p.backbone = std::move(*b);
  auto paired = p.worker->read_message(net::deadline_in(5s));
  EXPECT_TRUE(paired);
  if (paired) EXPECT_EQ(*paired, std::vector<uint8_t>{kPairedMessage});
  return p;
}

TEST(RelayPreamble, RoundTripsAndRefusesEveryMalformedForm) {
  Preamble b{.role = RelayRole::BACKBONE, .token = "abc", .build = test_build(), .node_id = "n-1"};
  auto enc = encode_preamble(b);
  auto dec = decode_preamble(enc);
  ASSERT_TRUE(dec) << dec.status().message();
  EXPECT_EQ(*dec, b);
  Preamble w{.role = RelayRole::WORKER, .token = "t", .build = test_build(), .node_id = {}};
  ASSERT_TRUE(decode_preamble(encode_preamble(w)));
  // Every truncation fails, and so does one extra byte.
  for (size_t n = 0; n < enc.size(); ++n) EXPECT_FALSE(decode_preamble(std::span(enc.data(), n))) << n;
  auto longer = enc;
  longer.push_back(0);
  EXPECT_FALSE(decode_preamble(longer));
  auto bad_role = enc;
  bad_role[0] = 3;
  EXPECT_NE(decode_preamble(bad_role).status().message().find("role"), std::string::npos);
  auto bad_version = enc;
  bad_version[1] = 2;
  EXPECT_FALSE(decode_preamble(bad_version));
  Preamble no_node = b;
  no_node.node_id.clear();
  EXPECT_FALSE(decode_preamble(encode_preamble(no_node)));
  Preamble worker_with_node = w;
  worker_with_node.node_id = "x";
  EXPECT_FALSE(decode_preamble(encode_preamble(worker_with_node)));
  Preamble bad_token = b;
  bad_token.token = "a b";
  EXPECT_FALSE(decode_preamble(encode_preamble(bad_token)));
}

TEST(RelayTokens, FileFormat) {
  auto ok = FileTokenChecker::parse("# comment\n\nn1 t1\nn2\tt2  # trailing\n");
  ASSERT_TRUE(ok) << ok.status().message();
  EXPECT_EQ((*ok)->check("t1").node_id, "n1");
  EXPECT_EQ((*ok)->check("t2").node_id, "n2");
  EXPECT_FALSE((*ok)->check("t3").ok());
  EXPECT_FALSE(FileTokenChecker::parse("n1\n"));
  EXPECT_FALSE(FileTokenChecker::parse("n1 t1 extra\n"));
  EXPECT_FALSE(FileTokenChecker::parse("n1 t1\nn2 t1\n"));
  EXPECT_FALSE(FileTokenChecker::parse("n1 t1\nn1 t2\n"));
  EXPECT_FALSE(FileTokenChecker::parse("n/1 t1\n"));
}

TEST(RelayForward, EveryMessageSizeArrivesByteIdentical) {
  auto relay = start_relay();
  Paired p = pair_up(relay->port());
  ASSERT_TRUE(p.worker && p.backbone);
  const uint64_t limit = net::WsLimits{}.max_message_bytes;
  const std::vector<uint64_t> sizes = {0, 1, 125, 126, 127, 65535, 65536, 65537, 1 << 20, 16 << 20, limit};
  uint32_t seed = 1;
  for (uint64_t n : sizes) {
    std::vector<uint8_t> m = random_bytes(n, seed++);
    const std::string want = sha256_hex(m);
    const auto t0 = net::Clock::now();
    // Backbone to worker, and the worker sends it back.
    auto wr = p.backbone->write_message(m, net::deadline_in(30s));
    ASSERT_TRUE(wr) << n << ": " << wr.error().message;
    auto got = p.worker->read_message(net::deadline_in(30s));
    ASSERT_TRUE(got) << n << ": " << got.error().message;
    EXPECT_EQ(got->size(), n);
    EXPECT_EQ(sha256_hex(*got), want) << n;
    ASSERT_TRUE(p.worker->write_message(*got, net::deadline_in(30s))) << n;
    got.value().clear();
    auto back = p.backbone->read_message(net::deadline_in(30s));
    ASSERT_TRUE(back) << n << ": " << back.error().message;
    EXPECT_EQ(sha256_hex(*back), want) << n;
    if (n >= (1 << 20)) std::printf("%llu bytes: round trip %.3f s\n", (unsigned long long)n, std::chrono::duration<double>(net::Clock::now() - t0).count());
  }
  RelayStats s = relay->stats();
  EXPECT_EQ(s.messages_to_worker, sizes.size());  // PAIRED is the relay's own, not counted
  EXPECT_EQ(s.messages_to_backbone, sizes.size());
}

TEST(RelayForward, OverTheLimitIsClosedWith1009) {
  net::WsLimits small;
  small.max_message_bytes = 1 << 20;
  auto relay = start_relay({.limits = small});
  Paired p = pair_up(relay->port());
  ASSERT_TRUE(p.worker && p.backbone);
  // The client's own limit is larger, so the message leaves; the relay refuses it.
  std::vector<uint8_t> m = random_bytes(small.max_message_bytes + 1, 9);
  (void)p.backbone->write_message(m, net::deadline_in(10s));
  auto r = p.backbone->read_message(net::deadline_in(10s));
  ASSERT_FALSE(r);
  EXPECT_EQ(p.backbone->peer_close_code(), 1009) << r.error().message;
  // Its worker is told its pair is over.
  auto w = p.worker->read_message(net::deadline_in(10s));
  EXPECT_FALSE(w);
  EXPECT_EQ(relay->stats().dropped_messages[size_t(DropReason::TOO_BIG)], 1u);
}

TEST(RelayPairing, OneWorkerServesSeveralBackbonesThroughTheAcceptor) {
  auto relay = start_relay();
  RelayAcceptor acceptor({.relay = relay_url(relay->port()), .token = "tok-worker-1", .build = test_build(),
                          .ws = {}, .idle_connections = 1});
  std::vector<std::unique_ptr<net::WsStream>> backbones;
  std::vector<std::unique_ptr<net::ByteStream>> workers;
  for (int i = 0; i < 3; ++i) {
    // The acceptor re-dials after each pair; a backbone waits for it (pair_wait).
    auto b = backbone_end(relay->port());
    ASSERT_TRUE(b) << b.error().message;
    backbones.push_back(std::move(*b));
    auto w = acceptor.accept(net::deadline_in(5s));
    ASSERT_TRUE(w) << w.error().message;
    workers.push_back(std::move(*w));
  }
  // Each pair carries its own bytes (through the ByteStream interface on the worker side).
  for (int i = 0; i < 3; ++i) {
    std::vector<uint8_t> m = random_bytes(1000 + i, 100 + i);
    ASSERT_TRUE(backbones[i]->write_message(m, net::deadline_in(5s)));
    std::vector<uint8_t> got;
    while (got.size() < m.size()) {
      uint8_t buf[4096];
      auto n = workers[i]->read_some(buf, net::deadline_in(5s));
      ASSERT_TRUE(n) << n.error().message;
      got.insert(got.end(), buf, buf + *n);
    }
    EXPECT_EQ(got, m) << i;
  }
  EXPECT_EQ(relay->stats().pairs_total, 3u);
  EXPECT_EQ(acceptor.pairs(), 3u);
}

TEST(RelayTls, VerifiedCertificateWorksAndAnUnknownOneIsRefused) {
  TestCert cert = make_test_cert("tls");
  auto relay = start_relay({.tls = net::WsServerTls{cert.cert, cert.key}});
  net::WsClientOptions with_ca{.ca_file = cert.cert};
  Preamble w{.role = RelayRole::WORKER, .token = "tok-worker-1", .build = test_build(), .node_id = {}};
  auto ws = net::ws_connect(relay_url(relay->port(), true), with_ca, net::deadline_in(5s));
  ASSERT_TRUE(ws) << ws.error().message;
  ASSERT_TRUE((*ws)->write_message(encode_preamble(w), net::deadline_in(5s)));
  Preamble b{.role = RelayRole::BACKBONE, .token = "tok-backbone-1", .build = test_build(), .node_id = "w1"};
  auto bb = relay_connect(relay_url(relay->port(), true, "/node/w1"), b, with_ca, net::deadline_in(5s));
  ASSERT_TRUE(bb) << bb.error().message;
  ASSERT_TRUE((*ws)->read_message(net::deadline_in(5s)));
  std::vector<uint8_t> m = random_bytes(70000, 5);
  ASSERT_TRUE((*bb)->write_message(m, net::deadline_in(5s)));
  auto got = (*ws)->read_message(net::deadline_in(5s));
  ASSERT_TRUE(got);
  EXPECT_EQ(*got, m);

  // Without the CA: the self-signed certificate is not trusted.
  auto untrusted = net::ws_connect(relay_url(relay->port(), true), {}, net::deadline_in(5s));
  ASSERT_FALSE(untrusted);
  EXPECT_NE(untrusted.error().message.find("TLS"), std::string::npos) << untrusted.error().message;
  // SSL_CERT_FILE is honoured (the system trust store's override).
  ::setenv("SSL_CERT_FILE", cert.cert.c_str(), 1);
  auto via_env = net::ws_connect(relay_url(relay->port(), true), {}, net::deadline_in(5s));
  ::unsetenv("SSL_CERT_FILE");
  EXPECT_TRUE(via_env) << via_env.error().message;
  // A name the certificate does not carry is refused.
  auto wrong_name = net::ws_connect(net::WsUrl{.tls = true, .host = "127.0.0.2", .port = relay->port(), .path = "/"}, with_ca,
                                    net::deadline_in(5s));
  EXPECT_FALSE(wrong_name);
  std::filesystem::remove_all(cert.dir);
}

TEST(RelayTokens, CoordinatorWhoamiAcceptsRefusesAndFailsClosed) {
  // A small coordinator: /api/whoami for one token.
  auto coord = net::HttpServer::listen("127.0.0.1", 0, {}, [](const net::HttpRequestView& req, std::shared_ptr<net::HttpResponder> out) {
    if (req.target == "/api/whoami" && req.authorization == "Bearer good-token") {
      out->reply({.status = 200, .body = R"({"node_id": "n-00000000000000aa", "name": "phone-7"})"});
    } else if (req.target == "/api/whoami") {
      out->reply({.status = 401, .body = R"({"error": {"message": "bad token", "code": "unauthorized"}})"});
    } else {
      out->reply({.status = 404, .body = "{}"});
    }
  });
  ASSERT_TRUE(coord) << coord.status().message();
  const std::string url = "http://127.0.0.1:" + std::to_string((*coord)->port());
  auto c = CoordinatorTokenChecker::create(url, {.cache_ttl = 0ms});
  ASSERT_TRUE(c) << c.status().message();
  TokenVerdict good = (*c)->check("good-token");
  EXPECT_TRUE(good.ok()) << good.reason;
  EXPECT_EQ(good.node_id, "n-00000000000000aa");
  EXPECT_EQ((*c)->check("bad-token").kind, TokenVerdict::Kind::REFUSED);
  const uint16_t port = (*coord)->port();
  (*coord)->stop();
  // Unreachable: refused as unavailable, never accepted.
  auto gone = CoordinatorTokenChecker::create("http://127.0.0.1:" + std::to_string(port), {.cache_ttl = 0ms, .timeout = 500ms});
  EXPECT_EQ((*gone)->check("good-token").kind, TokenVerdict::Kind::UNAVAILABLE);
  EXPECT_FALSE(CoordinatorTokenChecker::create("ftp://x:1", {}));
  // Plain http:// to a host that is not loopback carries tokens in clear text: refused unless insecure_http.
  EXPECT_FALSE(CoordinatorTokenChecker::create("http://10.0.0.1:8080", {}));
  EXPECT_TRUE(CoordinatorTokenChecker::create("http://10.0.0.1:8080", {.insecure_http = true}));
  EXPECT_TRUE(CoordinatorTokenChecker::create("https://coord.example.org", {}));
}

TEST(RelayTokens, AnHttpsCoordinatorAnywhereWithABoundedCacheThatFailsClosed) {
  TestCert cert = make_test_cert("whoami");
  auto coord = net::HttpServer::listen(
      "127.0.0.1", 0, {}, [](const net::HttpRequestView& req, std::shared_ptr<net::HttpResponder> out) {
        if (req.target == "/api/whoami" && req.authorization == "Bearer good-token") {
          return out->reply({.status = 200, .body = R"({"node_id": "n-00000000000000bb"})", .headers = {}});
        }
        out->reply({.status = 401, .body = "{}", .headers = {}});
      },
      2, {}, net::ServerTls{cert.cert, cert.key});
  ASSERT_TRUE(coord) << coord.status().message();
  const std::string url = "https://127.0.0.1:" + std::to_string((*coord)->port());
  // Not trusted: unavailable (never accepted), the reason naming the host.
  auto untrusted = CoordinatorTokenChecker::create(url, {.cache_ttl = 0ms});
  ASSERT_TRUE(untrusted);
  TokenVerdict no = (*untrusted)->check("good-token");
  EXPECT_EQ(no.kind, TokenVerdict::Kind::UNAVAILABLE);
  EXPECT_NE(no.reason.find("certificate verify failed"), std::string::npos) << no.reason;
  // Trusted through --ca-file: answers cached for 400 ms, then the coordinator is gone: the cached answer
  // holds within the bound, and past it the token is refused (fail closed).
  auto c = CoordinatorTokenChecker::create(url, {.ca_file = cert.cert, .cache_ttl = 400ms, .timeout = 500ms});
  ASSERT_TRUE(c);
  TokenVerdict yes = (*c)->check("good-token");
  ASSERT_TRUE(yes.ok()) << yes.reason;
  EXPECT_EQ(yes.node_id, "n-00000000000000bb");
  const auto answered = std::chrono::steady_clock::now();
  (*coord)->stop();
  TokenVerdict cached = (*c)->check("good-token");
  if (std::chrono::steady_clock::now() - answered < 400ms) EXPECT_TRUE(cached.ok()) << cached.reason;
  std::this_thread::sleep_for(450ms);
  EXPECT_EQ((*c)->check("good-token").kind, TokenVerdict::Kind::UNAVAILABLE);
  std::filesystem::remove_all(cert.dir);
}

TEST(RelayMetrics, ServedOnTheSamePort) {
  auto relay = start_relay();
  { Paired p = pair_up(relay->port()); }
  auto s = net::tcp_connect("127.0.0.1", relay->port(), net::deadline_in(5s));
  ASSERT_TRUE(s);
  const std::string req = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_TRUE((*s)->write_all(std::span(reinterpret_cast<const uint8_t*>(req.data()), req.size()), net::deadline_in(5s)));
  std::string text;
  for (;;) {
    uint8_t buf[4096];
    auto n = (*s)->read_some(buf, net::deadline_in(5s));
    if (!n) break;
    text.append(reinterpret_cast<char*>(buf), *n);
  }
  EXPECT_NE(text.find("200 OK"), std::string::npos) << text;
  EXPECT_NE(text.find("essaim_relay_pairs_total 1"), std::string::npos) << text;
  EXPECT_NE(text.find("essaim_relay_refusals_total{reason=\"bad_token\"} 0"), std::string::npos) << text;
}

}  // namespace
}  // namespace essaim::relay
