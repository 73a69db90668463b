#include "cli/dispatch_flags.h"

#include <cstdint>

namespace essaim::cli {

void add_dispatch_flags(CLI::App& cmd, backbone::SwarmSetup& f) {
  cmd.add_option("--worker", f.workers, "Expert worker HOST:PORT, or ws[s]://RELAY:PORT/node/NODE_ID behind a relay, to "
                                        "dispatch to (repeatable; holdings learned at the handshake; earlier workers are "
                                        "preferred for shared experts)");
  cmd.add_option("--token", f.token,
                 "This node's token: presented to relays (workers at ws[s]:// addresses) and to the --coordinator");
  cmd.add_option("--ca-file", f.ca_file,
                 "Extra PEM CA certificate to trust for wss:// relays and an https:// --coordinator (besides the system store)")
      ->check(CLI::ExistingFile);
  cmd.add_option("--expert-map", f.expert_map, "JSON expert map: workers and, optionally, what to route to each")
      ->check(CLI::ExistingFile);
  cmd.add_option("--worker-timeout-ms", f.timeout_ms,
                 "Deadline of every remote layer call; a missing answer is computed locally (default 2000)")
      ->check(CLI::Range(int64_t(1), int64_t(3'600'000)));
  cmd.add_option("--worker-audit", f.audit_every,
                 "Recompute every Nth worker answer locally and drop a worker that disagrees (0 = off)");
  cmd.add_flag("--worker-log", f.verbose, "Log worker connections and failures to stderr");
  cmd.add_option("--coordinator", f.coordinator,
                 "https://HOST[:PORT] of a coordinator (http:// on loopback): dispatch to its live expert map, report "
                 "usage and work")
      ->excludes("--worker")
      ->excludes("--expert-map");
  cmd.add_flag("--insecure-http", f.insecure_http,
               "Allow a plain http:// --coordinator that is not on loopback (its token in clear text)");
  cmd.add_option("--map-refresh-ms", f.map_refresh_ms, "With --coordinator: how often the expert map is fetched")
      ->check(CLI::Range(int64_t(50), int64_t(3'600'000)))
      ->capture_default_str();
  cmd.add_flag("--no-audit", f.no_audit, "With --coordinator: no adaptive audits of worker answers");
  cmd.add_option("--expert-cache-mb", f.expert_cache_mb,
                 "With --coordinator: keep the most-picked experts that fit in this many MiB, fetched from the "
                 "coordinator's slice server and verified, and compute them here instead of sending them (0 = off)")
      ->check(CLI::Range(0.0, 1048576.0))
      ->capture_default_str();
  cmd.add_option("--expert-cache-window", f.expert_cache_window,
                 "With --expert-cache-mb: the router picks of the last N layer calls of each layer decide what is hot")
      ->check(CLI::Range(1, 1'000'000))
      ->capture_default_str();
  cmd.add_flag("--require-workers", f.require_workers,
               "Fail (exit 1) when a listed worker does not connect or a MoE layer has experts no worker serves, "
               "instead of computing them on the backbone");
  cmd.add_option("--expert-output", f.expert_output,
                 "Precision of expert outputs before the combine: f32 (default) or bf16 (rounded wherever "
                 "computed, 2 bytes a value on the wire; sharded = monolithic bit for bit in either mode)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  cmd.add_option("--replica-choice", f.replica_choice,
                 "Which worker serves an expert several hold: nearest (measured round trip and load, spread over "
                 "equal ones) or first (map order)")
      ->check(CLI::IsMember({"nearest", "first"}))
      ->capture_default_str();
  cmd.add_option("--hedge-factor", f.hedge_factor,
                 "Send a duplicate to a second replica when a request is late by this many times its worker's "
                 "mean round trip (0 = never)")
      ->check(CLI::Range(0.0, 1000.0))
      ->capture_default_str();
}

}  // namespace essaim::cli
