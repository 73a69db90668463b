// The backbone's dispatcher: an ExpertExecutor that sends each (row, expert) pair of a MoE layer to the
// worker holding that expert, computes the rest from the backbone's resident replica meanwhile, and falls
// back to the replica for every answer that does not come (docs/invariants.md invariants 1 and 5; docs/dispatch.md).
// A shape-only replica (a backbone loaded from a backbone file) has no bytes to fall back on: a failed
// answer is asked of another live replica, and when none answers by the deadline the call fails with an
// error naming the layer and experts — never a wrong output, never a wait past the deadline.
//
//   ESSAIM_ASSIGN_OR_RETURN(ExpertMap map, expert_map_from_addresses({"127.0.0.1:9001", "127.0.0.1:9002"}));
//   ESSAIM_ASSIGN_OR_RETURN(std::unique_ptr<RemoteExpertExecutor> ex,
//                           remote_executor_for_model(*model, map, &pool, {.timeout = 2000ms}));
//   model->forward({.tokens = ids, .cache = &cache, .experts = ex.get(), ...});   // same logits, bit for bit
//   std::fputs(ex->stats().to_text().c_str(), stderr);
//
// One layer call, compute(batch, out):
//   0. with a hot-expert cache (DispatchOptions::hot_cache), its picks are counted and the pairs whose
//      expert its current snapshot holds are set aside, to be computed here in step 3 and never sent
//   1. owner of each pair = a live worker that may serve the expert — the first in map order, or under
//      ReplicaPolicy::NEAREST the cheapest by measured round trip and this call's load; none: local
//   2. per owner, one EXPERT_REQUEST (split only to fit frame limits): the rows with at least one of its
//      experts, those experts per row, the activation rows as the model quantised them — all sent first
//   3. the local share computed from the replica (LocalExpertExecutor) while the workers compute
//   4. answers collected until the call's deadline (start + timeout); each accepted answer fills its own
//      slots of `out`; a timeout, disconnect, protocol error, ERROR or wrong-shaped answer marks that
//      worker's session failed (it reconnects in the background, with backoff) and its pairs are computed
//      from the replica — by the same kernels on the same bytes, hence the same bits. With hedging, a request
//      late relative to its worker's own history gets a duplicate on a second live replica holding all its
//      pairs, and the first good answer of the two is used (the same bits either way)
// `out` is then exactly what LocalExpertExecutor would have written; the weighted combine in slot order
// stays in the model. A call never waits for a connection, and never past the deadline for an answer:
// its wall time is at most the timeout plus the local compute.
//
// Calls are serialised (one layer at a time); stats() may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backbone/audit_policy.h"
#include "backbone/dispatch_stats.h"
#include "backbone/expert_map.h"
#include "backbone/replica_choice.h"
#include "backbone/worker_link.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "slice/model_identity.h"
#include "moe/executor.h"

namespace essaim {
class Model;
}

namespace essaim::backbone {

class HotExpertCache;

inline constexpr std::chrono::milliseconds kDefaultWorkerTimeout{2000};

struct DispatchOptions {
  std::chrono::milliseconds timeout = kDefaultWorkerTimeout;  // per layer call: send + answer
  LinkOptions link;                      // connect timeout, reconnect backoff, frame limit, log
  size_t max_requests_per_worker = 8;    // per layer call; pairs beyond are computed locally (OVERLOADED)
  uint32_t audit_every = 0;              // recompute every Nth answer from the replica and compare (0 = off)
  bool adaptive_audit = false;           // per-worker adaptive audits instead (backbone/audit_policy.h)
  std::string label = "essaim backbone";  // sent in the HELLO, for the workers' logs
  // The lean wire (docs/dispatch.md): BF16 asks every worker for bf16 rows (2 bytes a value) and rounds the
  // replica's own share and fallbacks the same way, so the result equals a monolithic run whose
  // LocalExpertExecutor has the same mode, bit for bit. F32 (the default) changes nothing.
  ExpertOutput expert_output = ExpertOutput::F32;
  // Which live replica serves a pair, and hedging of late requests (backbone/replica_choice.h). The default
  // is map order without hedging (what M1 pinned); `essaim run/eval/serve` choose the nearest and hedge.
  ReplicaChoiceOptions replicas;
  // Workers behind a relay (addresses ws[s]://HOST:PORT/node/NODE_ID, docs/relay.md): this node's token,
  // presented to the relay, and an extra CA file to trust for wss:// (besides the system store).
  std::string relay_token;
  std::string relay_ca_file;
  // The hot-expert cache (backbone/hot_expert_cache.h): every call's picks are counted into it, and the
  // pairs whose expert its current snapshot holds are computed here from those verified copies instead of
  // being sent. Not owned; must outlive the executor. Null: no cache.
  HotExpertCache* hot_cache = nullptr;
};

// A worker reached through any transport (the TCP ones come from an ExpertMap).
struct DispatchEndpoint {
  std::string name;
  Connector connect;
  std::optional<std::vector<proto::Holding>> declared;  // the map's restriction, if any
};

class RemoteExpertExecutor final : public ExpertExecutor {
 public:
  // Starts one link per endpoint (each connects in the background at once). `replica` and `pool` must
  // outlive the executor.
  static std::unique_ptr<RemoteExpertExecutor> create(const ExpertStore& replica, const ModelIdentity& model,
                                                      std::vector<DispatchEndpoint> endpoints, ThreadPool* pool,
                                                      DispatchOptions options = {});
  // TCP endpoints from a map; refuses malformed addresses.
  static Result<std::unique_ptr<RemoteExpertExecutor>> create(const ExpertStore& replica, const ModelIdentity& model,
                                                              const ExpertMap& map, ThreadPool* pool,
                                                              DispatchOptions options = {});
  ~RemoteExpertExecutor() override;

  Status compute(const ExpertBatch& batch, std::span<float> out) override;
  // With a copy of the experts here every lost, late or wrong answer is computed locally, so a batch the
  // model sends cannot fail; without one (a backbone file) it fails when no replica answers.
  bool may_fail() const override { return !local_copy_; }

  // Waits until every worker's first connect attempt has finished; returns how many are up.
  size_t wait_connected(net::Deadline deadline);
  size_t connected() const;
  DispatchStats stats() const;
  // What each worker (map order) may serve now: its live session's routable holdings, empty while down
  // (`essaim run` reports the layers no connected worker covers).
  std::vector<std::vector<proto::Holding>> live_holdings() const;

 private:
  struct Outgoing;
  struct Answer;
  struct RaceSide;
  struct Call;
  // The phases of one compute() call (docs at the top of this file, steps 1 to 4), then its stats.
  Status assign_owners(Call& c);
  void send_requests(Call& c);
  Status compute_own_share(Call& c);
  Status collect_answers(Call& c);
  Status check_audits(Call& c);
  void record_call(const Call& c);
  RemoteExpertExecutor(const ExpertStore& replica, ThreadPool* pool, DispatchOptions options);
  // The answer to one sent request by the deadline, sending a hedged duplicate when it is late and a second
  // replica may serve all its pairs. Called under call_mu_.
  Answer await_answer(const ExpertBatch& b, const Outgoing& o, net::Deadline deadline,
                      const std::vector<std::shared_ptr<LinkSession>>& sessions, std::vector<uint64_t>& load);
  // await_answer's hedge: the duplicate sent to a second replica (none when no replica can take it).
  std::optional<RaceSide> send_hedge(const ExpertBatch& b, const Outgoing& o, net::Deadline deadline,
                                     const std::vector<std::shared_ptr<LinkSession>>& sessions,
                                     std::vector<uint64_t>& load);
  // await_answer's race between the original and the duplicate: the first good answer.
  Answer race(const Answer& r, RaceSide original, RaceSide hedge, net::Deadline deadline, bool forced_hedge,
              uint64_t E, const Outgoing& o);
  // Computes the pairs selected by `mask` (indices into batch.ids) from the replica into out. Without a
  // local copy (a shape-only replica) it asks other live replicas instead (ask_other_replicas).
  Status compute_local(const ExpertBatch& batch, const std::vector<uint32_t>& pairs, std::span<float> out,
                       net::Deadline deadline);
  // No local copy: the pairs go to live replicas (the cheapest per pair), answers awaited until the
  // deadline; a pair no live worker holds, or whose answer does not come, fails the call with a message
  // naming the layer and experts. Called under call_mu_.
  Status ask_other_replicas(const ExpertBatch& batch, const std::vector<uint32_t>& pairs, std::span<float> out,
                            net::Deadline deadline);
  Status send_retries(const ExpertBatch& b, const std::vector<int32_t>& owner, const std::vector<uint64_t>& load,
                      const std::vector<std::shared_ptr<LinkSession>>& sessions, net::Deadline deadline,
                      std::vector<Outgoing>& sent);
  Status await_retries(const ExpertBatch& b, const std::vector<Outgoing>& sent, std::span<float> out,
                       net::Deadline deadline);
  // The call fails: `lost` pairs could not be served without a local copy (counted, and named with `why`).
  Status retry_failed(const ExpertBatch& b, const std::vector<uint32_t>& lost, const std::string& why);

  const ExpertStore& replica_;
  const bool local_copy_;  // false for a shape-only replica (a backbone file): no fallback, no audits
  ThreadPool* pool_;
  const DispatchOptions options_;
  LocalExpertExecutor local_;
  std::vector<std::unique_ptr<WorkerLink>> links_;  // map order
  std::mutex call_mu_;                              // one layer call at a time
  ReplicaChooser chooser_;                          // guarded by call_mu_ (its averages: stats_mu_ copy below)
  AuditPolicy audit_;                               // which answers to audit, who is dropped; guarded by call_mu_
  mutable std::mutex stats_mu_;
  DispatchStats stats_;                             // guarded by stats_mu_ (workers[] hold the dispatcher's counts)
};

// The dispatcher for a loaded model: its experts are the replica, its source identity is what workers must
// hold. Waits up to the link's connect timeout for the first connections, so the first tokens already use
// the swarm; a worker that is not up by then joins when it is.
Result<std::unique_ptr<RemoteExpertExecutor>> remote_executor_for_model(const Model& model, const ExpertMap& map,
                                                                        ThreadPool* pool, DispatchOptions options = {});

}  // namespace essaim::backbone
