#include "backbone/swarm_setup.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <sstream>

#include "backbone/hot_expert_cache.h"
#include "backbone/slice_server_source.h"
#include "node/market_client.h"
#include "node/slice_download.h"
#include "slice/backbone_experts.h"
#include "slice/expert_digest.h"
#include "slice/gguf_slice.h"

namespace essaim::backbone {
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


// The replica choice and hedging, for the fixed map and the market's alike.
void apply_replica_choice(const SwarmSetup& f, DispatchOptions& options) {
  options.replicas.policy = f.replica_choice == "first" ? ReplicaPolicy::FIRST : ReplicaPolicy::NEAREST;
  options.replicas.hedge = f.hedge_factor > 0;
  options.replicas.hedge_factor = f.hedge_factor;
}

// The hot-expert cache on the coordinator's slice server: the catalogue's slices by Range, each expert
// checked against the digest of the same expert in the backbone's own file and against its format.
Result<std::shared_ptr<HotExpertCache>> make_hot_cache(const Model& model, const node::MarketClient& client,
                                                                  const node::Catalogue& cat, const SwarmSetup& f,
                                                                  const std::string& prefix) {
  ESSAIM_ASSIGN_OR_RETURN(ModelIdentity id, source_model_identity(model.file()));
  std::vector<SliceRef> slices;
  for (const node::SliceOffer& o : cat.slices)
    slices.push_back({.layer = o.range.layer, .expert_first = o.range.expert_first,
                      .expert_count = o.range.expert_count, .target = o.url, .bytes = o.bytes});
  const net::HttpUrl url = client.url();
  const std::string token = client.token();
  auto source = std::make_unique<SliceServerSource>(
      id, std::move(slices), [url, token](const std::string& target, uint64_t offset, uint64_t length) {
        return node::fetch_byte_range(url, token, target, offset, length);
      });
  HotCacheOptions o;
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
  auto cache = std::make_shared<HotExpertCache>(std::move(source), std::move(o));
  cache->start();
  return cache;
}

Result<ExecutorChoice> make_market_executor(const Model& model, ThreadPool* pool, const SwarmSetup& f,
                                            const char* who, ExpertOutput output) {
  if (f.token.empty()) return Status::error("--coordinator needs --token");
  const node::CoordinatorAccess access{.ca_file = f.ca_file, .insecure_http = f.insecure_http};
  ESSAIM_ASSIGN_OR_RETURN(node::MarketClient client, node::MarketClient::connect(f.coordinator, f.token, access));
  ESSAIM_ASSIGN_OR_RETURN(node::Catalogue cat, client.model());
  auto shared = std::make_shared<node::MarketClient>(std::move(client));
  const std::string prefix = std::string(who) + ": ";
  MarketHooks hooks;
  hooks.fetch_map = [shared] { return shared->expert_map(); };
  hooks.report_usage = [shared](const std::vector<UsageReport>& u) {
    std::vector<node::LayerUsage> layers;
    for (const UsageReport& r : u) layers.push_back({r.layer, r.counts});
    return shared->report_usage(layers);
  };
  hooks.report_work = [shared](const std::vector<WorkDelta>& w) {
    std::vector<node::WorkReport> reports;
    for (const WorkDelta& d : w) reports.push_back({d.address, d.pairs_accepted, d.audits, d.audits_failed});
    return shared->report_work(reports);
  };
  hooks.log = [prefix](const std::string& line) { std::fprintf(stderr, "%s%s\n", prefix.c_str(), line.c_str()); };
  MarketDispatchOptions options;
  options.n_experts = cat.n_experts;
  options.refresh = std::chrono::milliseconds(f.map_refresh_ms);
  options.dispatch.timeout = std::chrono::milliseconds(f.timeout_ms);
  options.dispatch.audit_every = f.audit_every;
  options.dispatch.adaptive_audit = f.audit_every == 0 && !f.no_audit;
  options.dispatch.expert_output = output;
  options.dispatch.relay_token = f.token;  // workers the market lists at ws[s]:// relay addresses
  options.dispatch.relay_ca_file = f.ca_file;
  apply_replica_choice(f, options.dispatch);
  if (f.expert_cache_mb > 0) {
    ESSAIM_ASSIGN_OR_RETURN(options.hot_cache, make_hot_cache(model, *shared, cat, f, prefix));
  }
  if (f.verbose) {
    options.dispatch.link.log = [prefix](const std::string& line) {
      std::fprintf(stderr, "%s%s\n", prefix.c_str(), line.c_str());
    };
  }
  ESSAIM_ASSIGN_OR_RETURN(std::unique_ptr<MarketExpertExecutor> ex,
                          MarketExpertExecutor::create(model, pool, std::move(hooks), std::move(options)));
  ExecutorChoice choice;
  choice.market = ex.get();
  choice.executor = std::move(ex);
  return choice;
}

}  // namespace

CoverageReport swarm_coverage(const Model& model, const RemoteExpertExecutor& remote) {
  CoverageReport r;
  // A backbone file holds no expert bytes: what no worker serves cannot be computed here.
  const bool copy = !model.expert_store().shape_only();
  const std::string until = copy ? "; its experts are computed on the backbone until it does"
                                 : "; requests needing experts only it holds fail until it does (no local copy)";
  const DispatchStats s = remote.stats();
  for (const WorkerReport& w : s.workers) {
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

Result<ExecutorChoice> make_expert_executor(const Model& model, ThreadPool* pool, const SwarmSetup& f,
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
  ExpertMap map;
  if (!f.expert_map.empty()) {
    ESSAIM_ASSIGN_OR_RETURN(map, expert_map_load(f.expert_map));
  }
  ESSAIM_ASSIGN_OR_RETURN(ExpertMap flagged, expert_map_from_addresses(f.workers));
  for (WorkerEndpoint& w : flagged.workers) map.workers.push_back(std::move(w));
  for (const WorkerEndpoint& w : map.workers) choice.map_labels.push_back(w.label);

  DispatchOptions options;
  options.timeout = std::chrono::milliseconds(f.timeout_ms);
  options.audit_every = f.audit_every;
  options.expert_output = *output;
  apply_replica_choice(f, options);
  options.relay_token = f.token;
  options.relay_ca_file = f.ca_file;
  if (f.verbose) {
    const std::string prefix = std::string(who) + ": ";
    options.link.log = [prefix](const std::string& line) { std::fprintf(stderr, "%s%s\n", prefix.c_str(), line.c_str()); };
  }
  ESSAIM_ASSIGN_OR_RETURN(std::unique_ptr<RemoteExpertExecutor> remote,
                          remote_executor_for_model(model, map, pool, std::move(options)));
  const DispatchStats s = remote->stats();
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

DispatchStats labelled_stats(const ExecutorChoice& choice) {
  if (choice.market != nullptr) return choice.market->stats();
  DispatchStats s = choice.remote->stats();
  for (size_t i = 0; i < s.workers.size() && i < choice.map_labels.size(); ++i)
    if (!choice.map_labels[i].empty()) s.workers[i].label = choice.map_labels[i];  // the operator's name wins
  return s;
}

void print_dispatch_stats(const ExecutorChoice& choice, const char* who) {
  if (!choice.dispatching()) return;
  std::istringstream lines(labelled_stats(choice).to_text());
  for (std::string line; std::getline(lines, line);) std::fprintf(stderr, "%s: %s\n", who, line.c_str());
}

}  // namespace essaim::backbone
