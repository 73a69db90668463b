// The coordinator's HTTP API (docs/market.md): identity, catalogue, heartbeats, demand, volunteering,
// slice downloads, the backbone's expert map, work and rewards, the dashboard. One instance per process;
// all shared state lives in the Store, so several processes may serve one PostgreSQL database.
//
//   Coordinator coord(std::move(catalogue), std::move(store), {.admin_token = "s3cret", .slices_dir = "slices/"});
//   auto server = coord.listen("127.0.0.1", 0);      // net::HttpServer with handle() and authorize()
//   ... server.value()->stop(); coord.stop();   // in this order
//
// Requests are answered on a small pool of threads (store calls block on the disk or the database), never
// on the listener's I/O threads; so are the credentials checks the listener asks for from a request's head.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "coord/placement.h"
#include "coord/store.h"
#include "net/http_limits.h"
#include "net/http_server.h"

namespace essaim::coord {

struct CoordinatorConfig {
  std::string admin_token;
  std::string slices_dir;
  int64_t replicas = 2;
  int64_t heartbeat_s = 10;
  int64_t usage_half_life_s = 86400;  // router usage counts halve this often (0: they never decay)
  int threads = 4;
  std::function<int64_t()> now_ms;  // wall clock (ms since the epoch) when empty; tests move time
};

inline constexpr size_t kDownloadChunkBytes = 1 << 20;
inline constexpr int kDownloadChunksInFlight = 4;  // per download: at most this many chunks in memory

class Coordinator {
 public:
  Coordinator(Catalogue catalogue, std::unique_ptr<Store> store, CoordinatorConfig config);
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // An HTTP listener on host:port serving this coordinator (port 0: the OS chooses).
  // With `tls`: https:// (the relay's TLS listener setup, net/tls.h).
  Result<std::unique_ptr<net::HttpServer>> listen(const std::string& host, uint16_t port, net::HttpLimits limits,
                                                  std::optional<net::ServerTls> tls = {});
  Result<std::unique_ptr<net::HttpServer>> listen(const std::string& host, uint16_t port) {
    return listen(host, port, http_limits());
  }
  void handle(const net::HttpRequestView& req, std::shared_ptr<net::HttpResponder> out);
  // The listener's credentials check, from a request's head (on the pool: a token is looked up in the
  // store): the public pages are PUBLIC, a valid admin or node token VALID, anything else REFUSED (401),
  // so a connection only ever refused, or only reading public pages, stays evictable.
  void authorize(const net::HttpRequestHead& head, std::function<void(net::HttpCredentials)> done);
  // Waits for the requests in hand. Call after the listener's stop() and before the listener is destroyed:
  // a request still in hand holds its connection, which must not outlive the listener.
  void stop();
  // Every endpoint but the slice downloads, answered synchronously (the tests and the fuzzer call it).
  net::HttpReply answer(const net::HttpRequestView& req);
  net::HttpLimits http_limits() const;  // 1 MiB bodies; no listener-level key (tokens are per node)
  const Catalogue& catalogue() const { return cat_; }

  struct Impl;

 private:
  Catalogue cat_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace essaim::coord
