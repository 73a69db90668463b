#include "backbone/worker_link.h"

#include <algorithm>
#include <type_traits>
#include <variant>

#include "backbone/expert_map.h"
#include "net/tcp.h"
#include "relay/relay_client.h"

namespace essaim::backbone {

Connector tcp_connector(std::string host, uint16_t port) {
  return [host = std::move(host), port](net::Deadline deadline) -> net::NetResult<std::unique_ptr<net::ByteStream>> {
    net::NetResult<std::unique_ptr<net::TcpStream>> s = net::tcp_connect(host, port, deadline);
    if (!s) return s.error();
    return std::unique_ptr<net::ByteStream>(std::move(*s));
  };
}

Connector relay_connector(net::WsUrl url, relay::Preamble preamble, std::string ca_file) {
  return [url = std::move(url), preamble = std::move(preamble), ca_file = std::move(ca_file)](
             net::Deadline deadline) -> net::NetResult<std::unique_ptr<net::ByteStream>> {
    net::NetResult<std::unique_ptr<net::WsStream>> s = relay::relay_connect(url, preamble, {.ca_file = ca_file}, deadline);
    if (!s) return s.error();
    return std::unique_ptr<net::ByteStream>(std::move(*s));
  };
}

WorkerLink::WorkerLink(LinkEndpoint endpoint, proto::Hello mine, LinkOptions options)
    : endpoint_(std::move(endpoint)), mine_(std::move(mine)), options_(std::move(options)),
      last_routable_(endpoint_.expected), backoff_(options_.backoff_initial), thread_([this] { run(); }) {}

WorkerLink::~WorkerLink() {
  std::shared_ptr<LinkSession> s;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    s = session_;
    if (connecting_) connecting_->close();  // wakes a handshake in progress
  }
  if (s) s->conn->close();  // wakes the reader
  cv_.notify_all();
  thread_.join();
}

void WorkerLink::log(const std::string& line) const {
  if (options_.log) options_.log("worker " + endpoint_.name + ": " + line);
}

bool WorkerLink::wait_first_attempt(net::Deadline deadline) {
  std::unique_lock lock(mu_);
  cv_.wait_until(lock, deadline, [&] { return first_attempt_done_ || stopping_; });
  return session_ != nullptr;
}

std::shared_ptr<LinkSession> WorkerLink::session() const {
  std::lock_guard lock(mu_);
  // A session the dispatcher failed is closed at once, but it stays session_ until the reader thread ends
  // it: it is no longer live, and a request sent on it could only fail.
  return fail_reason_ ? nullptr : session_;
}

std::vector<proto::Holding> WorkerLink::last_routable() const {
  std::lock_guard lock(mu_);
  return last_routable_;
}

WorkerReport WorkerLink::report() const {
  std::lock_guard lock(mu_);
  return WorkerReport{.address = endpoint_.name, .label = last_label_, .connected = session_ != nullptr,
                      .sessions = sessions_, .requests = 0, .pairs_served = 0, .failures = 0,
                      .last_error = last_error_};
}

void WorkerLink::run() {
  for (;;) {
    {
      std::lock_guard lock(mu_);
      if (stopping_) break;
    }
    std::string why;
    std::shared_ptr<LinkSession> s = connect_once(why);
    if (s) {
      {
        std::lock_guard lock(mu_);
        if (stopping_) {
          s->conn->close();
          break;
        }
        s->generation = ++generation_;
        session_ = s;
        last_routable_ = s->routable;
        last_label_ = s->peer.label;
        ++sessions_;
        first_attempt_done_ = true;
        fail_reason_.reset();
      }
      cv_.notify_all();
      log("connected (" + std::string(s->peer.fingerprint.isa_class) + "), serving " + holdings_text(s->routable));
      read_session(s);
    } else {
      {
        std::lock_guard lock(mu_);
        last_error_ = why;
        first_attempt_done_ = true;
      }
      cv_.notify_all();
      log("cannot connect: " + why);
    }
    if (!sleep_backoff()) break;
  }
}

std::shared_ptr<LinkSession> WorkerLink::connect_once(std::string& why) {
  const net::Deadline deadline = net::deadline_in(options_.connect_timeout);
  net::NetResult<std::unique_ptr<net::ByteStream>> stream = endpoint_.connect(deadline);
  if (!stream) {
    why = stream.error().message;
    return nullptr;
  }
  auto conn = std::make_unique<net::FrameConnection>(std::move(*stream),
                                                     net::ConnectionOptions{.max_payload_bytes = options_.max_payload_bytes});
  {
    std::lock_guard lock(mu_);
    if (stopping_) return nullptr;
    connecting_ = conn.get();
  }
  net::NetResult<proto::Hello> peer = net::handshake(*conn, mine_, deadline, options_.policy);
  {
    std::lock_guard lock(mu_);
    connecting_ = nullptr;
  }
  if (!peer) {
    why = "handshake: ";
    if (peer.error().refuse) why += "refused (" + std::string(proto::refuse_reason_name(*peer.error().refuse)) + "): ";
    why += peer.error().message;
    conn->close();
    return nullptr;
  }
  auto s = std::make_shared<LinkSession>();
  s->conn = std::move(conn);
  s->routable = endpoint_.routable ? endpoint_.routable(*peer) : peer->holdings;
  s->peer = std::move(*peer);
  return s;
}

void WorkerLink::read_session(const std::shared_ptr<LinkSession>& s) {
  for (;;) {
    net::NetResult<proto::Message> m = s->conn->receive(net::kNoDeadline);
    if (!m) {
      const FallbackReason r =
          m.error().kind == net::NetErrorKind::PROTOCOL ? FallbackReason::PROTOCOL : FallbackReason::DISCONNECTED;
      end_session(s, r, m.error().message);
      return;
    }
    if (auto* resp = std::get_if<proto::ExpertResponse>(&*m)) {
      const uint64_t id = resp->request_id;
      deliver(s->generation, id, LinkAnswer{.response = std::move(*resp), .reason = FallbackReason::COUNT, .message = {}});
    } else if (auto* err = std::get_if<proto::ExpertError>(&*m)) {
      const std::string what = std::string(proto::error_code_name(err->code)) + ": " + err->message;
      if (err->request_id == proto::kNoRequestId) {
        // About the connection: the worker closes after MALFORMED / UNEXPECTED; the read then ends it here.
        log("worker reports " + what);
        continue;
      }
      const FallbackReason r =
          err->code == proto::ErrorCode::OVERLOADED ? FallbackReason::OVERLOADED : FallbackReason::ERROR_RESPONSE;
      deliver(s->generation, err->request_id, LinkAnswer{.response = std::nullopt, .reason = r, .message = what});
    } else if (auto* ping = std::get_if<proto::Ping>(&*m)) {
      (void)s->conn->send(proto::Pong{.nonce = ping->nonce}, net::deadline_in(options_.connect_timeout));
    } else if (std::holds_alternative<proto::Pong>(*m)) {
      continue;
    } else if (auto* bye = std::get_if<proto::Goodbye>(&*m)) {
      end_session(s, FallbackReason::DISCONNECTED, "worker said goodbye: " + bye->message);
      return;
    } else {
      end_session(s, FallbackReason::PROTOCOL,
                  "unexpected " + std::string(proto::frame_type_name(proto::message_frame_type(*m))) + " from the worker");
      return;
    }
  }
}

void WorkerLink::end_session(const std::shared_ptr<LinkSession>& s, FallbackReason reason, const std::string& why) {
  s->conn->close();
  std::string message = why;
  {
    std::lock_guard lock(mu_);
    if (fail_reason_) {  // the dispatcher closed it: its reason is the real one
      reason = fail_reason_->first;
      message = fail_reason_->second;
      fail_reason_.reset();
    }
    if (session_ == s) session_.reset();
    last_error_ = message;
    for (auto& [id, p] : pending_)
      if (p.generation == s->generation && !p.done) {
        p.done = true;
        p.answer = LinkAnswer{.response = std::nullopt, .reason = reason, .message = message};
      }
  }
  cv_.notify_all();
  log("session ended (" + std::string(fallback_reason_name(reason)) + "): " + message);
}

void WorkerLink::deliver(uint64_t generation, uint64_t id, LinkAnswer answer) {
  {
    std::lock_guard lock(mu_);
    auto it = pending_.find(id);
    // An answer to a request already given up on (timed out, then answered late) is dropped.
    if (it == pending_.end() || it->second.generation != generation || it->second.done) return;
    it->second.done = true;
    it->second.answer = std::move(answer);
    it->second.answer.received_at = std::chrono::steady_clock::now();
  }
  cv_.notify_all();
}

uint64_t WorkerLink::begin_request(const LinkSession& s) {
  std::lock_guard lock(mu_);
  const uint64_t id = next_id_++;
  Pending& p = pending_[id];
  p.generation = s.generation;
  if (!session_ || session_->generation != s.generation) {  // ended between snapshot and now
    p.done = true;
    p.answer = LinkAnswer{.response = std::nullopt, .reason = FallbackReason::DISCONNECTED, .message = "session ended"};
  }
  return id;
}

std::optional<LinkAnswer> WorkerLink::send(LinkSession& s, const proto::ExpertRequest& r, net::Deadline deadline) {
  net::NetStatus st = s.conn->send(r, deadline);
  if (st) return std::nullopt;
  {
    std::lock_guard lock(mu_);
    pending_.erase(r.request_id);
  }
  FallbackReason reason = FallbackReason::DISCONNECTED;
  if (st.error().kind == net::NetErrorKind::TOO_LARGE) reason = FallbackReason::TOO_LARGE;
  if (st.error().kind == net::NetErrorKind::TIMEOUT) reason = FallbackReason::TIMEOUT;
  return LinkAnswer{.response = std::nullopt, .reason = reason, .message = "send: " + st.error().message};
}

LinkAnswer WorkerLink::wait(uint64_t request_id, net::Deadline deadline) {
  std::unique_lock lock(mu_);
  auto ready = [&] {
    auto it = pending_.find(request_id);
    return it == pending_.end() || it->second.done || stopping_;
  };
  if (deadline == net::kNoDeadline)
    cv_.wait(lock, ready);
  else
    cv_.wait_until(lock, deadline, ready);
  auto it = pending_.find(request_id);
  LinkAnswer a{.response = std::nullopt, .reason = FallbackReason::TIMEOUT, .message = "no answer before the deadline"};
  if (it == pending_.end()) {
    a.reason = FallbackReason::DISCONNECTED;
    a.message = "request unknown";
    return a;
  }
  if (it->second.done) a = std::move(it->second.answer);
  else if (stopping_) a = LinkAnswer{.response = std::nullopt, .reason = FallbackReason::DISCONNECTED, .message = "stopping"};
  pending_.erase(it);
  return a;
}

std::optional<LinkAnswer> WorkerLink::poll(uint64_t request_id, net::Deadline deadline) {
  {
    std::unique_lock lock(mu_);
    auto ready = [&] {
      auto it = pending_.find(request_id);
      return it == pending_.end() || it->second.done || stopping_;
    };
    if (!cv_.wait_until(lock, deadline, ready)) return std::nullopt;
  }
  return wait(request_id, net::Deadline{});  // settled: collect it without waiting
}

void WorkerLink::fail(const LinkSession& s, FallbackReason reason, const std::string& why) {
  {
    std::lock_guard lock(mu_);
    if (!session_ || session_->generation != s.generation || fail_reason_) return;
    fail_reason_ = std::make_pair(reason, why);
  }
  s.conn->close();  // the reader wakes with CLOSED and ends the session with the reason above
}

void WorkerLink::note_success() {
  std::lock_guard lock(mu_);
  backoff_ = options_.backoff_initial;
}

bool WorkerLink::sleep_backoff() {
  std::unique_lock lock(mu_);
  const std::chrono::milliseconds d = backoff_;
  backoff_ = std::min(backoff_ * 2, options_.backoff_max);
  cv_.wait_for(lock, d, [&] { return stopping_; });
  return !stopping_;
}

}  // namespace essaim::backbone
