#include "relay/relay_client.h"

#include <algorithm>

namespace essaim::relay {

Result<std::string> node_id_of_url(const net::WsUrl& url) {
  constexpr std::string_view prefix = "/node/";
  if (!url.path.starts_with(prefix)) return Status::error(url.text() + ": a worker behind a relay is ws[s]://HOST:PORT/node/NODE_ID");
  std::string id = url.path.substr(prefix.size());
  if (!valid_node_id(id)) return Status::error(url.text() + ": node id '" + id + "' is not [A-Za-z0-9._~-]{1,128}");
  return id;
}

namespace {

// The relay's answer to a preamble: PAIRED, or its close code and reason as REFUSED.
net::NetStatus await_paired(net::WsStream& s, net::Deadline deadline) {
  net::NetResult<std::vector<uint8_t>> m = s.read_message(deadline);
  if (!m) {
    if (m.error().kind == net::NetErrorKind::TIMEOUT) return m.error();
    if (uint16_t code = s.peer_close_code()) {
      return net::net_error(net::NetErrorKind::REFUSED,
                            "the relay refused (close " + std::to_string(code) + "): " + s.peer_close_reason());
    }
    return m.error();
  }
  if (m->size() != 1 || (*m)[0] != kPairedMessage) {
    return net::net_error(net::NetErrorKind::PROTOCOL, "the relay's first message is not PAIRED");
  }
  return {};
}

}  // namespace

net::NetResult<std::unique_ptr<net::WsStream>> relay_connect(const net::WsUrl& url, const Preamble& preamble,
                                                             const net::WsClientOptions& options, net::Deadline deadline) {
  net::NetResult<std::unique_ptr<net::WsStream>> s = net::ws_connect(url, options, deadline);
  if (!s) return s;
  const std::vector<uint8_t> pre = encode_preamble(preamble);
  if (net::NetStatus w = (*s)->write_message(pre, deadline); !w) return w.error();
  if (net::NetStatus p = await_paired(**s, deadline); !p) {
    (*s)->close();
    return p.error();
  }
  return s;
}

RelayAcceptor::RelayAcceptor(Options options) : opts_(std::move(options)) {
  for (size_t i = 0; i < std::max<size_t>(1, opts_.idle_connections); ++i) threads_.emplace_back([this] { dial_loop(); });
}

RelayAcceptor::~RelayAcceptor() {
  close();
  for (std::thread& t : threads_) t.join();
}

void RelayAcceptor::close() {
  std::lock_guard lk(mu_);
  if (closed_) return;
  closed_ = true;
  for (net::WsStream* s : waiting_) s->close();
  cv_.notify_all();
}

size_t RelayAcceptor::pairs() const {
  std::lock_guard lk(mu_);
  return pairs_;
}

bool RelayAcceptor::reachable() const {
  std::lock_guard lk(mu_);
  return reachable_;
}

net::NetResult<std::unique_ptr<net::ByteStream>> RelayAcceptor::accept(net::Deadline deadline) {
  std::unique_lock lk(mu_);
  if (!cv_.wait_until(lk, deadline, [&] { return closed_ || !ready_.empty(); })) {
    return net::net_error(net::NetErrorKind::TIMEOUT, "no backbone before the deadline");
  }
  if (!refused_.empty()) return net::net_error(net::NetErrorKind::REFUSED, refused_);
  if (closed_) return net::net_error(net::NetErrorKind::CLOSED, "the relay acceptor was closed");
  std::unique_ptr<net::ByteStream> s = std::move(ready_.front());
  ready_.pop_front();
  return s;
}

bool RelayAcceptor::token_refused(const net::WsStream& s) {
  return s.peer_close_code() == uint16_t(net::WsCloseCode::POLICY) && s.peer_close_reason().starts_with("bad token");
}

void RelayAcceptor::stop_refused(const net::WsStream& s) {
  const std::string why = "the relay " + opts_.relay.text() + " refused our token (close 1008): " + s.peer_close_reason();
  {
    std::lock_guard lk(mu_);
    if (auto it = std::find(waiting_.begin(), waiting_.end(), &s); it != waiting_.end()) waiting_.erase(it);
    if (!refused_.empty() || closed_) return;  // another dial-out connection said so first
    refused_ = why;
    closed_ = true;
    for (net::WsStream* w : waiting_) w->close();
    cv_.notify_all();
  }
  if (opts_.log) opts_.log(why + "; not retrying");
  if (opts_.on_refused) opts_.on_refused(why);
}

void RelayAcceptor::dial_loop() {
  std::chrono::milliseconds backoff = opts_.backoff_initial;
  const Preamble pre{.role = RelayRole::WORKER, .token = opts_.token, .build = opts_.build, .node_id = {}};
  for (;;) {
    {
      std::lock_guard lk(mu_);
      if (closed_) return;
    }
    net::NetResult<std::unique_ptr<net::WsStream>> s = net::ws_connect(opts_.relay, opts_.ws, net::deadline_in(opts_.connect_timeout));
    net::NetStatus result = s ? net::NetStatus{} : net::NetStatus(s.error());
    if (s) result = (*s)->write_message(encode_preamble(pre), net::deadline_in(opts_.connect_timeout));
    if (s && result) {
      {
        std::lock_guard lk(mu_);
        if (closed_) return;
        waiting_.push_back(s->get());
        reachable_ = true;
      }
      if (opts_.log) opts_.log("registered at relay " + opts_.relay.text());
      result = await_paired(**s, net::kNoDeadline);  // idle until a backbone comes (keep-alive pings run)
      if (!result && token_refused(**s)) return stop_refused(**s);
      std::lock_guard lk(mu_);
      waiting_.erase(std::find(waiting_.begin(), waiting_.end(), s->get()));
      if (closed_) return;
      if (result) {
        ready_.push_back(std::move(*s));
        ++pairs_;
        cv_.notify_all();
        backoff = opts_.backoff_initial;  // a pair made: the relay works
        continue;                         // dial a fresh idle connection at once
      }
    }
    if (opts_.log) opts_.log("relay " + opts_.relay.text() + ": " + result.error().message + "; retrying in " + std::to_string(backoff.count()) + " ms");
    std::unique_lock lk(mu_);
    reachable_ = false;
    cv_.wait_for(lk, backoff, [&] { return closed_; });
    backoff = std::min(backoff * 2, opts_.backoff_max);
  }
}

}  // namespace essaim::relay
