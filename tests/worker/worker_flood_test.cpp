// A worker listening on TCP under a flood from one address (docs/worker.md, "Admission"): idle, slow and
// oversized-HELLO connections, then a real backbone that must be served within its deadline, with the
// process's resident memory under a stated bound and every refusal counted. Also: file descriptors of
// peers that reset their connections are released at once, not when the next connection arrives.
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <thread>

#include "net/admission.h"
#include "net/tcp.h"
#include "worker_test_util.h"

namespace essaim::worker::testing {
namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif
#else
constexpr bool kAddressSanitizer = false;
#endif

using namespace std::chrono_literals;

uint64_t rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  return 0;
}

size_t open_fds() {
  size_t n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (const dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
  }
  return n;
}

// A worker behind a real TCP listener on 127.0.0.1, as `essaim worker` serves it.
struct TcpWorker {
  explicit TcpWorker(const std::vector<std::string>& slices, WorkerOptions options) {
    Result<WorkerState> s = WorkerState::open(slices);
    EXPECT_TRUE(s.is_ok()) << s.status().message();
    state = std::make_unique<WorkerState>(std::move(*s));
    worker = std::make_unique<Worker>(*state, std::move(options));
    auto l = net::TcpListener::listen("127.0.0.1", 0);
    EXPECT_TRUE(l.is_ok());
    port = (*l)->port();
    server = std::make_unique<net::StreamServer>(
        std::move(*l), [this](net::ByteStream& st) { worker->serve_connection(st); },
        net::ServerOptions{.on_refused = [this](net::ByteStream& st) { worker->refuse_over_capacity(st); }});
  }
  ~TcpWorker() { server->stop(); }
  std::unique_ptr<net::TcpStream> dial() {
    auto c = net::tcp_connect("127.0.0.1", port, net::deadline_in(2s));
    EXPECT_TRUE(c.is_ok()) << c.error().message;
    return c ? std::move(*c) : nullptr;
  }
  std::unique_ptr<WorkerState> state;
  std::unique_ptr<Worker> worker;
  std::unique_ptr<net::StreamServer> server;
  uint16_t port = 0;
};

// A backbone's handshake and one request over TCP; the answer must be the reference's bits.
void serve_one_backbone(TcpWorker& w, const TestModel& m, std::chrono::milliseconds deadline) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<net::TcpStream> s = w.dial();
  ASSERT_TRUE(s);
  net::FrameConnection c(std::move(s));
  net::NetResult<proto::Hello> peer = net::handshake(c, backbone_hello(w.state->model()), net::deadline_in(deadline));
  ASSERT_TRUE(peer.is_ok()) << peer.error().message;
  std::mt19937_64 rng(5);
  proto::ExpertRequest r = random_request(m, {.layer = 0, .first = 0, .count = 4}, rng);
  std::vector<proto::ExpertResponse> got = exchange_all(c, {r});
  ASSERT_EQ(got.size(), 1u);
  expect_bits_equal(got[0].outputs, reference_outputs(m, r));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, deadline);
}

TEST(WorkerFlood, IdleSlowAndOversizedHellosFromOneAddressDoNotLockOutABackbone) {
  const TestModel& m = TestModel::get({});
  constexpr size_t kPerAddress = 8;
  TcpWorker w({m.slice(0, 1, 0, 4)},
              {.threads = 1, .handshake_timeout = 3s,
               .admission = {.max_unauthenticated = 16, .max_unauthenticated_per_address = kPerAddress}});
  serve_one_backbone(w, m, 2s);  // warm: pages of the slice, the first thread stacks
  const std::vector<uint8_t> junk(4 << 20, 0x5A);  // the attacker's bytes live in this process too
  const uint64_t rss0 = rss_bytes();

  // 40 idle connections, 12 slow ones (a HELLO header dribbled out, then nothing), 12 that send 60 KiB of a
  // 64 KiB HELLO and stall, and last, so that they are the newest and still admitted when memory is
  // measured, kPerAddress - 1 that declare a 16 MiB HELLO and send 4 MiB of it (the attack: before
  // the pre-handshake limit, these alone pinned 28 MiB).
  std::vector<std::unique_ptr<net::TcpStream>> flood;
  for (int i = 0; i < 40; ++i) flood.push_back(w.dial());
  std::vector<uint8_t> header;
  proto::append_frame_header(proto::FrameType::HELLO, 16ull << 20, header);
  for (int i = 0; i < 12; ++i) {
    flood.push_back(w.dial());
    (void)flood.back()->write_all(std::span(header).first(5), net::deadline_in(1s));
  }
  std::vector<uint8_t> almost;
  proto::append_frame_header(proto::FrameType::HELLO, proto::kMaxHelloPayloadBytes, almost);
  almost.resize(almost.size() + (60 << 10), 0x11);
  for (int i = 0; i < 12; ++i) {
    flood.push_back(w.dial());
    (void)flood.back()->write_all(almost, net::deadline_in(1s));
  }
  for (size_t i = 0; i + 1 < kPerAddress; ++i) {
    flood.push_back(w.dial());
    (void)flood.back()->write_all(header, net::deadline_in(1s));
    (void)flood.back()->write_all(junk, net::deadline_in(1s));  // refused from the header: fails early
  }
  const size_t n_hostile = flood.size();
  std::this_thread::sleep_for(300ms);  // let the worker read what was sent
  const uint64_t rss_flooded = rss_bytes();

  // The backbone arrives last, from the same address, and is served well within its deadline.
  serve_one_backbone(w, m, 2s);
  const uint64_t rss1 = rss_bytes();
  // Bound: at most kPerAddress unauthenticated connections of this address live, each holding at most one
  // 64 KiB HELLO plus a 64 KiB read buffer and a thread's touched stack; 8 MiB leaves room for allocator
  // slack. (Under ASan, freed buffers sit in its quarantine and shadow memory grows with them: 64 MiB.)
  const uint64_t bound = kAddressSanitizer ? (64ull << 20) : (8ull << 20);
  EXPECT_LT(rss_flooded, rss0 + bound) << "RSS grew from " << rss0 << " to " << rss_flooded << " bytes";
  EXPECT_LT(rss1, rss0 + bound) << "RSS grew from " << rss0 << " to " << rss1 << " bytes";
  std::printf("flood: RSS %.1f MiB -> %.1f MiB with %zu hostile connections, %.1f MiB after the backbone\n",
              double(rss0) / (1 << 20), double(rss_flooded) / (1 << 20), n_hostile, double(rss1) / (1 << 20));

  // An evicted idle connection was told why: the worker's HELLO, then REFUSE BUSY.
  net::FrameConnection first(std::move(flood.front()));
  net::NetResult<proto::Message> hello = first.receive(net::deadline_in(2s));
  ASSERT_TRUE(hello.is_ok()) << hello.error().message;
  EXPECT_TRUE(std::holds_alternative<proto::Hello>(*hello));
  net::NetResult<proto::Message> refuse = first.receive(net::deadline_in(2s));
  ASSERT_TRUE(refuse.is_ok()) << refuse.error().message;
  const auto* r = std::get_if<proto::Refuse>(&*refuse);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->reason, proto::RefuseReason::BUSY);
  EXPECT_NE(r->message.find("still in their handshake"), std::string::npos) << r->message;

  const WorkerStats st = w.worker->stats();
  EXPECT_EQ(st.handshakes_ok, 2u);
  // Each hostile connection was refused from its 16 MiB header (BAD_HELLO) or evicted by a newer one, but
  // for the kPerAddress newest, still waiting for their handshake deadline; an eviction is not also
  // counted as a refused handshake.
  const uint64_t bad_hello = st.handshakes_refused[size_t(proto::RefuseReason::BAD_HELLO)];
  EXPECT_GE(bad_hello, 1u);
  EXPECT_LE(bad_hello, kPerAddress - 1);
  EXPECT_GE(st.admission.evicted_address_full + bad_hello, n_hostile + 1 - kPerAddress);
  EXPECT_LE(st.admission.live_unauthenticated, kPerAddress);
  EXPECT_NE(st.to_json().find("\"evicted_address_full\""), std::string::npos) << st.to_json();
}

TEST(WorkerFlood, SilentPeersAreDroppedAtTheHandshakeDeadline) {
  const TestModel& m = TestModel::get({});
  TcpWorker w({m.slice(0, 1, 0, 4)}, {.threads = 1, .handshake_timeout = 300ms});
  std::unique_ptr<net::TcpStream> idle = w.dial();
  const auto t0 = std::chrono::steady_clock::now();
  net::FrameConnection c(std::move(idle));
  net::NetResult<proto::Message> hello = c.receive(net::deadline_in(2s));
  ASSERT_TRUE(hello.is_ok());
  // At the worker's deadline: a REFUSE saying why, then the close.
  net::NetResult<proto::Message> why = c.receive(net::deadline_in(3s));
  ASSERT_TRUE(why.is_ok()) << why.error().message;
  const auto* r = std::get_if<proto::Refuse>(&*why);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->reason, proto::RefuseReason::BAD_HELLO);
  EXPECT_NE(r->message.find("no HELLO before the handshake deadline"), std::string::npos) << r->message;
  net::NetResult<proto::Message> end = c.receive(net::deadline_in(3s));
  EXPECT_FALSE(end.is_ok());
  EXPECT_NE(end.error().kind, net::NetErrorKind::TIMEOUT);
  // Counted once the handler has returned, which may be just after the close reached us.
  for (int i = 0; i < 200 && w.worker->stats().handshakes_failed == 0; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(w.worker->stats().handshakes_failed, 1u);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
}

TEST(WorkerFlood, AuthenticatedCapRefusesWithBusy) {
  const TestModel& m = TestModel::get({});
  TcpWorker w({m.slice(0, 1, 0, 4)}, {.threads = 1, .admission = {.max_authenticated_per_address = 1}});
  std::unique_ptr<net::TcpStream> s1 = w.dial();
  net::FrameConnection c1(std::move(s1));
  ASSERT_TRUE(net::handshake(c1, backbone_hello(w.state->model()), net::deadline_in(2s)).is_ok());
  std::unique_ptr<net::TcpStream> s2 = w.dial();
  net::FrameConnection c2(std::move(s2));
  net::NetResult<proto::Hello> second = net::handshake(c2, backbone_hello(w.state->model()), net::deadline_in(2s));
  ASSERT_FALSE(second.is_ok());
  EXPECT_EQ(second.error().refuse, proto::RefuseReason::BUSY);
  EXPECT_NE(second.error().message.find("limit 1 per address"), std::string::npos) << second.error().message;
  EXPECT_EQ(w.worker->stats().admission.refused_address_full, 1u);
}

TEST(WorkerFlood, FileDescriptorsOfResetPeersAreReleasedAtOnce) {
  const TestModel& m = TestModel::get({});
  TcpWorker w({m.slice(0, 1, 0, 4)}, {.threads = 1});
  serve_one_backbone(w, m, 2s);
  std::this_thread::sleep_for(100ms);
  const size_t fds0 = open_fds();
  // 30 raw sockets that connect, wait for the worker's HELLO, then reset (SO_LINGER 0: an RST, no FIN).
  std::vector<int> socks;
  for (int i = 0; i < 30; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(w.port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    socks.push_back(fd);
  }
  for (int fd : socks) {
    uint8_t b[16];
    (void)::recv(fd, b, sizeof(b), 0);  // the worker has accepted it and sent its HELLO
    linger l{.l_onoff = 1, .l_linger = 0};
    ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    ::close(fd);
  }
  // No further connection arrives: the server must release the descriptors by itself, promptly.
  const auto until = std::chrono::steady_clock::now() + 500ms;
  size_t fds = open_fds();
  while (fds > fds0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(10ms);
    fds = open_fds();
  }
  EXPECT_LE(fds, fds0) << "descriptors open: " << fds << ", before the churn: " << fds0;
}

}  // namespace
}  // namespace essaim::worker::testing
