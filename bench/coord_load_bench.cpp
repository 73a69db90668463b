// The coordinator under a swarm's heartbeat load, measured (not simulated): an in-process Coordinator on a
// SQLite store, or a PostgreSQL server the bench starts in a temp dir (--store postgres; initdb and pg_ctl
// as tests/coord/pg_cluster.h runs them, fsync on), holding --nodes registered workers (the Qwen3.5-122B catalogue, 48 layers x 8 slices, each
// slice held by --replicas of the first nodes), driven over loopback HTTP by --clients keep-alive client
// threads at the rate those nodes make: every node heartbeats every --heartbeat-s, and a node with room
// volunteers after each heartbeat (worker/joined_worker.cpp), so 2 x nodes / heartbeat_s requests a second.
// Open loop: each client sends its share on a fixed schedule and the late ones are sent as soon as it can.
// Reports the offered and achieved request rates, round-trip percentiles, and the store's write rate:
// transactions that changed a row and rows changed per second (Store::writes), bytes written to disk per
// second (SQLite: this process's /proc/self/io write_bytes, its WAL and checkpoints; PostgreSQL: the
// server processes' write_bytes, and its WAL bytes from pg_current_wal_lsn), and the coordinator's own
// counters (market rereads, answers decided or told nothing). One JSON document.
//
//   build/bench/coord_load_bench --nodes 10000 --heartbeat-s 10 --seconds 20 --clients 8 [--store postgres]
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
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "coord/coordinator.h"
#include "coord/sql_connection.h"
#include "pg_cluster.h"
#include "slice/model_identity.h"

namespace {

namespace beast = boost::beast;
using essaim::coord::testing::PgCluster;
namespace http = beast::http;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
const std::string kAdmin = "bench-admin-token-0123456789";

struct Node {
  std::string id, token, heartbeat, volunteer;
};

// A field of /proc/PID/io: "write_bytes:" (what the kernel counts as sent to storage) or "wchar:" (bytes
// passed to write calls; a PostgreSQL server answers its clients with send(), which it does not count).
uint64_t io_field(const std::string& pid, const std::string& field) {
  std::ifstream io("/proc/" + pid + "/io");
  std::string key;
  uint64_t v = 0;
  while (io >> key >> v) {
    if (key == field) return v;
  }
  return 0;
}

// The PostgreSQL server's processes: the postmaster (first line of postmaster.pid) and its children.
uint64_t server_io(const std::string& data_dir, const std::string& field) {
  std::ifstream pidfile(data_dir + "/postmaster.pid");
  std::string postmaster;
  if (!(pidfile >> postmaster)) return 0;
  uint64_t sum = io_field(postmaster, field);
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string pid = e.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const size_t close = line.rfind(')');  // "pid (comm) state ppid ..."
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 1));
    std::string state, ppid;
    if (rest >> state >> ppid && ppid == postmaster) sum += io_field(pid, field);
  }
  return sum;
}

// Where the store writes, measured before and after the run.
struct WriteProbe {
  std::string store = "sqlite", url, data_dir;
  std::unique_ptr<essaim::coord::SqlConnection> pg;  // a second connection, for the WAL position
  uint64_t disk_bytes() const { return pg ? server_io(data_dir, "write_bytes:") : io_field("self", "write_bytes:"); }
  uint64_t write_call_bytes() const { return pg ? server_io(data_dir, "wchar:") : 0; }
  double wal_bytes() const {
    if (!pg) return 0;
    auto r = pg->query("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')", {});
    return r && !r->empty() && (*r)[0][0] ? std::stod(*(*r)[0][0]) : 0;
  }
};

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

struct Options {
  int nodes = 10000, heartbeat_s = 10, clients = 8, threads = 4, replicas = 2;
  double seconds = 20;
  std::string store = "sqlite";
};

struct LoadResult {
  std::vector<double> ms;
  uint64_t errors = 0, late = 0;
  double elapsed = 0;
};

LoadResult drive(uint16_t port, const std::vector<Node>& nodes, const Options& o) {
  std::vector<ClientResult> results(static_cast<size_t>(o.clients));
  std::vector<std::thread> pool;
  const auto start = Clock::now() + std::chrono::milliseconds(200);
  const auto end = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.seconds));
  for (int k = 0; k < o.clients; ++k) {
    pool.emplace_back(client, port, std::cref(nodes), size_t(k), size_t(o.clients), double(o.heartbeat_s), start, end,
                      std::ref(results[size_t(k)]));
  }
  for (std::thread& t : pool) t.join();
  LoadResult r;
  r.elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  for (const ClientResult& c : results) {
    r.ms.insert(r.ms.end(), c.ms.begin(), c.ms.end());
    r.errors += c.errors;
    r.late += c.late;
  }
  return r;
}

// One sample of the coordinator's /metrics ("name" or "name{labels}"), 0 when absent.
double metric(const std::string& text, const std::string& sample) {
  const size_t at = text.find("\n" + sample + " ");
  return at == std::string::npos ? 0 : std::strtod(text.c_str() + at + sample.size() + 2, nullptr);
}

std::string get_metrics(uint16_t port) {
  boost::asio::io_context ioc;
  beast::tcp_stream s(ioc);
  beast::error_code ec;
  s.connect({boost::asio::ip::make_address("127.0.0.1"), port}, ec);
  http::request<http::empty_body> req(http::verb::get, "/metrics", 11);
  req.set(http::field::host, "127.0.0.1");
  beast::flat_buffer buf;
  http::response<http::string_body> res;
  if (!ec) http::write(s, req, ec);
  if (!ec) http::read(s, buf, res, ec);
  return ec ? std::string() : "\n" + res.body();
}

// Starts the store the options name: a SQLite file in `dir`, or a fresh database on a PostgreSQL server.
essaim::Result<std::unique_ptr<essaim::coord::Store>> open_bench_store(const Options& o, const std::filesystem::path& dir,
                                                                       std::optional<PgCluster>& pg, WriteProbe& probe) {
  probe.store = o.store;
  if (o.store == "sqlite") return essaim::coord::open_store((dir / "load.sqlite").string());
  pg.emplace();
  if (!pg->ok()) return essaim::Status::error("PostgreSQL: " + pg->why());
  const std::string url = pg->fresh_url();
  ESSAIM_ASSIGN_OR_RETURN(probe.pg, essaim::coord::open_pg_connection(url));
  probe.data_dir = pg->data_dir();
  return essaim::coord::open_store(url, o.threads);  // a connection per coordinator thread, as essaim coordinator
}

struct WriteDelta {
  essaim::coord::StoreWrites store;
  uint64_t disk_bytes = 0, write_call_bytes = 0;
  double wal_bytes = 0;
};

json report(const Options& o, const LoadResult& r, const WriteDelta& w, const std::string& metrics) {
  const double t = r.elapsed;
  json out = {{"benchmark", "coord_load"}, {"nodes", o.nodes}, {"heartbeat_s", o.heartbeat_s},
              {"clients", o.clients}, {"coordinator_threads", o.threads}, {"store", o.store},
              {"seconds", t}, {"offered_requests_per_s", 2.0 * o.nodes / o.heartbeat_s},
              {"achieved_requests_per_s", double(r.ms.size()) / t}, {"errors", r.errors},
              {"late_heartbeats", r.late},
              {"round_trip_ms", {{"p50", pct(r.ms, 0.5)}, {"p99", pct(r.ms, 0.99)}, {"max", pct(r.ms, 1.0)}}},
              {"write_transactions_per_s", double(w.store.transactions) / t},
              {"rows_written_per_s", double(w.store.rows) / t},
              {"disk_write_mb_per_s", double(w.disk_bytes) / t / 1e6},
              {"market_rereads", metric(metrics, "essaim_coord_market_rereads_total")},
              {"answers_decided", metric(metrics, "essaim_coord_volunteer_answers_total{how=\"decided\"}")},
              {"answers_nothing_needed", metric(metrics, "essaim_coord_volunteer_answers_total{how=\"nothing_needed\"}")}};
  if (o.store == "postgres") {
    out["wal_mb_per_s"] = w.wal_bytes / t / 1e6;
    out["server_write_call_mb_per_s"] = double(w.write_call_bytes) / t / 1e6;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace essaim;
  CLI::App app("the coordinator under a swarm's heartbeat load (loopback HTTP, SQLite or PostgreSQL)");
  Options o;
  app.add_option("--nodes", o.nodes, "registered worker nodes")->capture_default_str()->check(CLI::Range(1, 1'000'000));
  app.add_option("--heartbeat-s", o.heartbeat_s, "each node's heartbeat period")->capture_default_str()->check(CLI::Range(1, 3600));
  app.add_option("--seconds", o.seconds, "measured time")->capture_default_str()->check(CLI::Range(1.0, 3600.0));
  app.add_option("--clients", o.clients, "client threads (keep-alive connections)")->capture_default_str()->check(CLI::Range(1, 256));
  app.add_option("--threads", o.threads, "coordinator threads")->capture_default_str()->check(CLI::Range(1, 256));
  app.add_option("--replicas", o.replicas, "wanted replicas (the first nodes hold 4 slices each)")->capture_default_str();
  app.add_option("--store", o.store, "sqlite, or postgres (a server started in a temp dir)")
      ->capture_default_str()->check(CLI::IsMember({"sqlite", "postgres"}));
  CLI11_PARSE(app, argc, argv);
  const auto dir = std::filesystem::temp_directory_path() / ("essaim-coord-load-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const coord::Catalogue cat = catalogue();
  std::optional<PgCluster> pg;  // outlives the coordinator, whose connection it serves
  WriteProbe probe;
  auto store = open_bench_store(o, dir, pg, probe);
  if (!store) return std::fprintf(stderr, "%s\n", store.status().message().c_str()), 1;
  coord::Store* db = store->get();  // owned by the coordinator below, which outlives every use
  const std::vector<Node> nodes = make_nodes(*db, cat, o.nodes, o.replicas);
  coord::Coordinator c(cat, std::move(*store),
                       {.admin_token = kAdmin, .slices_dir = dir.string(), .replicas = o.replicas,
                        .heartbeat_s = o.heartbeat_s, .threads = o.threads});
  // The listener without the credentials check from the head (Coordinator::listen adds it): every request
  // is authenticated once, by its handler, as the figures in docs/scale.md were measured.
  auto server = net::HttpServer::listen("127.0.0.1", 0, c.http_limits(),
                                        [&c](const net::HttpRequestView& r, std::shared_ptr<net::HttpResponder> out) {
                                          c.handle(r, std::move(out));
                                        });
  if (!server) return std::fprintf(stderr, "%s\n", server.status().message().c_str()), 1;
  const WriteDelta before{db->writes(), probe.disk_bytes(), probe.write_call_bytes(), probe.wal_bytes()};
  const LoadResult r = drive((*server)->port(), nodes, o);
  const WriteDelta after{db->writes(), probe.disk_bytes(), probe.write_call_bytes(), probe.wal_bytes()};
  const std::string metrics = get_metrics((*server)->port());
  (*server)->stop();
  c.stop();
  const WriteDelta delta{{after.store.transactions - before.store.transactions, after.store.rows - before.store.rows},
                        after.disk_bytes - before.disk_bytes, after.write_call_bytes - before.write_call_bytes,
                        after.wal_bytes - before.wal_bytes};
  std::puts(report(o, r, delta, metrics).dump().c_str());
  std::filesystem::remove_all(dir);
  return 0;
}
