// The coordinator's speeds, one JSON document: a slice download over loopback HTTP (Range-capable,
// streamed 1 MiB at a time) against reading the same file straight from disk in the same run (both from a
// warm page cache after the first pass), and the round trip of a heartbeat and of a volunteer request on
// a SQLite store (each a committed, fsynced transaction). Medians of --reps runs.
//
//   build/bench/coord_bench --mib 256 --reps 5
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "coord/coordinator.h"
#include "slice/model_identity.h"
#include "median.h"

namespace {

namespace beast = boost::beast;
namespace http = beast::http;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

const std::string kAdmin = "bench-admin-token-0123456789";

// One request on a fresh connection; returns (status, body bytes) and discards the body as it arrives.
std::pair<int, std::string> call(uint16_t port, const std::string& method, const std::string& target,
                                 const std::string& body, const std::string& token, bool keep_body = true) {
  boost::asio::io_context ioc;
  beast::tcp_stream s(ioc);
  beast::error_code ec;
  s.connect({boost::asio::ip::make_address("127.0.0.1"), port}, ec);
  if (ec) return {0, {}};
  http::request<http::string_body> req(http::string_to_verb(method), target, 11);
  req.set(http::field::host, "127.0.0.1");
  req.set(http::field::authorization, "Bearer " + token);
  req.body() = body;
  req.prepare_payload();
  http::write(s, req, ec);
  beast::flat_buffer buf;
  if (keep_body) {
    http::response_parser<http::string_body> p;
    p.body_limit(uint64_t(1) << 36);
    http::read(s, buf, p, ec);
    return {ec ? 0 : p.get().result_int(), p.get().body()};
  }
  http::response_parser<http::buffer_body> p;
  p.body_limit(uint64_t(1) << 36);
  http::read_header(s, buf, p, ec);
  std::vector<char> chunk(4 << 20);
  buf.reserve(4 << 20);
  uint64_t n = 0;
  while (!ec && !p.is_done()) {
    p.get().body().data = chunk.data();
    p.get().body().size = chunk.size();
    http::read(s, buf, p, ec);
    if (ec == http::error::need_buffer) ec = {};
    n += chunk.size() - p.get().body().size;
  }
  return {ec ? 0 : p.get().result_int(), std::to_string(n)};
}

using essaim::bench::median;

}  // namespace

int main(int argc, char** argv) {
  using namespace essaim;
  CLI::App app("coordinator download and round-trip speeds");
  int mib = 256, reps = 5, trips = 200;
  app.add_option("--mib", mib, "slice size in MiB")->capture_default_str();
  app.add_option("--reps", reps, "download repetitions")->capture_default_str();
  app.add_option("--trips", trips, "heartbeats and volunteer calls timed")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  const auto dir = std::filesystem::temp_directory_path() / ("essaim-coord-bench-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string name = "bench.L00.E000-031.gguf";
  std::string bytes(size_t(mib) << 20, '\0');
  std::mt19937_64 rng(5);
  for (size_t i = 0; i + 8 <= bytes.size(); i += 8) {
    const uint64_t x = rng();
    std::memcpy(bytes.data() + i, &x, 8);
  }
  std::ofstream(dir / name, std::ios::binary) << bytes;
  coord::Catalogue cat;
  cat.model_identity = std::string(64, 'a');
  cat.n_layers = 1;
  cat.n_experts = 64;
  cat.protocol_version = 2;
  cat.kernel_abi = "1";
  cat.slices.push_back({name, 0, 0, 32, int64_t(bytes.size()),
                        digest_hex(sha256({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}))});
  cat.slices.push_back({"bench.L00.E032-063.gguf", 0, 32, 32, 1, std::string(64, 'b')});
  bytes.clear();
  bytes.shrink_to_fit();
  auto store = coord::open_store((dir / "bench.sqlite").string());
  if (!store) return std::fprintf(stderr, "%s\n", store.status().message().c_str()), 1;
  coord::Coordinator c(cat, std::move(*store), {.admin_token = kAdmin, .slices_dir = dir.string()});
  auto server = net::HttpServer::listen("127.0.0.1", 0, c.http_limits(),
                                        [&c](const net::HttpRequestView& r, std::shared_ptr<net::HttpResponder> o) {
                                          c.handle(r, std::move(o));
                                        });
  if (!server) return std::fprintf(stderr, "%s\n", server.status().message().c_str()), 1;
  const uint16_t port = (*server)->port();

  std::vector<double> disk, download;
  std::vector<char> buf(1 << 20);
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    std::FILE* f = std::fopen((dir / name).c_str(), "rb");
    size_t n = 0, got = 0;
    while ((got = std::fread(buf.data(), 1, buf.size(), f)) > 0) n += got;
    std::fclose(f);
    disk.push_back(double(n) / std::chrono::duration<double>(Clock::now() - t0).count() / 1e6);
    t0 = Clock::now();
    auto [status, len] = call(port, "GET", "/slices/" + name, "", kAdmin, false);
    if (status != 200 || std::stoull(len) != n) return std::fprintf(stderr, "download failed (%d, %s)\n", status, len.c_str()), 1;
    download.push_back(double(n) / std::chrono::duration<double>(Clock::now() - t0).count() / 1e6);
  }

  auto reg = call(port, "POST", "/api/nodes", R"({"name": "bench"})", kAdmin);
  const json node = json::parse(reg.second);
  const std::string id = node["node_id"], token = node["token"];
  const std::string hb = json{{"node_id", id}, {"address", "127.0.0.1:9000"},
                              {"fingerprint", {{"model_identity", cat.model_identity}, {"protocol_version", 2}, {"kernel_abi", "1"}}},
                              {"holdings", json::array({{{"layer", 0}, {"expert_first", 0}, {"expert_count", 32}, {"sha256", cat.slices[0].sha256}}})},
                              {"capacity_bytes", 1 << 30}, {"load", 0.1}}.dump();
  const std::string vol = json{{"node_id", id}, {"budget_bytes", 1 << 20}}.dump();
  std::vector<double> hb_ms, vol_ms;
  for (int i = 0; i < trips; ++i) {
    auto t0 = Clock::now();
    if (call(port, "POST", "/api/expert-coverage", hb, token).first != 200) return std::fprintf(stderr, "heartbeat failed\n"), 1;
    hb_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    t0 = Clock::now();
    if (call(port, "POST", "/api/expert-volunteer", vol, token).first != 200) return std::fprintf(stderr, "volunteer failed\n"), 1;
    vol_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  (*server)->stop();
  c.stop();
  std::filesystem::remove_all(dir);
  const double d = median(disk), h = median(download);
  std::printf("%s\n", json{{"bench", "coord"}, {"slice_mib", mib}, {"reps", reps},
                           {"file_read_mb_s", d}, {"download_mb_s", h}, {"download_vs_file_read", h / d},
                           {"heartbeat_round_trip_ms_median", median(hb_ms)},
                           {"volunteer_round_trip_ms_median", median(vol_ms)}, {"round_trips", trips},
                           {"store", "sqlite (WAL, synchronous=FULL)"}}.dump(2).c_str());
  return 0;
}
