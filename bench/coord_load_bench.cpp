// The coordinator under a swarm's heartbeat load, measured (not simulated): an in-process Coordinator on a
// SQLite store holding --nodes registered workers (the Qwen3.5-122B catalogue, 48 layers x 8 slices, each
// slice held by --replicas of the first nodes), driven over loopback HTTP by --clients keep-alive client
// threads at the rate those nodes make: every node heartbeats every --heartbeat-s, and a node with room
// volunteers after each heartbeat (worker/joined_worker.cpp), so 2 x nodes / heartbeat_s requests a second.
// Open loop: each client sends its share on a fixed schedule and the late ones are sent as soon as it can.
// Reports the offered and achieved request rates, round-trip percentiles, and the disk writes of the
// process per second (/proc/self/io write_bytes: SQLite's WAL and checkpoints) and write transactions per
// second. One JSON document.
//
//   build/bench/coord_load_bench --nodes 10000 --heartbeat-s 10 --seconds 20 --clients 8
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "coord/coordinator.h"
#include "slice/model_identity.h"

namespace {

namespace beast = boost::beast;
namespace http = beast::http;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
const std::string kAdmin = "bench-admin-token-0123456789";

struct Node {
  std::string id, token, heartbeat, volunteer;
};

uint64_t written_bytes() {
  std::ifstream io("/proc/self/io");
  std::string key;
  uint64_t v = 0;
  while (io >> key >> v) {
    if (key == "write_bytes:") return v;
  }
  return 0;
}

std::string hex_of(uint64_t x) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(x));
  return b;
}

essaim::coord::Catalogue catalogue() {
  essaim::coord::Catalogue c;
  c.model_identity = std::string(64, 'a');
  c.architecture = "qwen35moe";
  c.n_layers = 48;
  c.n_experts = 256;
  c.n_expert_used = 8;
  c.protocol_version = 3;
  c.kernel_abi = "1";
  for (int64_t l = 0; l < 48; ++l) {
    for (int64_t f = 0; f < 256; f += 32) {
      c.slices.push_back({"q.L" + std::to_string(l) + ".E" + std::to_string(f) + ".gguf", l, f, 32, 170'000'000,
                          std::string(48, 'c') + hex_of(uint64_t(l * 256 + f))});
    }
  }
  return c;
}

// Registers the nodes straight in the store (one transaction) and writes each one's two request bodies.
std::vector<Node> make_nodes(essaim::coord::Store& db, const essaim::coord::Catalogue& cat, int n, int replicas) {
  std::vector<Node> nodes;
  std::mt19937_64 rng(11);
  const size_t holders = cat.slices.size() * size_t(replicas) / 4;  // 4 slices each
  essaim::Status st = db.exclusive([&]() -> essaim::Status {
    for (int i = 0; i < n; ++i) {
      Node node{"n-" + hex_of(uint64_t(i + 1)), hex_of(rng()) + hex_of(rng()) + hex_of(rng()) + hex_of(rng()), "", ""};
      const std::string hash = essaim::digest_hex(
          essaim::sha256({reinterpret_cast<const uint8_t*>(node.token.data()), node.token.size()}));
      ESSAIM_RETURN_IF_ERROR(db.add_node({.node_id = node.id, .name = node.id, .token_sha256 = hash,
                                          .registered_ms = 1'700'000'000'000 + i}));
      json holdings = json::array();
      if (size_t(i) < holders) {
        for (size_t k = 0; k < 4; ++k) {
          const auto& s = cat.slices[(size_t(i) * 4 + k) % cat.slices.size()];
          holdings.push_back({{"layer", s.layer}, {"expert_first", s.expert_first}, {"expert_count", s.expert_count},
                              {"sha256", s.sha256}});
        }
      }
      node.heartbeat = json{{"node_id", node.id}, {"address", "10.0.0.1:9000"},
                            {"fingerprint", {{"model_identity", cat.model_identity}, {"protocol_version", 3}, {"kernel_abi", "1"}}},
                            {"holdings", holdings}, {"capacity_bytes", int64_t(1536) << 20}, {"load", 0.1}}.dump();
      node.volunteer = json{{"node_id", node.id}, {"budget_bytes", int64_t(1536) << 20}}.dump();
      nodes.push_back(std::move(node));
    }
    return essaim::Status::ok();
  });
  if (!st) std::fprintf(stderr, "registering: %s\n", st.message().c_str());
  return nodes;
}

struct ClientResult {
  std::vector<double> ms;
  uint64_t errors = 0, late = 0;
};

// One keep-alive connection sending its nodes' requests on their schedule until `end`.
void client(uint16_t port, const std::vector<Node>& nodes, size_t first, size_t step, double period_s, Clock::time_point start,
            Clock::time_point end, ClientResult& out) {
  boost::asio::io_context ioc;
  beast::tcp_stream s(ioc);
  beast::error_code ec;
  s.connect({boost::asio::ip::make_address("127.0.0.1"), port}, ec);
  beast::flat_buffer buf;
  const size_t mine = (nodes.size() - first + step - 1) / step;
  for (uint64_t k = 0;; ++k) {
    const Node& n = nodes[first + (k / 2 % mine) * step];
    // Node j of this client heartbeats at j/mine of the period, its volunteer call right after.
    const double at = double(k / 2 / mine) * period_s + double(k / 2 % mine) / double(mine) * period_s;
    const auto when = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(at));
    if (when >= end || Clock::now() >= end) break;  // what the coordinator could not take by the end stays unsent
    if (Clock::now() < when) std::this_thread::sleep_until(when); else if (k % 2 == 0) ++out.late;
    const bool hb = k % 2 == 0;
    http::request<http::string_body> req(http::verb::post, hb ? "/api/expert-coverage" : "/api/expert-volunteer", 11);
    req.set(http::field::host, "127.0.0.1");
    req.set(http::field::authorization, "Bearer " + n.token);
    req.keep_alive(true);
    req.body() = hb ? n.heartbeat : n.volunteer;
    req.prepare_payload();
    const auto t0 = Clock::now();
    http::write(s, req, ec);
    http::response<http::string_body> res;
    if (!ec) http::read(s, buf, res, ec);
    if (ec || res.result_int() != 200) {
      ++out.errors;
      if (ec) {
        s.close();
        s.connect({boost::asio::ip::make_address("127.0.0.1"), port}, ec);
      }
      continue;
    }
    out.ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
}

double pct(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(q * double(v.size())))];
}

}  // namespace

int main(int argc, char** argv) {
  using namespace essaim;
  CLI::App app("the coordinator under a swarm's heartbeat load (loopback HTTP, SQLite)");
  int nodes_n = 10000, heartbeat_s = 10, clients = 8, threads = 4, replicas = 2;
  double seconds = 20;
  app.add_option("--nodes", nodes_n, "registered worker nodes")->capture_default_str()->check(CLI::Range(1, 1'000'000));
  app.add_option("--heartbeat-s", heartbeat_s, "each node's heartbeat period")->capture_default_str()->check(CLI::Range(1, 3600));
  app.add_option("--seconds", seconds, "measured time")->capture_default_str()->check(CLI::Range(1.0, 3600.0));
  app.add_option("--clients", clients, "client threads (keep-alive connections)")->capture_default_str()->check(CLI::Range(1, 256));
  app.add_option("--threads", threads, "coordinator threads")->capture_default_str()->check(CLI::Range(1, 256));
  app.add_option("--replicas", replicas, "wanted replicas (the first nodes hold 4 slices each)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const auto dir = std::filesystem::temp_directory_path() / ("essaim-coord-load-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const coord::Catalogue cat = catalogue();
  auto store = coord::open_store((dir / "load.sqlite").string());
  if (!store) return std::fprintf(stderr, "%s\n", store.status().message().c_str()), 1;
  const std::vector<Node> nodes = make_nodes(**store, cat, nodes_n, replicas);
  coord::Coordinator c(cat, std::move(*store),
                       {.admin_token = kAdmin, .slices_dir = dir.string(), .replicas = replicas,
                        .heartbeat_s = heartbeat_s, .threads = threads});
  auto server = net::HttpServer::listen("127.0.0.1", 0, c.http_limits(),
                                        [&c](const net::HttpRequestView& r, std::shared_ptr<net::HttpResponder> o) {
                                          c.handle(r, std::move(o));
                                        });
  if (!server) return std::fprintf(stderr, "%s\n", server.status().message().c_str()), 1;
  std::vector<ClientResult> results(static_cast<size_t>(clients));
  std::vector<std::thread> pool;
  const uint64_t w0 = written_bytes();
  const auto start = Clock::now() + std::chrono::milliseconds(200);
  const auto end = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  for (int k = 0; k < clients; ++k) {
    pool.emplace_back(client, (*server)->port(), std::cref(nodes), size_t(k), size_t(clients), double(heartbeat_s),
                      start, end, std::ref(results[size_t(k)]));
  }
  for (std::thread& t : pool) t.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  const uint64_t w1 = written_bytes();
  (*server)->stop();
  c.stop();
  std::vector<double> ms;
  uint64_t errors = 0, late = 0;
  for (const ClientResult& r : results) {
    ms.insert(ms.end(), r.ms.begin(), r.ms.end());
    errors += r.errors;
    late += r.late;
  }
  const json out = {{"benchmark", "coord_load"}, {"nodes", nodes_n}, {"heartbeat_s", heartbeat_s},
                    {"clients", clients}, {"coordinator_threads", threads}, {"store", "sqlite"},
                    {"seconds", elapsed}, {"offered_requests_per_s", 2.0 * nodes_n / heartbeat_s},
                    {"achieved_requests_per_s", double(ms.size()) / elapsed}, {"errors", errors},
                    {"late_heartbeats", late},
                    {"round_trip_ms", {{"p50", pct(ms, 0.5)}, {"p99", pct(ms, 0.99)}, {"max", pct(ms, 1.0)}}},
                    {"write_transactions_per_s", double(ms.size()) / elapsed},
                    {"disk_write_mb_per_s", double(w1 - w0) / elapsed / 1e6}};
  std::puts(out.dump().c_str());
  std::filesystem::remove_all(dir);
  return 0;
}
