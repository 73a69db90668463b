// net's HTTP client: URLs (http and https), the plain-http rule, and calls over TLS against the shared
// HTTP server with a throw-away certificate (trusted through ca_file or SSL_CERT_FILE; a wrong one refused
// with the host and the reason).
#include "net/http_client.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "net/http_server.h"
#include "test_cert.h"

namespace essaim::net {
namespace {

TEST(HttpUrl, ParsesHostPortPrefixAndScheme) {
  Result<HttpUrl> u = parse_http_url("http://127.0.0.1:8080");
  ASSERT_TRUE(u);
  EXPECT_FALSE(u->tls);
  EXPECT_EQ(u->host, "127.0.0.1");
  EXPECT_EQ(u->port, 8080);
  EXPECT_EQ(u->base_path, "");
  u = parse_http_url("http://[::1]:9/market/");
  ASSERT_TRUE(u);
  EXPECT_EQ(u->host, "::1");
  EXPECT_EQ(u->port, 9);
  EXPECT_EQ(u->base_path, "/market");
  EXPECT_EQ(u->text(), "http://[::1]:9/market");
  u = parse_http_url("http://coord");
  ASSERT_TRUE(u);
  EXPECT_EQ(u->port, 80);
  u = parse_http_url("https://coord.example.org");
  ASSERT_TRUE(u);
  EXPECT_TRUE(u->tls);
  EXPECT_EQ(u->port, 443);
  EXPECT_EQ(u->text(), "https://coord.example.org:443");
  for (const char* bad : {"ftp://x", "x:80", "http://", "https://", "http://:80", "http://a:0", "http://a:65536",
                          "http://a:8x", "http://u@a:1", "http://a:1/?q", "http://[::1", "http://a:", "wss://a:1"}) {
    EXPECT_FALSE(parse_http_url(bad)) << bad;
  }
}

TEST(HttpUrl, PlainHttpOnlyToLoopbackUnlessInsecure) {
  for (const char* ok : {"http://127.0.0.1:1", "http://127.9.9.9:1", "http://[::1]:1", "http://localhost:1",
                         "https://10.0.0.1:1", "https://coord.example.org"}) {
    EXPECT_TRUE(check_plain_http(*parse_http_url(ok), false, "--coordinator")) << ok;
  }
  for (const char* refused : {"http://10.0.0.1:8080", "http://coord.example.org", "http://[2001:db8::1]:1"}) {
    Status st = check_plain_http(*parse_http_url(refused), false, "--coordinator");
    ASSERT_FALSE(st) << refused;
    EXPECT_NE(st.message().find("--coordinator"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("--insecure-http"), std::string::npos) << st.message();
    EXPECT_TRUE(check_plain_http(*parse_http_url(refused), true, "--coordinator")) << refused;
  }
}

// An https server with `cert` that answers every request with its target, and a long body at /big.
std::unique_ptr<HttpServer> https_server(const testing::TestCert& cert) {
  auto server = HttpServer::listen(
      "127.0.0.1", 0, {}, [](const HttpRequestView& req, std::shared_ptr<HttpResponder> out) {
        if (req.target == "/big") return out->reply({.status = 200, .body = std::string(3 << 20, 'x')});
        out->reply({.status = 200, .body = "{\"target\": \"" + req.target + "\"}"});
      },
      2, {}, ServerTls{cert.cert, cert.key});
  EXPECT_TRUE(server) << server.status().message();
  return server ? std::move(*server) : nullptr;
}

HttpUrl https_url(uint16_t port, std::string ca_file) {
  return {.tls = true, .host = "127.0.0.1", .port = port, .base_path = "", .ca_file = std::move(ca_file)};
}

TEST(HttpsClient, CallsAndStreamsOverVerifiedTls) {
  testing::TestCert cert = testing::make_test_cert("https");
  auto server = https_server(cert);
  ASSERT_TRUE(server);
  Result<HttpAnswer> a = http_call(https_url(server->port(), cert.cert), {.method = "GET", .target = "/api/model"});
  ASSERT_TRUE(a) << a.status().message();
  EXPECT_EQ(a->status, 200);
  EXPECT_EQ(a->body, "{\"target\": \"/api/model\"}");
  // A keep-alive connection answered twice over one TLS session, and a body of several TLS records, streamed.
  uint64_t streamed = 0;
  Status st = http_stream(
      https_url(server->port(), cert.cert), {.method = "GET", .target = "/big"},
      [](const HttpAnswer& head) { return head.status == 200 ? Status::ok() : Status::error("status"); },
      [&](std::span<const char> bytes) {
        streamed += bytes.size();
        return Status::ok();
      });
  EXPECT_TRUE(st) << st.message();
  EXPECT_EQ(streamed, uint64_t(3) << 20);
  // SSL_CERT_FILE (the system store's override) is honoured as well as ca_file.
  ::setenv("SSL_CERT_FILE", cert.cert.c_str(), 1);
  Result<HttpAnswer> via_env = http_call(https_url(server->port(), ""), {.method = "GET", .target = "/"});
  ::unsetenv("SSL_CERT_FILE");
  EXPECT_TRUE(via_env) << via_env.status().message();
  server->stop();
  std::filesystem::remove_all(cert.dir);
}

TEST(HttpsClient, AWrongCertificateFailsNamingTheHostAndTheReason) {
  testing::TestCert cert = testing::make_test_cert("https-served");
  testing::TestCert other = testing::make_test_cert("https-other-host", "DNS:other.example");
  auto server = https_server(cert);
  ASSERT_TRUE(server);
  const std::string where = "127.0.0.1:" + std::to_string(server->port());
  // Not trusted: the chain does not verify.
  Result<HttpAnswer> untrusted = http_call(https_url(server->port(), ""), {.method = "GET", .target = "/"});
  ASSERT_FALSE(untrusted);
  EXPECT_NE(untrusted.status().message().find("TLS handshake with " + where), std::string::npos) << untrusted.status().message();
  EXPECT_NE(untrusted.status().message().find("certificate verify failed: self"), std::string::npos)
      << untrusted.status().message();
  // Trusted, but for another host: the same server presenting `other`.
  server->stop();
  auto impostor = https_server(other);
  ASSERT_TRUE(impostor);
  Result<HttpAnswer> wrong_name = http_call(https_url(impostor->port(), other.cert), {.method = "GET", .target = "/"});
  ASSERT_FALSE(wrong_name);
  EXPECT_NE(wrong_name.status().message().find("the certificate does not name host 127.0.0.1"), std::string::npos)
      << wrong_name.status().message();
  // Plain http:// to an https:// server: no answer is taken for one.
  HttpUrl plain = https_url(impostor->port(), "");
  plain.tls = false;
  EXPECT_FALSE(http_call(plain, {.method = "GET", .target = "/", .deadline = std::chrono::milliseconds(2000)}));
  impostor->stop();
  std::filesystem::remove_all(cert.dir);
  std::filesystem::remove_all(other.dir);
}

}  // namespace
}  // namespace essaim::net
