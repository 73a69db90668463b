// TCP specifics: TCP_NODELAY on every socket, address parsing, connect failures and listener behaviour.
#include <gtest/gtest.h>
#include <netdb.h>

#include <future>

#include "net_test_util.h"

namespace essaim::net {
namespace {

using namespace std::chrono_literals;

TEST(Tcp, EverySocketHasNoDelay) {
  auto listener = TcpListener::listen("127.0.0.1", 0);
  ASSERT_TRUE(listener) << listener.error().message;
  auto client = tcp_connect("127.0.0.1", (*listener)->port(), deadline_in(5s));
  ASSERT_TRUE(client) << client.error().message;
  auto server = (*listener)->accept(deadline_in(5s));
  ASSERT_TRUE(server) << server.error().message;
  EXPECT_TRUE((*client)->no_delay());
  auto* tcp_server = dynamic_cast<TcpStream*>(server->get());
  ASSERT_NE(tcp_server, nullptr);
  EXPECT_TRUE(tcp_server->no_delay());
  EXPECT_NE((*client)->peer_name().find("127.0.0.1:"), std::string::npos) << (*client)->peer_name();
}

TEST(Tcp, ConnectsByName) {
  // A bare chroot without /etc/hosts cannot resolve "localhost"; that is the machine, not the transport.
  addrinfo* found = nullptr;
  if (getaddrinfo("localhost", nullptr, nullptr, &found) != 0) GTEST_SKIP() << "'localhost' does not resolve here";
  freeaddrinfo(found);
  auto listener = TcpListener::listen("127.0.0.1", 0);
  ASSERT_TRUE(listener);
  auto client = tcp_connect("localhost", (*listener)->port(), deadline_in(5s));
  // "localhost" may resolve to ::1 first; async_connect tries each address in turn.
  ASSERT_TRUE(client) << client.error().message;
}

TEST(Tcp, ConnectToAClosedPortFailsFast) {
  uint16_t port = 0;
  {
    auto listener = TcpListener::listen("127.0.0.1", 0);
    ASSERT_TRUE(listener);
    port = (*listener)->port();
  }  // closed again: nothing listens there now
  auto start = Clock::now();
  auto client = tcp_connect("127.0.0.1", port, deadline_in(5s));
  ASSERT_FALSE(client);
  EXPECT_EQ(client.error().kind, NetErrorKind::IO) << client.error().message;
  EXPECT_LT(Clock::now() - start, 2s);
}

TEST(Tcp, ListenerAcceptHasADeadlineAndCloseWakesIt) {
  auto listener = TcpListener::listen("127.0.0.1", 0);
  ASSERT_TRUE(listener);
  auto start = Clock::now();
  auto none = (*listener)->accept(start + 100ms);
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().kind, NetErrorKind::TIMEOUT);
  EXPECT_GE(Clock::now() - start, 100ms);

  auto waiting = std::async(std::launch::async, [&] { return (*listener)->accept(kNoDeadline); });
  std::this_thread::sleep_for(30ms);
  (*listener)->close();
  ASSERT_EQ(waiting.wait_for(5s), std::future_status::ready) << "close() did not wake accept()";
  auto closed = waiting.get();
  ASSERT_FALSE(closed);
  EXPECT_EQ(closed.error().kind, NetErrorKind::CLOSED);
}

TEST(Tcp, ListenRefusesABadAddressAndABusyPort) {
  EXPECT_FALSE(TcpListener::listen("not-an-address", 0));
  auto first = TcpListener::listen("127.0.0.1", 0);
  ASSERT_TRUE(first);
  auto second = TcpListener::listen("127.0.0.1", (*first)->port());
  ASSERT_FALSE(second);
  EXPECT_NE(second.error().message.find("binding"), std::string::npos) << second.error().message;
}

TEST(Tcp, ParseHostPort) {
  auto a = parse_host_port("127.0.0.1:9000");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->first, "127.0.0.1");
  EXPECT_EQ(a->second, 9000);
  auto b = parse_host_port("[::1]:65535");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->first, "::1");
  EXPECT_EQ(b->second, 65535);
  auto c = parse_host_port("worker-3.lan:0");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->first, "worker-3.lan");
  for (const char* bad : {"", "host", "host:", ":80", "host:65536", "host:80x", "::1:80", "[::1]80", "[::1]:"}) {
    EXPECT_FALSE(parse_host_port(bad)) << bad;
  }
}

}  // namespace
}  // namespace essaim::net
