#include "backbone/remote_executor.h"

#include <algorithm>
#include <cstring>

#include "backbone/hot_expert_cache.h"
#include "backbone/weights_check.h"
#include "kernels/kernel_traits.h"
#include "model/model.h"
#include "net/tcp.h"
#include "relay/relay_client.h"

namespace essaim::backbone {
namespace {

using Clock = std::chrono::steady_clock;

// The HELLO a backbone sends: what it computes with, which model, no holdings.
proto::Hello backbone_hello(const ModelIdentity& model, const std::string& label) {
  proto::Hello h;
  h.role = proto::Role::BACKBONE;
  h.fingerprint = proto::BuildFingerprint{.kernel_abi = kKernelAbiVersion, .isa_class = std::string(isa_name(kernels_isa()))};
  std::copy(model.begin(), model.end(), h.model.begin());
  h.label = label;
  return h;
}

// One worker's pairs of a batch (flat indices row * k + slot, row-major), cut into requests that fit both
// frame limits: whole rows only, so a row's activation travels once per request.
struct Chunks {
  std::vector<std::vector<uint32_t>> requests;
  std::vector<uint32_t> too_large;  // rows that fit no request at all
};
Chunks split_for_limits(const ExpertBatch& b, const std::vector<int32_t>& owner, int32_t link, uint64_t row_bytes,
                        uint64_t n_embd, ExpertOutput output, uint64_t limit_request, uint64_t limit_response) {
  auto fits = [&](uint64_t rows, uint64_t pairs) {
    return proto::expert_request_payload_bytes(rows, pairs, row_bytes) <= limit_request &&
           proto::expert_response_payload_bytes(pairs, n_embd, output) <= limit_response;
  };
  Chunks c;
  c.requests.emplace_back();
  uint64_t rows_in_last = 0;
  std::vector<uint32_t> row;
  for (int64_t r = 0; r < b.n_rows; ++r) {
    row.clear();
    for (int32_t k = 0; k < b.k; ++k)
      if (owner[size_t(r) * size_t(b.k) + size_t(k)] == link) row.push_back(uint32_t(size_t(r) * size_t(b.k) + size_t(k)));
    if (row.empty()) continue;
    if (!fits(1, row.size())) {
      c.too_large.insert(c.too_large.end(), row.begin(), row.end());
      continue;
    }
    if (!fits(rows_in_last + 1, c.requests.back().size() + row.size())) {
      c.requests.emplace_back();
      rows_in_last = 0;
    }
    c.requests.back().insert(c.requests.back().end(), row.begin(), row.end());
    ++rows_in_last;
  }
  if (c.requests.back().empty()) c.requests.pop_back();
  return c;
}

// The EXPERT_REQUEST for some pairs of a batch (CSR: per row its experts, then the rows' bytes as they are).
proto::ExpertRequest make_request(const ExpertBatch& b, const std::vector<uint32_t>& pairs, uint64_t id,
                                  uint64_t row_bytes, ExpertOutput output) {
  proto::ExpertRequest req;
  req.request_id = id;
  req.output = output;
  req.layer = uint32_t(b.layer);
  req.act_type = b.act_type;
  req.act_row_bytes = row_bytes;
  req.expert_ids.reserve(pairs.size());
  int64_t last_row = -1;
  for (uint32_t p : pairs) {
    const int64_t r = int64_t(p) / b.k;
    if (r != last_row) {
      req.row_expert_counts.push_back(0);
      const uint8_t* row = b.act.data() + size_t(r) * row_bytes;
      req.activations.insert(req.activations.end(), row, row + row_bytes);
      last_row = r;
    }
    ++req.row_expert_counts.back();
    req.expert_ids.push_back(uint32_t(b.ids[p]));
  }
  return req;
}

// Computes the pairs `pairs` (flat indices into batch.ids) of a batch with `ex` into out; other slots untouched.
Status compute_masked(LocalExpertExecutor& ex, const ExpertBatch& b, const std::vector<uint32_t>& pairs,
                      std::span<float> out) {
  if (pairs.empty()) return Status::ok();
  std::vector<int32_t> masked(b.ids.size(), -1);  // [n][k]: only the selected pairs, others untouched
  for (uint32_t p : pairs) masked[p] = b.ids[p];
  ExpertBatch mb = b;
  mb.ids = masked;
  return ex.compute_checked(mb, out);  // compute() validated b against the replica before anything was sent
}

// A well-formed answer of the wrong shape or format becomes a BAD_RESPONSE failure.
LinkAnswer checked_answer(LinkAnswer a, size_t n_pairs, uint64_t E, ExpertOutput output) {
  if (!a.response) return a;
  const proto::ExpertResponse& r = *a.response;
  if (r.n_outputs != n_pairs || r.n_embd != E || r.outputs.size() != n_pairs * E) {
    return LinkAnswer{.response = std::nullopt, .reason = FallbackReason::BAD_RESPONSE,
                      .message = "answer of " + std::to_string(r.n_outputs) + " rows of " + std::to_string(r.n_embd) +
                                 " for " + std::to_string(n_pairs) + " pairs of " + std::to_string(E)};
  }
  if (r.output != output) {
    // An f32 answer to a bf16 request would put unrounded values into the combine: not the agreed bits.
    return LinkAnswer{.response = std::nullopt, .reason = FallbackReason::BAD_RESPONSE,
                      .message = "answer in " + std::string(expert_output_name(r.output)) + ", asked for " +
                                 std::string(expert_output_name(output))};
  }
  return a;
}

// "3, 17, 40" (sorted, distinct, at most 16 then "...") for an error message.
std::string expert_list_text(std::vector<int32_t> ids) {
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  std::string t;
  for (size_t i = 0; i < ids.size() && i < 16; ++i) t += (i ? ", " : "") + std::to_string(ids[i]);
  if (ids.size() > 16) t += ", ... (" + std::to_string(ids.size()) + " in all)";
  return t;
}

}  // namespace

// One request in flight, and the pairs its answer fills: pair i of the request is flat pair pairs[i]
// (row * k + slot) of the batch.
struct RemoteExpertExecutor::Outgoing {
  size_t link = 0;
  std::shared_ptr<LinkSession> session;
  uint64_t id = 0;
  std::vector<uint32_t> pairs;
  uint64_t request_bytes = 0;
  Clock::time_point sent_at{};
  bool answered = false;  // its answer was accepted into `out` unaudited
};

// What came back for one request: the answer (or why none), who gave it, and what hedging did.
// One of the two requests racing for a late request's answer (the original and its hedged duplicate).
struct RemoteExpertExecutor::RaceSide {
  size_t link;
  uint64_t id;
  std::shared_ptr<LinkSession> session;
  Clock::time_point sent_at;
  bool open = true;
};

struct RemoteExpertExecutor::Answer {
  LinkAnswer answer;
  size_t link = 0;                      // the link that answered, or whose failure this is
  std::shared_ptr<LinkSession> session;
  Clock::time_point sent_at{};          // of the request that answered
  bool hedged = false;                  // a duplicate went to hedge_link
  size_t hedge_link = 0;
  uint64_t hedge_bytes = 0;             // its request frame
};

RemoteExpertExecutor::RemoteExpertExecutor(const ExpertStore& replica, ThreadPool* pool, DispatchOptions options)
    : replica_(replica), local_copy_(!replica.shape_only()), pool_(pool), options_(std::move(options)),
      local_(replica, pool, options_.expert_output), chooser_(0, options_.replicas),
      audit_(0, {.every = options_.audit_every, .adaptive = options_.adaptive_audit}) {}

RemoteExpertExecutor::~RemoteExpertExecutor() = default;

std::unique_ptr<RemoteExpertExecutor> RemoteExpertExecutor::create(const ExpertStore& replica,
                                                                   const ModelIdentity& model,
                                                                   std::vector<DispatchEndpoint> endpoints,
                                                                   ThreadPool* pool, DispatchOptions options) {
  std::unique_ptr<RemoteExpertExecutor> ex(new RemoteExpertExecutor(replica, pool, std::move(options)));
  const proto::Hello mine = backbone_hello(model, ex->options_.label);
  for (DispatchEndpoint& e : endpoints) {
    ex->stats_.workers.emplace_back().address = e.name;
    std::vector<proto::Holding> expected;
    if (e.declared) expected = routable_holdings(*e.declared, std::nullopt, replica);
    LinkEndpoint le{.name = e.name, .connect = std::move(e.connect), .expected = std::move(expected),
                    .routable = [declared = std::move(e.declared), &replica](const proto::Hello& peer) {
                      return routable_holdings(peer.holdings, declared, replica);
                    }};
    ex->links_.push_back(std::make_unique<WorkerLink>(std::move(le), mine, ex->options_.link));
  }
  ex->chooser_ = ReplicaChooser(ex->links_.size(), ex->options_.replicas);
  // An audit recomputes an answer from the replica: impossible without its bytes, so a shape-only replica
  // audits nothing (docs/dispatch.md, "A backbone without the experts").
  const bool audits = ex->local_copy_;
  ex->audit_ = AuditPolicy(ex->links_.size(), {.every = audits ? ex->options_.audit_every : 0,
                                               .adaptive = audits && ex->options_.adaptive_audit});
  return ex;
}

Result<std::unique_ptr<RemoteExpertExecutor>> RemoteExpertExecutor::create(const ExpertStore& replica,
                                                                           const ModelIdentity& model,
                                                                           const ExpertMap& map, ThreadPool* pool,
                                                                           DispatchOptions options) {
  std::vector<DispatchEndpoint> endpoints;
  for (const WorkerEndpoint& w : map.workers) {
    if (net::looks_like_ws_url(w.address)) {
      if (options.relay_token.empty()) return Status::error("worker '" + w.address + "' is behind a relay: give --token");
      net::NetResult<net::WsUrl> url = net::parse_ws_url(w.address);
      if (!url) return Status::error("worker '" + w.address + "': " + url.error().message);
      ESSAIM_ASSIGN_OR_RETURN(std::string node, relay::node_id_of_url(*url));
      const proto::Hello mine = backbone_hello(model, options.label);
      relay::Preamble pre{.role = relay::RelayRole::BACKBONE, .token = options.relay_token,
                          .build = {.model = mine.model, .protocol_version = mine.version,
                                    .kernel_abi = mine.fingerprint.kernel_abi},
                          .node_id = node};
      endpoints.push_back(DispatchEndpoint{.name = w.address,
                                           .connect = relay_connector(*url, std::move(pre), options.relay_ca_file),
                                           .declared = w.holdings});
      continue;
    }
    net::NetResult<std::pair<std::string, uint16_t>> hp = net::parse_host_port(w.address);
    if (!hp) return Status::error("worker '" + w.address + "': " + hp.error().message);
    endpoints.push_back(DispatchEndpoint{.name = w.address, .connect = tcp_connector(hp->first, hp->second),
                                         .declared = w.holdings});
  }
  return create(replica, model, std::move(endpoints), pool, std::move(options));
}

size_t RemoteExpertExecutor::wait_connected(net::Deadline deadline) {
  size_t up = 0;
  for (const auto& l : links_) up += l->wait_first_attempt(deadline) ? 1 : 0;
  return up;
}

size_t RemoteExpertExecutor::connected() const {
  size_t up = 0;
  for (const auto& l : links_) up += l->session() ? 1 : 0;
  return up;
}

std::vector<std::vector<proto::Holding>> RemoteExpertExecutor::live_holdings() const {
  std::vector<std::vector<proto::Holding>> out;
  for (const auto& l : links_) {
    const std::shared_ptr<LinkSession> s = l->session();
    out.push_back(s ? s->routable : std::vector<proto::Holding>{});
  }
  return out;
}

DispatchStats RemoteExpertExecutor::stats() const {
  DispatchStats s;
  {
    std::lock_guard lock(stats_mu_);
    s = stats_;
  }
  for (size_t i = 0; i < links_.size(); ++i) {
    const WorkerReport r = links_[i]->report();
    s.workers[i].label = r.label;
    s.workers[i].connected = r.connected;
    s.workers[i].sessions = r.sessions;
    s.workers[i].last_error = r.last_error;
  }
  return s;  // mean_round_trip_ms is copied into stats_ by compute()
}

Status RemoteExpertExecutor::compute_local(const ExpertBatch& b, const std::vector<uint32_t>& pairs,
                                           std::span<float> out, net::Deadline deadline) {
  if (pairs.empty()) return Status::ok();
  if (!local_copy_) return ask_other_replicas(b, pairs, out, deadline);
  return compute_masked(local_, b, pairs, out);
}

// One layer call's working state, phase to phase (compute()). Pairs are flat indices row * k + slot.
struct RemoteExpertExecutor::Call {
  const ExpertBatch& b;
  std::span<float> out;
  Clock::time_point t0;
  net::Deadline deadline;
  uint64_t E = 0, row_bytes = 0;
  std::shared_ptr<const HotSnapshot> hot;  // one snapshot of the hot cache for the whole call
  // 1. Owners.
  std::vector<std::shared_ptr<LinkSession>> sessions;  // per link; null: down or dropped
  std::vector<int32_t> owner;                          // per pair: the link asked, -1 none
  std::vector<uint32_t> local_pairs, unavailable_pairs, cached_pairs;
  std::vector<uint64_t> load;  // pairs given to each link in this call (replica choice)
  uint64_t asked = 0;
  // 2. Requests, and the pairs to compute here (with why).
  std::vector<Outgoing> sent;
  std::vector<std::pair<FallbackReason, std::vector<uint32_t>>> failed;
  size_t failed_before_wait = 0;
  std::vector<uint64_t> link_requests, link_failures;
  uint64_t bytes_sent = 0;
  // 4. Answers.
  uint64_t bytes_received = 0, responses = 0, audits = 0, hedges = 0, hedge_wins = 0;
  std::vector<uint64_t> link_served, link_audits, link_audits_failed;
  std::vector<size_t> answered_by;  // per sent request: the link whose answer was taken (original or hedge)
  std::vector<std::pair<const Outgoing*, proto::ExpertResponse>> audited;

  Call(const ExpertBatch& batch, std::span<float> o, size_t n_links, std::chrono::milliseconds timeout)
      : b(batch), out(o), t0(Clock::now()), deadline(t0 + timeout), sessions(n_links), owner(batch.ids.size(), -1),
        load(n_links, 0), link_requests(n_links, 0), link_failures(n_links, 0), link_served(n_links, 0),
        link_audits(n_links, 0), link_audits_failed(n_links, 0) {}

  void fall_back(size_t link, FallbackReason why, std::vector<uint32_t> pairs) {
    ++link_failures[link];
    failed.emplace_back(why, std::move(pairs));
  }
  // Writes a request's answer rows into their slots of `out`.
  void fill(const Outgoing& o, const std::vector<float>& rows) {
    for (size_t i = 0; i < o.pairs.size(); ++i)
      std::memcpy(out.data() + size_t(o.pairs[i]) * E, rows.data() + i * E, E * sizeof(float));
  }
};

Status RemoteExpertExecutor::compute(const ExpertBatch& b, std::span<float> out) {
  std::lock_guard call_lock(call_mu_);
  const ExpertLayer* layer = replica_.any(b.layer);
  if (layer == nullptr) return Status::error("no experts held for layer " + std::to_string(b.layer));
  ESSAIM_RETURN_IF_ERROR(validate_expert_batch(b, *layer, out.size()));
  Call c(b, out, links_.size(), options_.timeout);
  c.E = uint64_t(layer->n_embd);
  c.row_bytes = layer->activation_row_bytes();
  if (options_.hot_cache != nullptr) {  // the hot cache sees every pick
    options_.hot_cache->observe(b);
    c.hot = options_.hot_cache->snapshot();
  }
  ESSAIM_RETURN_IF_ERROR(assign_owners(c));
  send_requests(c);
  ESSAIM_RETURN_IF_ERROR(compute_own_share(c));
  ESSAIM_RETURN_IF_ERROR(collect_answers(c));
  record_call(c);
  return Status::ok();
}

// 1. Owners. A pair nobody may serve now is the backbone's own share, unless a worker that is down held it:
//    then it is a fallback (UNAVAILABLE) — the difference matters for the stats, not the result.
Status RemoteExpertExecutor::assign_owners(Call& c) {
  const ExpertBatch& b = c.b;
  const uint32_t lay = uint32_t(b.layer);
  const size_t n_links = links_.size();
  std::vector<std::vector<proto::Holding>> absent_held(n_links);
  for (size_t i = 0; i < n_links; ++i) {
    if (audit_.dropped(i)) continue;  // failed an audit: never asked again by this dispatcher
    c.sessions[i] = links_[i]->session();
    if (!c.sessions[i]) absent_held[i] = links_[i]->last_routable();
  }
  std::vector<size_t> candidates;
  std::vector<bool> was_candidate(n_links, false);
  for (size_t p = 0; p < b.ids.size(); ++p) {
    const int32_t id = b.ids[p];
    if (id < 0) continue;
    // Refused before anything is sent: every pair must be computable here, whatever happens to its worker.
    if (replica_.find(b.layer, id) == nullptr)
      return Status::error("layer " + std::to_string(b.layer) + ": expert " + std::to_string(id) + " is not held");
    ++c.asked;
    if (c.hot && c.hot->holds(b.layer, id)) {  // the same bytes, verified: computed here, never sent
      c.cached_pairs.push_back(uint32_t(p));
      continue;
    }
    candidates.clear();
    for (size_t i = 0; i < n_links; ++i)
      if (c.sessions[i] && holdings_contain(c.sessions[i]->routable, lay, uint32_t(id))) candidates.push_back(i);
    for (size_t k : candidates) was_candidate[k] = true;
    if (!candidates.empty()) {
      const size_t chosen = chooser_.choose(candidates, c.load);
      c.owner[p] = int32_t(chosen);
      ++c.load[chosen];
      continue;
    }
    bool was_held = false;
    for (size_t i = 0; i < n_links && !was_held; ++i) was_held = holdings_contain(absent_held[i], lay, uint32_t(id));
    (was_held ? c.unavailable_pairs : c.local_pairs).push_back(uint32_t(p));
  }
  chooser_.decay_unused(was_candidate, c.load);
  if (local_copy_ || (c.local_pairs.empty() && c.unavailable_pairs.empty())) return Status::ok();
  // No worker may serve these now and there is no copy here: fail before anything is sent.
  std::vector<int32_t> ids;
  for (const std::vector<uint32_t>* v : {&c.local_pairs, &c.unavailable_pairs})
    for (uint32_t p : *v) ids.push_back(b.ids[p]);
  std::lock_guard lock(stats_mu_);
  ++stats_.calls_failed;
  return Status::error("layer " + std::to_string(b.layer) + ": no live worker holds expert" +
                       (ids.size() == 1 ? " " : "s ") + expert_list_text(ids) +
                       ", and this backbone has no copy of the experts (loaded from a backbone file)");
}

// 2. Requests, split to fit both frame limits, all sent before anything is computed here.
void RemoteExpertExecutor::send_requests(Call& c) {
  for (size_t i = 0; i < links_.size(); ++i) {
    if (!c.sessions[i]) continue;
    LinkSession& s = *c.sessions[i];
    Chunks chunks = split_for_limits(c.b, c.owner, int32_t(i), c.row_bytes, c.E, options_.expert_output,
                                     s.conn->peer_max_payload_bytes(), s.conn->max_payload_bytes());
    if (!chunks.too_large.empty()) c.fall_back(i, FallbackReason::TOO_LARGE, std::move(chunks.too_large));
    for (size_t k = 0; k < chunks.requests.size(); ++k) {
      if (k >= options_.max_requests_per_worker) {
        c.fall_back(i, FallbackReason::OVERLOADED, std::move(chunks.requests[k]));
        continue;
      }
      Outgoing o{.link = i, .session = c.sessions[i], .id = links_[i]->begin_request(s),
                 .pairs = std::move(chunks.requests[k])};
      const proto::ExpertRequest req = make_request(c.b, o.pairs, o.id, c.row_bytes, options_.expert_output);
      o.request_bytes = proto::kFrameHeaderBytes + proto::message_payload_bytes(req);
      o.sent_at = Clock::now();
      if (std::optional<LinkAnswer> f = links_[i]->send(s, req, c.deadline)) {
        if (f->reason != FallbackReason::TOO_LARGE) links_[i]->fail(s, f->reason, f->message);
        c.fall_back(i, f->reason, std::move(o.pairs));
        continue;
      }
      ++c.link_requests[i];
      c.bytes_sent += o.request_bytes;
      c.sent.push_back(std::move(o));
    }
  }
  c.failed_before_wait = c.failed.size();
}

// 3. The backbone's own share (and what already failed) while the workers compute, and the hot cache's pairs.
Status RemoteExpertExecutor::compute_own_share(Call& c) {
  std::vector<uint32_t> now = c.local_pairs;
  now.insert(now.end(), c.unavailable_pairs.begin(), c.unavailable_pairs.end());
  for (const auto& [why, pairs] : c.failed) now.insert(now.end(), pairs.begin(), pairs.end());
  Status st = compute_local(c.b, now, c.out, c.deadline);
  if (st && !c.cached_pairs.empty()) {
    LocalExpertExecutor from_cache(c.hot->store(), pool_, options_.expert_output);
    st = compute_masked(from_cache, c.b, c.cached_pairs, c.out);
  }
  if (!st) {
    for (const Outgoing& o : c.sent) (void)links_[o.link]->wait(o.id, Clock::now());  // unregister, blame no one
  }
  return st;
}

// 4. Answers, until the deadline. Each accepted one fills its slots; the others are recomputed here, and so
//    are the audited ones, whose answers must then equal the replica's bits.
Status RemoteExpertExecutor::collect_answers(Call& c) {
  c.answered_by.assign(c.sent.size(), 0);
  for (size_t si = 0; si < c.sent.size(); ++si) {
    Outgoing& o = c.sent[si];
    Answer ans = await_answer(c.b, o, c.deadline, c.sessions, c.load);
    LinkAnswer& a = ans.answer;
    if (ans.hedged) {
      ++c.hedges;
      ++c.link_requests[ans.hedge_link];
      c.bytes_sent += ans.hedge_bytes;
    }
    if (!a.response) {
      // OVERLOADED is back-pressure from a healthy worker; every other failure ends its session.
      if (a.reason != FallbackReason::OVERLOADED) links_[ans.link]->fail(*ans.session, a.reason, a.message);
      c.fall_back(ans.link, a.reason, o.pairs);
      continue;
    }
    if (ans.hedged && ans.link == ans.hedge_link) ++c.hedge_wins;
    ++c.responses;
    c.bytes_received += proto::kFrameHeaderBytes + proto::expert_response_payload_bytes(o.pairs.size(), c.E, options_.expert_output);
    links_[ans.link]->note_success();
    const Clock::time_point got = a.received_at == Clock::time_point{} ? Clock::now() : a.received_at;
    chooser_.record(ans.link, std::chrono::duration<double>(got - ans.sent_at).count(), o.pairs.size());
    c.answered_by[si] = ans.link;
    if (audit_.enabled() && !audit_.dropped(ans.link) && audit_.should_audit(ans.link)) {
      c.audited.emplace_back(&o, std::move(*a.response));
      continue;
    }
    c.link_served[ans.link] += o.pairs.size();
    o.answered = true;
    c.fill(o, a.response->outputs);
  }
  std::vector<uint32_t> later;
  for (size_t f = c.failed_before_wait; f < c.failed.size(); ++f)
    later.insert(later.end(), c.failed[f].second.begin(), c.failed[f].second.end());
  for (const auto& [o, resp] : c.audited) later.insert(later.end(), o->pairs.begin(), o->pairs.end());
  ESSAIM_RETURN_IF_ERROR(compute_local(c.b, later, c.out, c.deadline));
  return check_audits(c);
}

// An audited answer must equal the replica's bits (now in out); a worker that disagrees is dropped, and
// everything else it answered in this call is recomputed here too, so nothing it sent reaches `out`.
Status RemoteExpertExecutor::check_audits(Call& c) {
  for (const auto& [o, resp] : c.audited) {
    ++c.audits;
    bool same = true;
    for (size_t i = 0; i < o->pairs.size() && same; ++i)
      same = std::memcmp(c.out.data() + size_t(o->pairs[i]) * c.E, resp.outputs.data() + i * c.E, c.E * sizeof(float)) == 0;
    const size_t by = c.answered_by[size_t(o - c.sent.data())];
    ++c.link_audits[by];
    audit_.record(by, same);
    if (same) {
      c.link_served[by] += o->pairs.size();
      continue;
    }
    ++c.link_audits_failed[by];
    if (const std::shared_ptr<LinkSession> bad = by == o->link ? o->session : c.sessions[by])
      links_[by]->fail(*bad, FallbackReason::AUDIT_MISMATCH, "an audited answer differs from the replica");
    c.fall_back(by, FallbackReason::AUDIT_MISMATCH, o->pairs);
  }
  std::vector<uint32_t> distrusted;
  for (size_t si = 0; si < c.sent.size(); ++si) {
    const Outgoing& o = c.sent[si];
    const size_t by = c.answered_by[si];
    if (!o.answered || c.link_audits_failed[by] == 0) continue;  // audited answers were recomputed already
    c.link_served[by] -= std::min<uint64_t>(c.link_served[by], o.pairs.size());
    distrusted.insert(distrusted.end(), o.pairs.begin(), o.pairs.end());
    c.fall_back(by, FallbackReason::AUDIT_MISMATCH, o.pairs);
  }
  return compute_local(c.b, distrusted, c.out, c.deadline);
}

void RemoteExpertExecutor::record_call(const Call& c) {
  const double seconds = std::chrono::duration<double>(Clock::now() - c.t0).count();
  std::lock_guard lock(stats_mu_);
  DispatchStats& st = stats_;
  ++st.layer_calls;
  st.pairs += c.asked;
  st.pairs_local += c.local_pairs.size();
  st.pairs_cached += c.cached_pairs.size();
  if (!c.cached_pairs.empty() && c.sent.empty()) ++st.calls_from_cache;
  if (!c.cached_pairs.empty()) options_.hot_cache->note_hits(c.cached_pairs.size());
  st.requests += c.sent.size();
  st.responses += c.responses;
  st.audits += c.audits;
  st.hedges += c.hedges;
  st.hedge_wins += c.hedge_wins;
  if (!c.unavailable_pairs.empty()) st.fallback_pairs[size_t(FallbackReason::UNAVAILABLE)] += c.unavailable_pairs.size();
  for (const auto& [why, pairs] : c.failed) {
    ++st.fallback_requests[size_t(why)];
    st.fallback_pairs[size_t(why)] += pairs.size();
  }
  st.pairs_fallback = st.fallbacks();
  for (size_t i = 0; i < links_.size(); ++i) {
    st.workers[i].requests += c.link_requests[i];
    st.workers[i].pairs_served += c.link_served[i];
    st.workers[i].failures += c.link_failures[i];
    st.workers[i].mean_round_trip_ms = 1e3 * chooser_.mean_round_trip(i);
    st.workers[i].audits += c.link_audits[i];
    st.workers[i].audits_failed += c.link_audits_failed[i];
    st.pairs_remote += c.link_served[i];
  }
  if (st.layers.size() <= size_t(c.b.layer)) st.layers.resize(size_t(c.b.layer) + 1);
  LayerWire& lw = st.layers[size_t(c.b.layer)];
  ++lw.calls;
  lw.requests += c.sent.size();
  lw.bytes_sent += c.bytes_sent;
  lw.bytes_received += c.bytes_received;
  st.seconds += seconds;
  st.max_call_seconds = std::max(st.max_call_seconds, seconds);
}

RemoteExpertExecutor::Answer RemoteExpertExecutor::await_answer(const ExpertBatch& b, const Outgoing& o,
                                                                net::Deadline deadline,
                                                                const std::vector<std::shared_ptr<LinkSession>>& sessions,
                                                                std::vector<uint64_t>& load) {
  const uint64_t E = uint64_t(replica_.any(b.layer)->n_embd);
  auto checked = [&](LinkAnswer a) { return checked_answer(std::move(a), o.pairs.size(), E, options_.expert_output); };
  Answer r{.answer = {}, .link = o.link, .session = o.session, .sent_at = o.sent_at};
  std::chrono::nanoseconds late = chooser_.hedge_after(o.link);
  // Without a local copy another replica is the only fallback, so hedging is always on, and a worker with
  // no history (or hedging off) is late at half the deadline: a stalled worker then costs half a deadline,
  // not the call. When its duplicate wins, that worker is blamed (TIMEOUT) as a full backbone would at the
  // deadline, so it is not asked first again until it has reconnected.
  const bool forced_hedge = !local_copy_ && late == std::chrono::nanoseconds::max();
  if (forced_hedge) late = std::chrono::duration_cast<std::chrono::nanoseconds>(options_.timeout) / 2;
  if (!options_.replicas.hedge && local_copy_) {
    r.answer = checked(links_[o.link]->wait(o.id, deadline));
    return r;
  }
  // Until the request is late (or the deadline, for a link without history), only its own answer counts.
  const net::Deadline hedge_at =
      late == std::chrono::nanoseconds::max() || o.sent_at + late >= deadline ? deadline : o.sent_at + late;
  std::optional<LinkAnswer> early = links_[o.link]->poll(o.id, hedge_at);
  if (early) {
    r.answer = checked(std::move(*early));
    if (r.answer.response || Clock::now() >= deadline) return r;
    // A failed answer (an ERROR, OVERLOADED, a wrong shape, a broken session) with time left: another live
    // replica is asked before the backbone computes the pairs itself.
  } else if (hedge_at >= deadline) {
    r.answer = checked(links_[o.link]->wait(o.id, Clock::now()));  // the deadline passed: TIMEOUT
    return r;
  }
  // Without a second replica (or a duplicate that cannot be sent) the original is all there is.
  const std::optional<RaceSide> hedge = send_hedge(b, o, deadline, sessions, load);
  if (!hedge) {
    if (!early) r.answer = checked(links_[o.link]->wait(o.id, deadline));
    return r;
  }
  r.hedged = true;
  r.hedge_link = hedge->link;
  r.hedge_bytes = o.request_bytes;
  return race(r, {o.link, o.id, o.session, o.sent_at, /*open=*/!early}, *hedge, deadline, forced_hedge, E, o);
}

// Late relative to its own history. A second replica: live, another link, holding every pair's expert, with
// frame limits the same request fits; the duplicate is the same request with another id.
std::optional<RemoteExpertExecutor::RaceSide> RemoteExpertExecutor::send_hedge(
    const ExpertBatch& b, const Outgoing& o, net::Deadline deadline,
    const std::vector<std::shared_ptr<LinkSession>>& sessions, std::vector<uint64_t>& load) {
  const ExpertLayer* layer = replica_.any(b.layer);
  const uint64_t E = uint64_t(layer->n_embd);
  std::vector<size_t> candidates;
  for (size_t j = 0; j < links_.size(); ++j) {
    if (j == o.link || !sessions[j]) continue;
    bool all = true;
    for (size_t i = 0; i < o.pairs.size() && all; ++i)
      all = holdings_contain(sessions[j]->routable, uint32_t(b.layer), uint32_t(b.ids[o.pairs[i]]));
    all = all && o.request_bytes - proto::kFrameHeaderBytes <= sessions[j]->conn->peer_max_payload_bytes() &&
          proto::expert_response_payload_bytes(o.pairs.size(), E, options_.expert_output) <=
              sessions[j]->conn->max_payload_bytes();
    if (all) candidates.push_back(j);
  }
  if (candidates.empty()) return std::nullopt;
  const size_t h = chooser_.choose(candidates, load);
  LinkSession& hs = *sessions[h];
  const uint64_t hid = links_[h]->begin_request(hs);
  const proto::ExpertRequest dup = make_request(b, o.pairs, hid, layer->activation_row_bytes(), options_.expert_output);
  const Clock::time_point hedge_sent = Clock::now();
  if (std::optional<LinkAnswer> f = links_[h]->send(hs, dup, deadline)) {
    if (f->reason != FallbackReason::TOO_LARGE) links_[h]->fail(hs, f->reason, f->message);
    return std::nullopt;
  }
  load[h] += o.pairs.size();
  return RaceSide{h, hid, sessions[h], hedge_sent};
}

// The first good answer of the two wins and the other request is forgotten (its late answer is dropped, and a
// slow worker is not blamed for being slower). A failure on one side leaves the other to wait for; when both
// fail, the first failure is blamed here and the second returned. Polled in 1 ms slices. `r` carries the
// original's failure when it already failed (original.open false).
RemoteExpertExecutor::Answer RemoteExpertExecutor::race(const Answer& r, RaceSide original, RaceSide hedge,
                                                        net::Deadline deadline, bool forced_hedge, uint64_t E,
                                                        const Outgoing& o) {
  RaceSide sides[2] = {original, hedge};
  std::vector<Answer> failures;
  if (!original.open) failures.push_back(r);
  while (sides[0].open || sides[1].open) {
    const Clock::time_point now = Clock::now();
    const bool expired = now >= deadline;
    const net::Deadline slice = expired ? now : std::min<net::Deadline>(deadline, now + std::chrono::milliseconds(1));
    for (int k = 0; k < 2; ++k) {
      RaceSide& side = sides[k];
      if (!side.open) continue;
      const bool other_open = sides[1 - k].open;
      std::optional<LinkAnswer> a;
      if (expired) a = links_[side.link]->wait(side.id, now);
      else a = links_[side.link]->poll(side.id, k == 0 || !other_open ? slice : now);
      if (!a) continue;
      side.open = false;
      Answer got = r;
      got.answer = checked_answer(std::move(*a), o.pairs.size(), E, options_.expert_output);
      got.link = side.link;
      got.session = side.session;
      got.sent_at = side.sent_at;
      if (got.answer.response) {
        RaceSide& other = sides[1 - k];
        if (other.open) (void)links_[other.link]->wait(other.id, Clock::time_point{});  // unregister, blame no one
        if (other.open && k == 1 && forced_hedge)
          links_[o.link]->fail(*o.session, FallbackReason::TIMEOUT,
                               "no answer within half the deadline; another replica answered (no local copy)");
        return got;
      }
      failures.push_back(std::move(got));
    }
  }
  const Answer& first = failures.front();
  if (first.answer.reason != FallbackReason::OVERLOADED)
    links_[first.link]->fail(*first.session, first.answer.reason, first.answer.message);
  return failures.back();
}

Status RemoteExpertExecutor::retry_failed(const ExpertBatch& b, const std::vector<uint32_t>& lost,
                                          const std::string& why) {
  std::vector<int32_t> ids;
  for (uint32_t p : lost) ids.push_back(b.ids[p]);
  std::lock_guard lock(stats_mu_);
  ++stats_.calls_failed;
  return Status::error("layer " + std::to_string(b.layer) + ": expert" + (ids.size() == 1 ? " " : "s ") +
                       expert_list_text(ids) + ": " + why +
                       " (this backbone has no copy of the experts: it was loaded from a backbone file)");
}

Status RemoteExpertExecutor::ask_other_replicas(const ExpertBatch& b, const std::vector<uint32_t>& pairs,
                                                std::span<float> out, net::Deadline deadline) {
  // Live sessions now: a worker whose answer just failed has had its session ended, so it is not asked again.
  const size_t n_links = links_.size();
  std::vector<std::shared_ptr<LinkSession>> sessions(n_links);
  for (size_t i = 0; i < n_links; ++i)
    if (!audit_.dropped(i)) sessions[i] = links_[i]->session();
  std::vector<int32_t> owner(b.ids.size(), -1);
  std::vector<uint64_t> load(n_links, 0);
  std::vector<uint32_t> nobody;
  std::vector<size_t> candidates;
  for (uint32_t p : pairs) {
    candidates.clear();
    for (size_t i = 0; i < n_links; ++i)
      if (sessions[i] && holdings_contain(sessions[i]->routable, uint32_t(b.layer), uint32_t(b.ids[p])))
        candidates.push_back(i);
    if (candidates.empty()) {
      nobody.push_back(p);
      continue;
    }
    const size_t chosen = chooser_.choose(candidates, load);
    owner[p] = int32_t(chosen);
    ++load[chosen];
  }
  if (!nobody.empty()) return retry_failed(b, nobody, "their worker failed and no other live replica holds them");
  if (Clock::now() >= deadline) return retry_failed(b, pairs, "their answer failed and the deadline has passed");
  std::vector<Outgoing> sent;
  ESSAIM_RETURN_IF_ERROR(send_retries(b, owner, load, sessions, deadline, sent));
  return await_retries(b, sent, out, deadline);
}

// The retried pairs' requests, split to fit both frame limits; on a failure every request sent is forgotten.
Status RemoteExpertExecutor::send_retries(const ExpertBatch& b, const std::vector<int32_t>& owner,
                                          const std::vector<uint64_t>& load,
                                          const std::vector<std::shared_ptr<LinkSession>>& sessions,
                                          net::Deadline deadline, std::vector<Outgoing>& sent) {
  const ExpertLayer* layer = replica_.any(b.layer);
  const uint64_t E = uint64_t(layer->n_embd);
  const uint64_t row_bytes = layer->activation_row_bytes();
  auto forget_sent = [&] {
    for (const Outgoing& o : sent) (void)links_[o.link]->wait(o.id, Clock::time_point{});  // unregister
  };
  for (size_t i = 0; i < links_.size(); ++i) {
    if (!sessions[i] || load[i] == 0) continue;
    LinkSession& s = *sessions[i];
    Chunks chunks = split_for_limits(b, owner, int32_t(i), row_bytes, E, options_.expert_output,
                                     s.conn->peer_max_payload_bytes(), s.conn->max_payload_bytes());
    if (!chunks.too_large.empty()) {
      forget_sent();
      return retry_failed(b, chunks.too_large, "one row's request or answer does not fit the frame limits");
    }
    for (std::vector<uint32_t>& c : chunks.requests) {
      Outgoing o{.link = i, .session = sessions[i], .id = links_[i]->begin_request(s), .pairs = std::move(c)};
      const proto::ExpertRequest req = make_request(b, o.pairs, o.id, row_bytes, options_.expert_output);
      o.request_bytes = proto::kFrameHeaderBytes + proto::message_payload_bytes(req);
      o.sent_at = Clock::now();
      if (std::optional<LinkAnswer> f = links_[i]->send(s, req, deadline)) {
        if (f->reason != FallbackReason::TOO_LARGE) links_[i]->fail(s, f->reason, f->message);
        forget_sent();
        return retry_failed(b, o.pairs, "sending them to another replica failed (" + f->message + ")");
      }
      sent.push_back(std::move(o));
    }
  }
  return Status::ok();
}

// Every retried request's answer by the deadline, into `out`; the first that fails fails the call.
Status RemoteExpertExecutor::await_retries(const ExpertBatch& b, const std::vector<Outgoing>& sent,
                                           std::span<float> out, net::Deadline deadline) {
  const uint64_t E = uint64_t(replica_.any(b.layer)->n_embd);
  const size_t n_links = links_.size();
  uint64_t served = 0, bytes_sent = 0, bytes_received = 0;
  std::vector<uint64_t> link_served(n_links, 0), link_requests(n_links, 0);
  for (size_t si = 0; si < sent.size(); ++si) {
    const Outgoing& o = sent[si];
    LinkAnswer a = checked_answer(links_[o.link]->wait(o.id, deadline), o.pairs.size(), E, options_.expert_output);
    ++link_requests[o.link];
    bytes_sent += o.request_bytes;
    if (!a.response) {
      if (a.reason != FallbackReason::OVERLOADED) links_[o.link]->fail(*o.session, a.reason, a.message);
      for (size_t rest = si + 1; rest < sent.size(); ++rest)
        (void)links_[sent[rest].link]->wait(sent[rest].id, Clock::time_point{});
      return retry_failed(b, o.pairs, "no replica answered before the deadline (the last asked: " +
                                          std::string(fallback_reason_name(a.reason)) + ", " + a.message + ")");
    }
    links_[o.link]->note_success();
    const std::vector<float>& rows = a.response->outputs;
    for (size_t i = 0; i < o.pairs.size(); ++i)
      std::memcpy(out.data() + size_t(o.pairs[i]) * E, rows.data() + i * E, E * sizeof(float));
    served += o.pairs.size();
    link_served[o.link] += o.pairs.size();
    bytes_received += proto::kFrameHeaderBytes + proto::expert_response_payload_bytes(o.pairs.size(), E, options_.expert_output);
  }
  std::lock_guard lock(stats_mu_);
  stats_.pairs_retried += served;
  stats_.pairs_remote += served;
  stats_.requests += sent.size();
  stats_.responses += sent.size();
  for (size_t i = 0; i < n_links; ++i) {
    stats_.workers[i].requests += link_requests[i];
    stats_.workers[i].pairs_served += link_served[i];
  }
  if (stats_.layers.size() <= size_t(b.layer)) stats_.layers.resize(size_t(b.layer) + 1);
  stats_.layers[size_t(b.layer)].bytes_sent += bytes_sent;
  stats_.layers[size_t(b.layer)].bytes_received += bytes_received;
  return Status::ok();
}

Result<std::unique_ptr<RemoteExpertExecutor>> remote_executor_for_model(const Model& model, const ExpertMap& map,
                                                                        ThreadPool* pool, DispatchOptions options) {
  ESSAIM_ASSIGN_OR_RETURN(ModelIdentity id, source_model_identity(model.file()));
  // Workers must prove their expert bytes are this file's (identity by content, docs/protocol.md).
  ESSAIM_ASSIGN_OR_RETURN(PeerCheck weights, weights_check(model.file()));
  options.link.policy.check_peer = both_checks(std::move(options.link.policy.check_peer), std::move(weights));
  const std::chrono::milliseconds wait = options.link.connect_timeout;
  ESSAIM_ASSIGN_OR_RETURN(std::unique_ptr<RemoteExpertExecutor> ex,
                          RemoteExpertExecutor::create(model.expert_store(), id, map, pool, std::move(options)));
  ex->wait_connected(net::deadline_in(wait + std::chrono::milliseconds(500)));
  return ex;
}

}  // namespace essaim::backbone
