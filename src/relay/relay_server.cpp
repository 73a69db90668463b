#include "relay/relay_server.h"

#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "net/metrics_text.h"
#include "relay/preamble.h"
#include "relay/relay_pairing.h"

namespace essaim::relay {

using net::WsCloseCode;

std::string_view refusal_reason_name(RefusalReason r) {
  switch (r) {
    case RefusalReason::BAD_PREAMBLE: return "bad_preamble";
    case RefusalReason::BAD_TOKEN: return "bad_token";
    case RefusalReason::TOKEN_UNAVAILABLE: return "token_unavailable";
    case RefusalReason::NODE_LIMIT: return "node_limit";
    case RefusalReason::FINGERPRINT: return "fingerprint";
    case RefusalReason::NO_WORKER: return "no_worker";
    case RefusalReason::BUSY: return "busy";
    case RefusalReason::COUNT: break;
  }
  return "?";
}

std::string_view drop_reason_name(DropReason r) {
  switch (r) {
    case DropReason::STALLED_PEER: return "stalled_peer";
    case DropReason::PEER_GONE: return "peer_gone";
    case DropReason::TOO_BIG: return "too_big";
    case DropReason::COUNT: break;
  }
  return "?";
}

struct RelayServer::Impl {
  // First, so destroyed last: its io_context's pending handlers hold sessions and connections.
  std::unique_ptr<net::WsListener> listener;
  // The listener for /metrics, which an I/O thread may serve before `listener` is assigned.
  std::atomic<const net::WsListener*> listening{nullptr};
  RelayOptions opts;
  std::unique_ptr<TokenChecker> tokens;
  RelayCounters counters;
  Pairing pairing{opts, counters};
  // The re-check of idle workers' tokens (opts.token_recheck > 0): its own thread, since a check may block.
  std::thread recheck;
  std::mutex recheck_mu;
  std::condition_variable recheck_cv;
  bool stopping = false;  // guarded by recheck_mu

  // A token the checker now refuses (revoked) closes its idle connections; an unavailable checker closes
  // nothing here (new connections fail closed, registered ones are not dropped for a coordinator's hiccup).
  void recheck_loop() {
    std::unique_lock lk(recheck_mu);
    while (!recheck_cv.wait_for(lk, opts.token_recheck, [&] { return stopping; })) {
      lk.unlock();
      std::map<std::string, TokenVerdict> verdicts;
      for (const std::shared_ptr<RelayConnection>& c : pairing.idle_workers()) {
        auto it = verdicts.find(c->preamble.token);
        if (it == verdicts.end()) it = verdicts.emplace(c->preamble.token, tokens->check(c->preamble.token)).first;
        if (it->second.kind == TokenVerdict::Kind::REFUSED) pairing.refuse_idle(c, "bad token: " + it->second.reason);
      }
      lk.lock();
    }
  }

  // An upgraded connection: its first message (under the preamble's own 1 KiB limit) within preamble_timeout.
  void on_session(const std::shared_ptr<net::WsSession>& s) {
    counters.connections_total++;
    auto c = std::make_shared<RelayConnection>();
    c->ws = s;
    // The session holds these callbacks, and they the connection, until its read side ends.
    s->start([this, c](std::vector<uint8_t> m) { return on_message(c, std::move(m)); },
             [this, c](const net::NetError& why) { on_end(*c, why); }, opts.preamble_timeout);
  }

  bool on_message(const std::shared_ptr<RelayConnection>& c, std::vector<uint8_t> m) {
    switch (c->stage.load()) {
      case RelayConnection::Stage::PREAMBLE: return on_preamble(c, m);
      case RelayConnection::Stage::REGISTERED: return pairing.forward(*c, std::move(m));
      case RelayConnection::Stage::CHECKING:  // (not reading meanwhile)
      case RelayConnection::Stage::REFUSED: return true;  // dropped: the close is on its way
    }
    return true;
  }

  // The token is checked on the listener's blocking pool (a coordinator round trip may take seconds); the
  // session does not read meanwhile.
  bool on_preamble(const std::shared_ptr<RelayConnection>& c, const std::vector<uint8_t>& m) {
    Result<Preamble> p = decode_preamble(m);
    if (!p) {
      pairing.refuse(*c, RefusalReason::BAD_PREAMBLE, WsCloseCode::PROTOCOL, "bad preamble: " + p.status().message());
      return true;
    }
    c->preamble = std::move(*p);
    c->stage = RelayConnection::Stage::CHECKING;
    c->ws->run_blocking([this, c] { on_token(c, tokens->check(c->preamble.token)); });
    return false;
  }

  void on_token(const std::shared_ptr<RelayConnection>& c, const TokenVerdict& v) {
    if (v.kind == TokenVerdict::Kind::UNAVAILABLE) return pairing.refuse(*c, RefusalReason::TOKEN_UNAVAILABLE, WsCloseCode::TRY_AGAIN_LATER, v.reason);
    if (!v.ok()) return pairing.refuse(*c, RefusalReason::BAD_TOKEN, WsCloseCode::POLICY, "bad token: " + v.reason);
    if (std::optional<std::string> no = c->ws->authenticate()) {
      return pairing.refuse(*c, RefusalReason::BUSY, WsCloseCode::TRY_AGAIN_LATER, *no);
    }
    if (!pairing.take_node_slot(*c, v.node_id)) {
      return pairing.refuse(*c, RefusalReason::NODE_LIMIT, WsCloseCode::POLICY,
                            "node " + v.node_id + " has " + std::to_string(opts.max_connections_per_node) + " connections already");
    }
    if (c->preamble.role == RelayRole::WORKER) {
      pairing.add_worker(c);
    } else {
      pairing.add_backbone(c);
    }
  }

  void on_end(RelayConnection& c, const net::NetError& why) {
    if (c.stage == RelayConnection::Stage::PREAMBLE) {
      counters.refusals[size_t(RefusalReason::BAD_PREAMBLE)]++;
      c.ws->close_with(why.kind == net::NetErrorKind::TIMEOUT ? WsCloseCode::POLICY : WsCloseCode::PROTOCOL,
                       "no preamble: " + why.message);
      return;
    }
    pairing.ended(c, why);
  }

  std::string metrics() const {
    net::MetricsText m;
    m.family("essaim_relay_connections_total", "counter", "WebSocket connections that reached the preamble");
    m.sample("essaim_relay_connections_total", {}, double(counters.connections_total.load()));
    m.family("essaim_relay_pairs_total", "counter", "Backbone-worker pairs made");
    m.sample("essaim_relay_pairs_total", {}, double(counters.pairs_total.load()));
    m.family("essaim_relay_pairs_active", "gauge", "Pairs forwarding now");
    m.sample("essaim_relay_pairs_active", {}, double(counters.pairs_active.load()));
    m.family("essaim_relay_idle_workers", "gauge", "Worker connections waiting for a backbone");
    m.sample("essaim_relay_idle_workers", {}, double(counters.idle_workers.load()));
    m.family("essaim_relay_bytes_total", "counter", "Message bytes forwarded, by destination");
    m.sample("essaim_relay_bytes_total", {{"to", "worker"}}, double(counters.bytes_to[kWorker].load()));
    m.sample("essaim_relay_bytes_total", {{"to", "backbone"}}, double(counters.bytes_to[kBackbone].load()));
    m.family("essaim_relay_messages_total", "counter", "Messages forwarded, by destination");
    m.sample("essaim_relay_messages_total", {{"to", "worker"}}, double(counters.messages_to[kWorker].load()));
    m.sample("essaim_relay_messages_total", {{"to", "backbone"}}, double(counters.messages_to[kBackbone].load()));
    m.family("essaim_relay_dropped_messages_total", "counter", "Messages not delivered, by reason");
    for (size_t i = 0; i < size_t(DropReason::COUNT); ++i)
      m.sample("essaim_relay_dropped_messages_total", {{"reason", std::string(drop_reason_name(DropReason(i)))}}, double(counters.dropped_messages[i].load()));
    m.family("essaim_relay_dropped_bytes_total", "counter", "Bytes of the messages not delivered, by reason");
    for (size_t i = 0; i < size_t(DropReason::COUNT); ++i)
      m.sample("essaim_relay_dropped_bytes_total", {{"reason", std::string(drop_reason_name(DropReason(i)))}}, double(counters.dropped_bytes[i].load()));
    m.family("essaim_relay_refusals_total", "counter", "Connections refused, by reason");
    for (size_t i = 0; i < size_t(RefusalReason::COUNT); ++i)
      m.sample("essaim_relay_refusals_total", {{"reason", std::string(refusal_reason_name(RefusalReason(i)))}}, double(counters.refusals[i].load()));
    if (const net::WsListener* serving = listening.load(std::memory_order_acquire)) {
      net::WsListenerStats l = serving->stats();
      m.family("essaim_relay_handshake_failures_total", "counter", "TLS or upgrade handshakes that failed");
      m.sample("essaim_relay_handshake_failures_total", {}, double(l.handshake_failures));
      m.family("essaim_relay_refused_busy_total", "counter", "Connections closed at once: too many handshakes in progress");
      m.sample("essaim_relay_refused_busy_total", {}, double(l.refused_busy));
    }
    return m.text();
  }
};

Result<std::unique_ptr<RelayServer>> RelayServer::start(const std::string& host, uint16_t port, RelayOptions options,
                                                        std::unique_ptr<TokenChecker> tokens) {
  auto impl = std::make_unique<Impl>();
  impl->opts = std::move(options);
  impl->tokens = std::move(tokens);
  Impl* raw = impl.get();
  net::WsListenerOptions lo;
  lo.limits = impl->opts.limits;
  lo.tls = impl->opts.tls;
  lo.limits.first_message_max_bytes = kMaxPreambleBytes;  // the preamble, before any large message
  lo.admission = {.max_unauthenticated = impl->opts.max_pending,
                  .max_unauthenticated_per_address = impl->opts.max_pending_per_address,
                  .max_authenticated = impl->opts.max_connections,
                  .max_authenticated_per_address = impl->opts.max_per_address};
  lo.io_threads = impl->opts.threads;
  lo.write_stall = impl->opts.write_stall;
  lo.log = impl->opts.log;
  lo.http = [raw](const net::HttpRequestView& req) {
    if (req.method == "GET" && req.target == "/metrics") {
      return net::HttpReply{.status = 200, .content_type = "text/plain; version=0.0.4", .body = raw->metrics(), .headers = {}};
    }
    if (req.method == "GET" && req.target == "/") return net::HttpReply{.status = 200, .content_type = "text/plain", .body = "essaim relay\n", .headers = {}};
    return net::HttpReply{.status = 404, .content_type = "text/plain", .body = "not found\n", .headers = {}};
  };
  net::NetResult<std::unique_ptr<net::WsListener>> l =
      net::WsListener::listen(host, port, std::move(lo), [raw](std::shared_ptr<net::WsSession> s) { raw->on_session(s); });
  if (!l) return Status::error(l.error().message);
  impl->listener = std::move(*l);
  impl->listening.store(impl->listener.get(), std::memory_order_release);
  if (impl->opts.token_recheck.count() > 0) impl->recheck = std::thread([raw] { raw->recheck_loop(); });
  return std::unique_ptr<RelayServer>(new RelayServer(std::move(impl)));
}

RelayServer::RelayServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RelayServer::~RelayServer() { stop(); }
uint16_t RelayServer::port() const { return impl_->listener->port(); }

// The listener first (its threads joined, every session's callbacks dropped), then what the pairing holds.
void RelayServer::stop() {
  {
    std::lock_guard lk(impl_->recheck_mu);
    impl_->stopping = true;
  }
  impl_->recheck_cv.notify_all();
  if (impl_->recheck.joinable()) impl_->recheck.join();
  if (impl_->listener) impl_->listener->stop();
  impl_->pairing.clear();
}

RelayStats RelayServer::stats() const {
  RelayStats s;
  const RelayCounters& c = impl_->counters;
  s.connections_total = c.connections_total, s.pairs_total = c.pairs_total, s.pairs_active = c.pairs_active;
  s.idle_workers = c.idle_workers;
  s.bytes_to_worker = c.bytes_to[kWorker], s.bytes_to_backbone = c.bytes_to[kBackbone];
  s.messages_to_worker = c.messages_to[kWorker], s.messages_to_backbone = c.messages_to[kBackbone];
  for (size_t k = 0; k < size_t(DropReason::COUNT); ++k) s.dropped_messages[k] = c.dropped_messages[k], s.dropped_bytes[k] = c.dropped_bytes[k];
  for (size_t k = 0; k < size_t(RefusalReason::COUNT); ++k) s.refusals[k] = c.refusals[k];
  if (impl_->listener) s.listener = impl_->listener->stats();
  return s;
}

std::string RelayServer::metrics_text() const { return impl_->metrics(); }

}  // namespace essaim::relay
