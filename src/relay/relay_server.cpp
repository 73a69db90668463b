#include "relay/relay_server.h"

#include <condition_variable>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>

#include "net/metrics_text.h"
#include "net/stream_server.h"
#include "relay/preamble.h"

namespace essaim::relay {

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

namespace {

using net::WsCloseCode;
using net::WsStream;
constexpr int kWorker = 0, kBackbone = 1;

// One worker connection and, once paired, its backbone. Each side's handler thread reads its own stream
// and writes to the other; writers_to[i] counts calls in progress on stream[i] from the other thread, so
// the thread that owns stream[i] (whose handler's return destroys it) waits for them to end first.
struct Pair {
  std::mutex mu;
  std::condition_variable cv;
  WsStream* stream[2] = {nullptr, nullptr};
  bool active = false;  // both sides there, PAIRED sent
  // Why the pair ends, decided by the first side that fails (a stall, a protocol error): both sides are
  // closed with it at once, and a later "the peer closed" from the other thread cannot replace it.
  std::optional<std::pair<WsCloseCode, std::string>> verdict;
  bool done[2] = {false, false};
  int writers_to[2] = {0, 0};
};

struct IdleWorker {
  std::shared_ptr<Pair> pair;
  RelayBuild build;
};

}  // namespace

struct RelayServer::Impl {
  RelayOptions opts;
  std::unique_ptr<TokenChecker> tokens;
  net::WsListener* listener = nullptr;  // owned by server
  std::unique_ptr<net::StreamServer> server;
  uint16_t port = 0;

  std::mutex mu;
  std::condition_variable cv;                               // a worker registered, or stopping
  std::map<std::string, std::list<IdleWorker>> idle;        // by node id; guarded by mu
  std::map<std::string, size_t> per_node;                   // live connections by token's node; guarded by mu
  bool stopping = false;

  // Counters (atomics: every handler thread updates them).
  std::atomic<uint64_t> connections_total{0}, pairs_total{0};
  std::atomic<int64_t> pairs_active{0}, idle_workers{0};
  std::atomic<uint64_t> bytes_to[2] = {0, 0}, messages_to[2] = {0, 0};
  std::array<std::atomic<uint64_t>, size_t(DropReason::COUNT)> dropped_messages{}, dropped_bytes{};
  std::array<std::atomic<uint64_t>, size_t(RefusalReason::COUNT)> refusals{};

  void log(const std::string& line) const {
    if (opts.log) opts.log(line);
  }

  void refuse(WsStream& s, RefusalReason why, WsCloseCode code, const std::string& reason) {
    refusals[size_t(why)]++;
    log("refused " + s.peer_name() + ": " + reason);
    s.close_with(code, reason);
  }

  void handle(net::ByteStream& bs) {
    auto* ws = dynamic_cast<WsStream*>(&bs);
    if (!ws) return;
    connections_total++;
    net::NetResult<std::vector<uint8_t>> first = ws->read_message(net::deadline_in(opts.preamble_timeout));
    if (!first) {
      refusals[size_t(RefusalReason::BAD_PREAMBLE)]++;
      ws->close_with(first.error().kind == net::NetErrorKind::TIMEOUT ? WsCloseCode::POLICY : WsCloseCode::PROTOCOL,
                     "no preamble: " + first.error().message);
      return;
    }
    Result<Preamble> p = decode_preamble(*first);
    if (!p) return refuse(*ws, RefusalReason::BAD_PREAMBLE, WsCloseCode::PROTOCOL, "bad preamble: " + p.status().message());
    TokenVerdict v = tokens->check(p->token);
    if (v.kind == TokenVerdict::Kind::UNAVAILABLE) return refuse(*ws, RefusalReason::TOKEN_UNAVAILABLE, WsCloseCode::TRY_AGAIN_LATER, v.reason);
    if (!v.ok()) return refuse(*ws, RefusalReason::BAD_TOKEN, WsCloseCode::POLICY, "bad token: " + v.reason);
    if (std::optional<std::string> no = ws->authenticate()) {
      return refuse(*ws, RefusalReason::BUSY, WsCloseCode::TRY_AGAIN_LATER, *no);
    }
    if (!take_node_slot(v.node_id)) {
      return refuse(*ws, RefusalReason::NODE_LIMIT, WsCloseCode::POLICY,
                    "node " + v.node_id + " has " + std::to_string(opts.max_connections_per_node) + " connections already");
    }
    if (p->role == RelayRole::WORKER) {
      serve_worker(*ws, v.node_id, p->build);
    } else {
      serve_backbone(*ws, v.node_id, *p);
    }
    std::lock_guard lk(mu);
    if (--per_node[v.node_id] == 0) per_node.erase(v.node_id);
  }

  bool take_node_slot(const std::string& node) {
    std::lock_guard lk(mu);
    size_t& n = per_node[node];
    if (n >= opts.max_connections_per_node) return false;
    ++n;
    return true;
  }

  void serve_worker(WsStream& ws, const std::string& node, const RelayBuild& build) {
    auto pair = std::make_shared<Pair>();
    pair->stream[kWorker] = &ws;
    {
      std::lock_guard lk(mu);
      idle[node].push_back({pair, build});
      idle_workers++;
      cv.notify_all();
    }
    log("worker " + node + " idle (" + ws.peer_name() + ", " + build.text() + ")");
    pump(*pair, kWorker);
    {
      // Still idle (never paired): unregister.
      std::lock_guard lk(mu);
      auto it = idle.find(node);
      if (it != idle.end()) {
        for (auto w = it->second.begin(); w != it->second.end(); ++w) {
          if (w->pair == pair) {
            it->second.erase(w);
            idle_workers--;
            break;
          }
        }
        if (it->second.empty()) idle.erase(it);
      }
    }
    finish(*pair, kWorker);
  }

  void serve_backbone(WsStream& ws, const std::string& who, const Preamble& p) {
    std::shared_ptr<Pair> pair;
    const net::Deadline until = net::deadline_in(opts.pair_wait);
    for (;;) {
      std::unique_lock lk(mu);
      bool mismatch = false;
      auto found = [&] {
        auto it = idle.find(p.node_id);
        if (it == idle.end()) return false;
        for (auto w = it->second.begin(); w != it->second.end(); ++w) {
          if (w->build != p.build) {
            mismatch = true;
            continue;
          }
          pair = w->pair;
          it->second.erase(w);
          if (it->second.empty()) idle.erase(it);
          idle_workers--;
          return true;
        }
        return false;
      };
      if (!cv.wait_until(lk, until, [&] { return stopping || found() || mismatch; }) || stopping) {
        lk.unlock();
        return refuse(ws, RefusalReason::NO_WORKER, WsCloseCode::TRY_AGAIN_LATER, "no worker connected for node " + p.node_id);
      }
      if (!pair) {
        lk.unlock();
        return refuse(ws, RefusalReason::FINGERPRINT, WsCloseCode::POLICY,
                      "fingerprint mismatch: the backbone has " + p.build.text() + ", worker " + p.node_id + " another build");
      }
      lk.unlock();
      std::lock_guard pl(pair->mu);
      if (pair->done[kWorker]) {  // that connection died while idle: take another
        pair.reset();
        continue;
      }
      pair->stream[kBackbone] = &ws;
      pair->writers_to[kWorker]++;  // the PAIRED message below
      break;
    }
    const uint8_t paired[1] = {kPairedMessage};
    // The backbone first: nothing else writes to its stream until the worker has its PAIRED.
    net::NetStatus b = ws.write_message(paired, net::deadline_in(opts.write_stall));
    {
      std::lock_guard pl(pair->mu);
      pair->active = bool(b);
    }
    net::NetStatus w = b ? pair->stream[kWorker]->write_message(paired, net::deadline_in(opts.write_stall)) : b;
    {
      std::lock_guard pl(pair->mu);
      pair->writers_to[kWorker]--;
      pair->cv.notify_all();
    }
    if (b && w) {
      pairs_total++;
      pairs_active++;
      log("paired " + who + " (" + ws.peer_name() + ") with worker " + p.node_id);
      pump(*pair, kBackbone);
      pairs_active--;
    } else if (b) {
      // The backbone was told PAIRED, then the worker could not be (it vanished meanwhile): for the backbone
      // its partner failed (1011), not a clean close (1000, which the handler's return would otherwise send).
      fail_pair(*pair, kWorker, "the worker is gone: " + w.error().message);
    }
    finish(*pair, kBackbone);
  }

  // Reads side `me` and forwards each message to the other side, until either ends.
  void pump(Pair& pair, int me) {
    const int other = 1 - me;
    WsStream& mine = *pair.stream[me];
    for (;;) {
      net::NetResult<std::vector<uint8_t>> m = mine.read_message(net::kNoDeadline);
      if (!m) {
        if (m.error().kind == net::NetErrorKind::CLOSED && mine.peer_close_code() == uint16_t(WsCloseCode::NORMAL)) {
          close_other(pair, me, WsCloseCode::NORMAL, "the peer closed");
        } else if (m.error().kind == net::NetErrorKind::PROTOCOL && m.error().message.find("limit") != std::string::npos) {
          dropped_messages[size_t(DropReason::TOO_BIG)]++;
          fail_pair(pair, me, "the peer sent a message over the limit");
        } else {
          // A protocol error, a peer silent past the idle timeout, a reset: the partner learns at once.
          fail_pair(pair, me, "the peer failed: " + m.error().message);
        }
        return;
      }
      WsStream* to = nullptr;
      bool before_pairing = false;
      {
        std::lock_guard pl(pair.mu);
        before_pairing = !pair.active;
        if (pair.active && !pair.done[other]) {
          to = pair.stream[other];
          pair.writers_to[other]++;
        }
      }
      if (!to) {
        dropped_messages[size_t(DropReason::PEER_GONE)]++;
        dropped_bytes[size_t(DropReason::PEER_GONE)] += m->size();
        mine.close_with(before_pairing ? WsCloseCode::PROTOCOL : WsCloseCode::NORMAL,
                        before_pairing ? "a worker sends nothing before PAIRED" : "the peer closed");
        return;
      }
      net::NetStatus st = to->write_message(*m, net::deadline_in(opts.write_stall));
      const std::string to_name = st ? std::string() : to->peer_name();  // `to` may go once writers_to drops
      {
        std::lock_guard pl(pair.mu);
        pair.writers_to[other]--;
        pair.cv.notify_all();
      }
      if (!st) {
        const DropReason why = st.error().kind == net::NetErrorKind::TIMEOUT ? DropReason::STALLED_PEER : DropReason::PEER_GONE;
        dropped_messages[size_t(why)]++;
        dropped_bytes[size_t(why)] += m->size();
        if (why == DropReason::STALLED_PEER) log("dropping a pair: " + to_name + " stopped reading");
        fail_pair(pair, other, why == DropReason::STALLED_PEER ? "the peer stopped reading" : "the peer is gone");
        return;
      }
      bytes_to[other] += m->size();
      messages_to[other]++;
    }
  }

  // Side `culprit` stalled or broke the protocol: 1011 to both, the partner first, at once.
  void fail_pair(Pair& pair, int culprit, const std::string& why) {
    {
      std::lock_guard pl(pair.mu);
      if (!pair.verdict) pair.verdict.emplace(WsCloseCode::INTERNAL, why);
    }
    close_other(pair, culprit, WsCloseCode::INTERNAL, why);
    close_other(pair, 1 - culprit, WsCloseCode::INTERNAL, why);
  }

  void close_other(Pair& pair, int me, WsCloseCode code, std::string why) {
    const int other = 1 - me;
    WsStream* to = nullptr;
    {
      std::lock_guard pl(pair.mu);
      if (pair.verdict) std::tie(code, why) = *pair.verdict;
      if (pair.stream[other] && !pair.done[other]) {
        to = pair.stream[other];
        pair.writers_to[other]++;
      }
    }
    if (to) to->close_with(code, why);
    if (to) {
      std::lock_guard pl(pair.mu);
      pair.writers_to[other]--;
      pair.cv.notify_all();
    }
  }

  // Side `me` is leaving: the other side stops using its stream, and is told.
  void finish(Pair& pair, int me) {
    close_other(pair, me, WsCloseCode::NORMAL, "the peer closed");
    std::unique_lock pl(pair.mu);
    pair.done[me] = true;
    pair.cv.wait(pl, [&] { return pair.writers_to[me] == 0; });
  }

  std::string metrics() const {
    net::MetricsText m;
    m.family("essaim_relay_connections_total", "counter", "WebSocket connections that reached the preamble");
    m.sample("essaim_relay_connections_total", {}, double(connections_total.load()));
    m.family("essaim_relay_pairs_total", "counter", "Backbone-worker pairs made");
    m.sample("essaim_relay_pairs_total", {}, double(pairs_total.load()));
    m.family("essaim_relay_pairs_active", "gauge", "Pairs forwarding now");
    m.sample("essaim_relay_pairs_active", {}, double(pairs_active.load()));
    m.family("essaim_relay_idle_workers", "gauge", "Worker connections waiting for a backbone");
    m.sample("essaim_relay_idle_workers", {}, double(idle_workers.load()));
    m.family("essaim_relay_bytes_total", "counter", "Message bytes forwarded, by destination");
    m.sample("essaim_relay_bytes_total", {{"to", "worker"}}, double(bytes_to[kWorker].load()));
    m.sample("essaim_relay_bytes_total", {{"to", "backbone"}}, double(bytes_to[kBackbone].load()));
    m.family("essaim_relay_messages_total", "counter", "Messages forwarded, by destination");
    m.sample("essaim_relay_messages_total", {{"to", "worker"}}, double(messages_to[kWorker].load()));
    m.sample("essaim_relay_messages_total", {{"to", "backbone"}}, double(messages_to[kBackbone].load()));
    m.family("essaim_relay_dropped_messages_total", "counter", "Messages not delivered, by reason");
    for (size_t i = 0; i < size_t(DropReason::COUNT); ++i)
      m.sample("essaim_relay_dropped_messages_total", {{"reason", std::string(drop_reason_name(DropReason(i)))}}, double(dropped_messages[i].load()));
    m.family("essaim_relay_dropped_bytes_total", "counter", "Bytes of the messages not delivered, by reason");
    for (size_t i = 0; i < size_t(DropReason::COUNT); ++i)
      m.sample("essaim_relay_dropped_bytes_total", {{"reason", std::string(drop_reason_name(DropReason(i)))}}, double(dropped_bytes[i].load()));
    m.family("essaim_relay_refusals_total", "counter", "Connections refused, by reason");
    for (size_t i = 0; i < size_t(RefusalReason::COUNT); ++i)
      m.sample("essaim_relay_refusals_total", {{"reason", std::string(refusal_reason_name(RefusalReason(i)))}}, double(refusals[i].load()));
    if (listener) {
      net::WsListenerStats l = listener->stats();
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
  net::WsListenerOptions lo{.limits = impl->opts.limits, .tls = impl->opts.tls};
  lo.limits.first_message_max_bytes = kMaxPreambleBytes;  // the preamble, before any large message
  lo.admission = {.max_unauthenticated = impl->opts.max_pending,
                  .max_unauthenticated_per_address = impl->opts.max_pending_per_address,
                  .max_authenticated = impl->opts.max_connections,
                  .max_authenticated_per_address = impl->opts.max_per_address};
  lo.log = impl->opts.log;
  lo.http = [raw](const net::HttpRequestView& req) {
    if (req.method == "GET" && req.target == "/metrics") {
      return net::HttpReply{.status = 200, .content_type = "text/plain; version=0.0.4", .body = raw->metrics()};
    }
    if (req.method == "GET" && req.target == "/") return net::HttpReply{.status = 200, .content_type = "text/plain", .body = "essaim relay\n"};
    return net::HttpReply{.status = 404, .content_type = "text/plain", .body = "not found\n"};
  };
  net::NetResult<std::unique_ptr<net::WsListener>> l = net::WsListener::listen(host, port, std::move(lo));
  if (!l) return Status::error(l.error().message);
  impl->listener = l->get();
  impl->port = (*l)->port();
  impl->server = std::make_unique<net::StreamServer>(std::move(*l), [raw](net::ByteStream& s) { raw->handle(s); },
                                                     net::ServerOptions{.max_connections = impl->opts.max_connections});
  return std::unique_ptr<RelayServer>(new RelayServer(std::move(impl)));
}

RelayServer::RelayServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RelayServer::~RelayServer() { stop(); }
uint16_t RelayServer::port() const { return impl_->port; }

void RelayServer::stop() {
  {
    std::lock_guard lk(impl_->mu);
    impl_->stopping = true;
    impl_->cv.notify_all();
  }
  if (impl_->server) impl_->server->stop();
}

RelayStats RelayServer::stats() const {
  RelayStats s;
  const Impl& i = *impl_;
  s.connections_total = i.connections_total, s.pairs_total = i.pairs_total, s.pairs_active = i.pairs_active;
  s.idle_workers = i.idle_workers;
  s.bytes_to_worker = i.bytes_to[kWorker], s.bytes_to_backbone = i.bytes_to[kBackbone];
  s.messages_to_worker = i.messages_to[kWorker], s.messages_to_backbone = i.messages_to[kBackbone];
  for (size_t k = 0; k < size_t(DropReason::COUNT); ++k) s.dropped_messages[k] = i.dropped_messages[k], s.dropped_bytes[k] = i.dropped_bytes[k];
  for (size_t k = 0; k < size_t(RefusalReason::COUNT); ++k) s.refusals[k] = i.refusals[k];
  if (i.listener) s.listener = i.listener->stats();
  return s;
}

std::string RelayServer::metrics_text() const { return impl_->metrics(); }

}  // namespace essaim::relay
