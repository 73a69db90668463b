// The slice downloader against a real HTTP server (net::HttpServer on loopback) that serves a file with
// Range and, on purpose, damages some answers: a flipped byte, a body cut short, a wrong length, a wrong
// X-Essaim-Sha256. Each must be refused, re-fetched and end in a byte-exact file, or fail with a message.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>

#include "slice/model_identity.h"
#include "node/slice_download.h"
#include "net/http_server.h"
#include "temp_dir.h"

namespace essaim::node {
namespace {

namespace fs = std::filesystem;

enum class Fault { none, flip_byte, truncate, wrong_length, wrong_sha_header, ignore_range, unauthorized };

struct SliceServer {
  std::string name = "m.L03.E032-063.gguf";
  std::string bytes;
  std::string sha;
  std::string token = "node-token";
  std::mutex mu;
  std::vector<Fault> faults;  // one per request, in order; none after
  std::vector<std::string> ranges_seen;
  std::atomic<int> requests{0};
  std::unique_ptr<net::HttpServer> server;

  explicit SliceServer(size_t size) {
    std::mt19937 rng(1234);
    bytes.resize(size);
    for (char& c : bytes) c = char(rng());
    sha = digest_hex(sha256(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size())));
    auto s = net::HttpServer::listen("127.0.0.1", 0, {}, [this](const net::HttpRequestView& req,
                                                               std::shared_ptr<net::HttpResponder> out) {
      handle(req, *out);
    });
    EXPECT_TRUE(s) << s.status().message();
    server = std::move(*s);
  }
  net::HttpUrl url() const { return {.host = "127.0.0.1", .port = server->port(), .base_path = ""}; }
  SliceOffer offer() const {
    return {.range = {3, 32, 32}, .name = name, .bytes = bytes.size(), .sha256 = sha, .url = "/slices/" + name};
  }

  void handle(const net::HttpRequestView& req, net::HttpResponder& out) {
    Fault fault = Fault::none;
    {
      std::lock_guard lock(mu);
      if (!faults.empty()) {
        fault = faults.front();
        faults.erase(faults.begin());
      }
      ranges_seen.push_back(req.range);
    }
    ++requests;
    if (req.authorization != "Bearer " + token || fault == Fault::unauthorized) {
      return out.reply({.status = 401, .content_type = "application/json", .body = R"({"error":{"message":"bad token","code":"unauthorized"}})", .headers = {}});
    }
    if (req.target != "/slices/" + name) return out.reply({.status = 404, .content_type = "application/json", .body = "{}", .headers = {}});
    size_t a = 0;
    if (!req.range.empty() && fault != Fault::ignore_range) {
      unsigned long long from = 0;
      if (std::sscanf(req.range.c_str(), "bytes=%llu-", &from) != 1) return out.reply({.status = 400, .content_type = "application/json", .body = "{}", .headers = {}});
      if (from >= bytes.size()) {
        return out.reply({.status = 416, .body = "{}", .headers = {{"Content-Range", "bytes */" + std::to_string(bytes.size())}}});
      }
      a = size_t(from);
    }
    std::string body = bytes.substr(a);
    net::HttpReply r{.status = a > 0 ? 206 : 200, .content_type = "application/octet-stream", .body = {}, .headers = {}};
    r.headers.emplace_back("Accept-Ranges", "bytes");
    r.headers.emplace_back("X-Essaim-Sha256", fault == Fault::wrong_sha_header ? std::string(64, 'a') : sha);
    if (a > 0) {
      r.headers.emplace_back("Content-Range", "bytes " + std::to_string(a) + "-" + std::to_string(bytes.size() - 1) + "/" +
                                                  std::to_string(bytes.size()));
    }
    if (fault == Fault::flip_byte) body[body.size() / 2] ^= 0x10;
    if (fault == Fault::truncate) {
      // Announce the whole length, send 40% of it, close: a body cut short.
      r.headers.emplace_back("Content-Length", std::to_string(body.size()));
      r.body = body.substr(0, body.size() * 2 / 5);
      out.stream_begin(std::move(r));
      out.stream_end();
      return;
    }
    if (fault == Fault::wrong_length) body.pop_back();
    r.body = std::move(body);
    out.reply(std::move(r));
  }
};

struct DownloadTest : ::testing::Test {
  fs::path dir;
  void SetUp() override {
    dir = essaim::testing::make_temp_dir(std::string("essaim_dl_") +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override { fs::remove_all(dir); }
  std::string read(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }
  DownloadOptions fast() { return {.attempts = 4, .read_timeout = std::chrono::milliseconds(5000),
                                   .retry_pause = std::chrono::milliseconds(10), .progress = false}; }
};

TEST_F(DownloadTest, WholeFileVerifiedAndRenamed) {
  SliceServer s(300'000);
  Result<DownloadReport> r = download_slice(s.url(), s.token, s.offer(), dir.string(), fast());
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ(r->attempts, 1);
  EXPECT_EQ(r->bytes_fetched, s.bytes.size());
  EXPECT_EQ(read(r->path), s.bytes);
  EXPECT_FALSE(fs::exists(r->path + ".part"));
  // Present and verified: a second call fetches nothing.
  Result<DownloadReport> again = download_slice(s.url(), s.token, s.offer(), dir.string(), fast());
  ASSERT_TRUE(again);
  EXPECT_TRUE(again->already_present);
  EXPECT_EQ(s.requests.load(), 1);
}

TEST_F(DownloadTest, ResumesAPartFileWithRange) {
  SliceServer s(500'000);
  {
    std::ofstream part(dir / (s.name + ".part"), std::ios::binary);
    part.write(s.bytes.data(), 123'457);  // what a killed download left
  }
  Result<DownloadReport> r = download_slice(s.url(), s.token, s.offer(), dir.string(), fast());
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ(r->resumed_from, 123'457u);
  EXPECT_EQ(r->bytes_fetched, s.bytes.size() - 123'457);
  ASSERT_EQ(s.ranges_seen.size(), 1u);
  EXPECT_EQ(s.ranges_seen[0], "bytes=123457-");
  EXPECT_EQ(read(r->path), s.bytes);
}

TEST_F(DownloadTest, FlippedByteIsRefusedAndRefetched) {
  SliceServer s(200'000);
  s.faults = {Fault::flip_byte};
  Result<DownloadReport> r = download_slice(s.url(), s.token, s.offer(), dir.string(), fast());
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ(r->attempts, 2);
  EXPECT_EQ(read(r->path), s.bytes);
}

TEST_F(DownloadTest, TruncatedBodyResumesFromWhatArrived) {
  SliceServer s(400'000);
  s.faults = {Fault::truncate, Fault::truncate};
  Result<DownloadReport> r = download_slice(s.url(), s.token, s.offer(), dir.string(), fast());
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ(r->attempts, 3);
  ASSERT_EQ(s.ranges_seen.size(), 3u);
  EXPECT_EQ(s.ranges_seen[0], "");
  EXPECT_EQ(s.ranges_seen[1], "bytes=160000-");  // 40% of 400000
  EXPECT_EQ(read(r->path), s.bytes);
}

TEST_F(DownloadTest, WrongLengthAndIgnoredRangeAreHandled) {
  SliceServer s(100'000);
  s.faults = {Fault::wrong_length};
  Result<DownloadReport> r = download_slice(s.url(), s.token, s.offer(), dir.string(), fast());
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ(r->attempts, 2);
  EXPECT_EQ(read(r->path), s.bytes);

  SliceServer t(100'000);
  {
    std::ofstream part(dir / (t.name + ".part"), std::ios::binary);
    part.write("garbage-not-a-prefix", 20);
  }
  fs::remove(dir / t.name);
  t.faults = {Fault::ignore_range};  // a 200 to a Range request: the part is replaced from byte 0
  Result<DownloadReport> u = download_slice(t.url(), t.token, t.offer(), dir.string(), fast());
  ASSERT_TRUE(u) << u.status().message();
  EXPECT_EQ(read(u->path), t.bytes);
}

TEST_F(DownloadTest, PartThatIsNotAPrefixIsCaughtByTheHash) {
  SliceServer s(100'000);
  std::string wrong = s.bytes.substr(0, 5000);
  wrong[17] ^= 1;
  {
    std::ofstream part(dir / (s.name + ".part"), std::ios::binary);
    part.write(wrong.data(), std::streamsize(wrong.size()));
  }
  Result<DownloadReport> r = download_slice(s.url(), s.token, s.offer(), dir.string(), fast());
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ(r->attempts, 2);  // resumed, hash refused, fetched whole
  EXPECT_EQ(read(r->path), s.bytes);
}

TEST_F(DownloadTest, CorruptedEveryTimeGivesUpWithAMessage) {
  SliceServer s(50'000);
  s.faults = {Fault::flip_byte, Fault::flip_byte, Fault::flip_byte, Fault::flip_byte};
  Result<DownloadReport> r = download_slice(s.url(), s.token, s.offer(), dir.string(), fast());
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().message().find("gave up after 4 attempts"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("SHA-256"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir / s.name));
}

TEST_F(DownloadTest, WrongShaHeaderAndBadTokenStopAtOnce) {
  SliceServer s(50'000);
  s.faults = {Fault::wrong_sha_header};
  Result<DownloadReport> r = download_slice(s.url(), s.token, s.offer(), dir.string(), fast());
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().message().find("X-Essaim-Sha256"), std::string::npos);
  EXPECT_EQ(s.requests.load(), 1);

  Result<DownloadReport> bad = download_slice(s.url(), "wrong", s.offer(), dir.string(), fast());
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.status().message().find("401"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir / s.name));
}

TEST_F(DownloadTest, StaleCompleteFileIsReplaced) {
  SliceServer s(60'000);
  std::string stale = s.bytes;
  stale[100] ^= 0x40;
  {
    std::ofstream f(dir / s.name, std::ios::binary);
    f.write(stale.data(), std::streamsize(stale.size()));
  }
  Result<DownloadReport> r = download_slice(s.url(), s.token, s.offer(), dir.string(), fast());
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_FALSE(r->already_present);
  EXPECT_EQ(read(r->path), s.bytes);
}

TEST_F(DownloadTest, HostileOffersAreRefused) {
  SliceServer s(1000);
  SliceOffer o = s.offer();
  o.name = "../etc/passwd";
  EXPECT_FALSE(download_slice(s.url(), s.token, o, dir.string(), fast()));
  o = s.offer();
  o.sha256 = "xyz";
  EXPECT_FALSE(download_slice(s.url(), s.token, o, dir.string(), fast()));
  EXPECT_EQ(s.requests.load(), 0);
}

}  // namespace
}  // namespace essaim::node
