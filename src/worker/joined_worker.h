// A worker that joins the coverage market by itself (docs/market.md, "The worker's side"; the CLI is
// `essaim worker --coordinator URL --token T --budget-mb N --data-dir DIR --listen HOST:PORT`, or
// `... --relay wss://R` behind NAT):
//   1. asks who it is (GET /api/whoami) and what the model is (GET /api/model);
//   2. re-verifies every catalogue slice already in DIR (file SHA-256 against the catalogue, then the
//      slice's own per-expert digests); a bad one is deleted;
//   3. volunteers its free budget, downloads what it is assigned (resumable, verified: node/slice_download.h),
//      drops what it is told to drop, and serves the result;
//   4. heartbeats every heartbeat_s (holdings with their SHA-256, address, fingerprint, capacity, load; from
//      another thread while a volunteer round downloads, so a long download never makes the node stale) and
//      volunteers again when its budget has room, after a drop, or when the heartbeat's answer says so;
//   5. swaps when told (a needed range for one with enough other holders): downloads and verifies the new
//      slice, serves both and heartbeats them, and only then stops serving the old one;
//   6. on SIGINT/SIGTERM, a last heartbeat says it is leaving (its ranges go scarce at once), then it stops.
// The served set changes without dropping a connection: each connection is served by the set that was
// current when it arrived (kept alive until it closes); new connections see the new set, and backbones open
// new connections when their expert map changes.
//
//   JoinConfig c{.coordinator = "http://127.0.0.1:8080", .token = t, .budget_bytes = 256 << 20, .data_dir = "d"};
//   return run_joined_worker(c, stop_signals);       // returns after SIGINT/SIGTERM
#pragma once

#include <signal.h>

#include <cstdint>
#include <string>

#include "node/market_client.h"
#include "worker/worker.h"

namespace essaim::worker {

struct JoinConfig {
  std::string coordinator;
  node::CoordinatorAccess access;  // --ca-file, --insecure-http
  std::string token;
  uint64_t budget_bytes = 0;
  std::string data_dir;
  std::string listen = "127.0.0.1:0";
  std::string advertise;          // host:port backbones should dial; default: the listen host and bound port
  // Behind NAT: no port opened here. Registered at this relay (ws[s]://HOST:PORT) with `token`, re-registered
  // with backoff when it is lost (and marked away at the coordinator meanwhile); the address heartbeaten is
  // the relay path, ws[s]://HOST:PORT/node/NODE_ID, which backbones dial with their own token.
  std::string relay;
  std::string relay_ca_file;      // trusted for a wss:// relay besides the system store
  size_t relay_idle = 2;          // idle connections kept registered at the relay
  WorkerOptions worker;     // everything but the served set
  bool quiet = false;
};

// Exit codes as `essaim worker`: 0 after a stop signal, 1 when the market, the port or the relay cannot be
// used (a token the relay refuses included).
int run_joined_worker(const JoinConfig& config, sigset_t stop_signals);

}  // namespace essaim::worker
