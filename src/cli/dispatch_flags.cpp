#include "cli/dispatch_flags.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <sstream>

#include "backbone/hot_expert_cache.h"
#include "backbone/slice_server_source.h"
#include "gguf/backbone_experts.h"
#include "gguf/expert_digest.h"
#include "gguf/gguf_slice.h"
#include "node/market_client.h"
#include "node/slice_download.h"

namespace essaim::cli {
namespace {

// "0-3, 7, 9-10" for sorted indices.
std::string index_ranges_text(const std::vector<int32_t>& layers) {
  std::string t;
  for (size_t i = 0; i < layers.size();) {
    size_t j = i;
    while (j + 1 < layers.size() && layers[j + 1] == layers[j] + 1) ++j;
    if (!t.empty()) t += ", ";
    t += std::to_string(layers[i]) + (j > i ? "-" + std::to_string(layers[j]) : "");
    i = j + 1;
  }
  return t;
}

}  // namespace

void add_dispatch_flags(CLI::App& cmd, DispatchFlags& f) {
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

CoverageReport swarm_coverage(const Model& model, const backbone::RemoteExpertExecutor& remote) {
  CoverageReport r;
  // A backbone file holds no expert bytes: what no worker serves cannot be computed here.
  const bool copy = !model.expert_store().shape_only();
  const std::string until = copy ? "; its experts are computed on the backbone until it does"
                                 : "; requests needing experts only it holds fail until it does (no local copy)";
  const backbone::DispatchStats s = remote.stats();
  for (const backbone::WorkerReport& w : s.workers) {
    if (w.connected) continue;
    r.complete = false;
    r.lines.push_back("worker " + w.address + " did not connect (" +
                      (w.last_error.empty() ? std::string("no answer yet") : w.last_error) + ")" + until);
  }
  const std::vector<std::vector<proto::Holding>> live = remote.live_holdings();
  const ExpertStore& store = model.expert_store();
  // Per MoE layer, the replica's experts no connected worker may serve; consecutive layers missing the same
  // experts share one line.
  std::vector<std::pair<std::vector<int32_t>, std::string>> groups;  // (layers, what is missing)
  for (int32_t layer = 0; layer < store.n_layers(); ++layer) {
    std::vector<int32_t> in_replica;
    for (const ExpertLayer& range : store.ranges(layer))
      for (int32_t e = range.expert_begin; e < range.expert_begin + range.n_experts; ++e) in_replica.push_back(e);
    if (in_replica.empty()) continue;  // a dense layer: nothing to dispatch
    std::sort(in_replica.begin(), in_replica.end());
    std::vector<int32_t> missing;
    for (int32_t e : in_replica) {
      bool served = false;
      for (const std::vector<proto::Holding>& holdings : live)
        for (const proto::Holding& h : holdings)
          served = served || (int64_t(h.layer) == layer && uint32_t(e) >= h.first_expert &&
                              uint64_t(e) < uint64_t(h.first_expert) + h.expert_count);
      if (!served) missing.push_back(e);
    }
    if (missing.empty()) continue;
    const std::string what = missing.size() == in_replica.size()
                                 ? std::string("no connected worker serves any expert")
                                 : "experts " + index_ranges_text(missing) + " are on no connected worker";
    if (!groups.empty() && groups.back().second == what && groups.back().first.back() == layer - 1)
      groups.back().first.push_back(layer);
    else
      groups.push_back({{layer}, what});
  }
  for (const auto& [layers, what] : groups) {
    r.complete = false;
    r.lines.push_back("layer" + std::string(layers.size() == 1 ? " " : "s ") + index_ranges_text(layers) + ": " +
                      what + (copy ? "; computed on the backbone" : "; requests needing them fail (no local copy)"));
  }
  return r;
}

// The replica choice and hedging flags, for the fixed map and the market's alike.
void apply_replica_flags(const DispatchFlags& f, backbone::DispatchOptions& options) {
  options.replicas.policy = f.replica_choice == "first" ? backbone::ReplicaPolicy::FIRST : backbone::ReplicaPolicy::NEAREST;
  options.replicas.hedge = f.hedge_factor > 0;
  options.replicas.hedge_factor = f.hedge_factor;
}

// The hot-expert cache on the coordinator's slice server: the catalogue's slices by Range, each expert
// checked against the digest of the same expert in the backbone's own file and against its format.
Result<std::shared_ptr<backbone::HotExpertCache>> make_hot_cache(const Model& model, const node::MarketClient& client,
                                                                  const node::Catalogue& cat, const DispatchFlags& f,
                                                                  const std::string& prefix) {
  ESSAIM_ASSIGN_OR_RETURN(ModelIdentity id, source_model_identity(model.file()));
  std::vector<backbone::SliceRef> slices;
  for (const node::SliceOffer& o : cat.slices)
    slices.push_back({.layer = o.range.layer, .expert_first = o.range.expert_first,
                      .expert_count = o.range.expert_count, .target = o.url, .bytes = o.bytes});
  const net::HttpUrl url = client.url();
  const std::string token = client.token();
  auto source = std::make_unique<backbone::SliceServerSource>(
      id, std::move(slices), [url, token](const std::string& target, uint64_t offset, uint64_t length) {
        return node::fetch_byte_range(url, token, target, offset, length);
      });
  backbone::HotCacheOptions o;
  o.budget_bytes = uint64_t(f.expert_cache_mb * 1048576.0);
  o.window_steps = f.expert_cache_window;
  if (is_backbone_file(model.file())) {
    // A backbone file records every expert's digest: the expected bytes are known without holding them.
    ESSAIM_ASSIGN_OR_RETURN(BackboneExperts recorded, read_backbone_experts(model.file()));
    auto rec = std::make_shared<const BackboneExperts>(std::move(recorded));
    o.expected_digest = [rec](int32_t layer, int32_t expert) -> Result<Sha256Digest> {
      const int64_t li = layer < 0 ? -1 : rec->layer_index(uint32_t(layer));
      if (li < 0 || expert < 0 || uint32_t(expert) >= rec->expert_count)
        return Status::error("layer " + std::to_string(layer) + " expert " + std::to_string(expert) +
                             " is not in the backbone file's records");
      return holding_digest(std::span(rec->digests[size_t(li)]).subspan(size_t(expert), 1));
    };
  } else {
    struct Digests {
      MoeLayout layout;
      std::unique_ptr<ExpertDigestCache> cache;
    };
    auto digests = std::make_shared<Digests>();
    ESSAIM_ASSIGN_OR_RETURN(digests->layout, moe_layout(model.file()));
    ESSAIM_ASSIGN_OR_RETURN(digests->cache, ExpertDigestCache::open(model.file(), digests->layout));
    o.expected_digest = [digests](int32_t layer, int32_t expert) {
      return digests->cache->holding(uint32_t(layer), uint32_t(expert), 1);
    };
  }
  o.reference = &model.expert_store();
  if (f.verbose) o.log = [prefix](const std::string& line) { std::fprintf(stderr, "%s%s\n", prefix.c_str(), line.c_str()); };
  auto cache = std::make_shared<backbone::HotExpertCache>(std::move(source), std::move(o));
  cache->start();
  return cache;
}

Result<ExecutorChoice> make_market_executor(const Model& model, ThreadPool* pool, const DispatchFlags& f,
                                            const char* who, ExpertOutput output) {
  if (f.token.empty()) return Status::error("--coordinator needs --token");
  const node::CoordinatorAccess access{.ca_file = f.ca_file, .insecure_http = f.insecure_http};
  ESSAIM_ASSIGN_OR_RETURN(node::MarketClient client, node::MarketClient::connect(f.coordinator, f.token, access));
  ESSAIM_ASSIGN_OR_RETURN(node::Catalogue cat, client.model());
  auto shared = std::make_shared<node::MarketClient>(std::move(client));
  const std::string prefix = std::string(who) + ": ";
  backbone::MarketHooks hooks;
  hooks.fetch_map = [shared] { return shared->expert_map(); };
  hooks.report_usage = [shared](const std::vector<backbone::UsageReport>& u) {
    std::vector<node::LayerUsage> layers;
    for (const backbone::UsageReport& r : u) layers.push_back({r.layer, r.counts});
    return shared->report_usage(layers);
  };
  hooks.report_work = [shared](const std::vector<backbone::WorkDelta>& w) {
    std::vector<node::WorkReport> reports;
    for (const backbone::WorkDelta& d : w) reports.push_back({d.address, d.pairs_accepted, d.audits, d.audits_failed});
    return shared->report_work(reports);
  };
  hooks.log = [prefix](const std::string& line) { std::fprintf(stderr, "%s%s\n", prefix.c_str(), line.c_str()); };
  backbone::MarketDispatchOptions options;
  options.n_experts = cat.n_experts;
  options.refresh = std::chrono::milliseconds(f.map_refresh_ms);
  options.dispatch.timeout = std::chrono::milliseconds(f.timeout_ms);
  options.dispatch.audit_every = f.audit_every;
  options.dispatch.adaptive_audit = f.audit_every == 0 && !f.no_audit;
  options.dispatch.expert_output = output;
  options.dispatch.relay_token = f.token;  // workers the market lists at ws[s]:// relay addresses
  options.dispatch.relay_ca_file = f.ca_file;
  apply_replica_flags(f, options.dispatch);
  if (f.expert_cache_mb > 0) {
    ESSAIM_ASSIGN_OR_RETURN(options.hot_cache, make_hot_cache(model, *shared, cat, f, prefix));
  }
  if (f.verbose) {
    options.dispatch.link.log = [prefix](const std::string& line) {
      std::fprintf(stderr, "%s%s\n", prefix.c_str(), line.c_str());
    };
  }
  ESSAIM_ASSIGN_OR_RETURN(std::unique_ptr<backbone::MarketExpertExecutor> ex,
                          backbone::MarketExpertExecutor::create(model, pool, std::move(hooks), std::move(options)));
  ExecutorChoice choice;
  choice.market = ex.get();
  choice.executor = std::move(ex);
  return choice;
}

Result<ExecutorChoice> make_expert_executor(const Model& model, ThreadPool* pool, const DispatchFlags& f,
                                            const char* who) {
  ExecutorChoice choice;
  const std::optional<ExpertOutput> output = expert_output_from_name(f.expert_output);
  if (!output) return Status::error("--expert-output must be f32 or bf16, not '" + f.expert_output + "'");
  if (!f.coordinator.empty()) return make_market_executor(model, pool, f, who, *output);
  if (f.expert_cache_mb > 0) return Status::error("--expert-cache-mb needs --coordinator (its slice server)");
  if (f.workers.empty() && f.expert_map.empty()) {
    if (f.require_workers) return Status::error("--require-workers needs --worker or --expert-map");
    choice.executor = std::make_unique<LocalExpertExecutor>(model.expert_store(), pool, *output);
    return choice;
  }
  backbone::ExpertMap map;
  if (!f.expert_map.empty()) {
    ESSAIM_ASSIGN_OR_RETURN(map, backbone::expert_map_load(f.expert_map));
  }
  ESSAIM_ASSIGN_OR_RETURN(backbone::ExpertMap flagged, backbone::expert_map_from_addresses(f.workers));
  for (backbone::WorkerEndpoint& w : flagged.workers) map.workers.push_back(std::move(w));
  for (const backbone::WorkerEndpoint& w : map.workers) choice.map_labels.push_back(w.label);

  backbone::DispatchOptions options;
  options.timeout = std::chrono::milliseconds(f.timeout_ms);
  options.audit_every = f.audit_every;
  options.expert_output = *output;
  apply_replica_flags(f, options);
  options.relay_token = f.token;
  options.relay_ca_file = f.ca_file;
  if (f.verbose) {
    const std::string prefix = std::string(who) + ": ";
    options.link.log = [prefix](const std::string& line) { std::fprintf(stderr, "%s%s\n", prefix.c_str(), line.c_str()); };
  }
  ESSAIM_ASSIGN_OR_RETURN(std::unique_ptr<backbone::RemoteExpertExecutor> remote,
                          backbone::remote_executor_for_model(model, map, pool, std::move(options)));
  const backbone::DispatchStats s = remote->stats();
  std::fprintf(stderr, "%s: %zu of %zu worker%s connected, deadline %lld ms\n", who, remote->connected(),
               s.workers.size(), s.workers.size() == 1 ? "" : "s", (long long)f.timeout_ms);
  const CoverageReport coverage = swarm_coverage(model, *remote);
  for (const std::string& line : coverage.lines) std::fprintf(stderr, "%s: %s\n", who, line.c_str());
  if (f.require_workers && !coverage.complete)
    return Status::error("--require-workers: the swarm does not cover the model (see above)");
  choice.remote = remote.get();
  choice.executor = std::move(remote);
  return choice;
}

backbone::DispatchStats labelled_stats(const ExecutorChoice& choice) {
  if (choice.market != nullptr) return choice.market->stats();
  backbone::DispatchStats s = choice.remote->stats();
  for (size_t i = 0; i < s.workers.size() && i < choice.map_labels.size(); ++i)
    if (!choice.map_labels[i].empty()) s.workers[i].label = choice.map_labels[i];  // the operator's name wins
  return s;
}

void print_dispatch_stats(const ExecutorChoice& choice, const char* who) {
  if (!choice.dispatching()) return;
  std::istringstream lines(labelled_stats(choice).to_text());
  for (std::string line; std::getline(lines, line);) std::fprintf(stderr, "%s: %s\n", who, line.c_str());
}

}  // namespace essaim::cli
