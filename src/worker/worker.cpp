#include "worker/worker.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <thread>
#include <utility>
#include <variant>

#include "net/frame_connection.h"
#include "worker/expert_request.h"

namespace essaim::worker {

using net::FrameConnection;
using proto::ErrorCode;

namespace {

ComputePoolOptions pool_options(const WorkerOptions& o) {
  const size_t threads = o.threads ? o.threads : std::max<unsigned>(std::thread::hardware_concurrency(), 1);
  const size_t lanes = std::clamp<size_t>(o.lanes, 1, threads);
  return {.lanes = lanes, .threads_per_lane = std::max<size_t>(threads / lanes, 1)};
}

}  // namespace

// Holds an admitted request's share of the limits until its answer is written or dropped.
class Worker::Admission {
 public:
  Admission(Worker* w, std::shared_ptr<Session> s, uint64_t bytes) : w_(w), s_(std::move(s)), bytes_(bytes) {}
  ~Admission() { w_->release(*s_, bytes_); }
  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;

 private:
  Worker* w_;
  std::shared_ptr<Session> s_;
  uint64_t bytes_;
};

struct Worker::Outgoing {
  std::vector<uint8_t> frame;
  bool response = false;  // an EXPERT_RESPONSE (counted when written) rather than a control frame
  uint64_t rows = 0, pairs = 0;
  std::unique_ptr<Admission> admission;  // responses and their INTERNAL errors: released once written
};

// One connection's state shared between its reader, its writer and the lanes computing its requests.
struct Worker::Session {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Outgoing> outbox;  // frames ready to write, in completion order
  size_t control_waiting = 0;   // frames in outbox without an admission (errors, pongs)
  size_t in_flight = 0;         // admitted requests not yet written or dropped
  bool closing = false;         // nothing more is queued; the writer stops (after draining when `flush`)
  bool flush = false;
  std::shared_ptr<ComputePool::Client> client;
};

struct Worker::Job {
  proto::ExpertRequest request;
  std::unique_ptr<Admission> admission;
};

Worker::Worker(const WorkerState& state, WorkerOptions options)
    : state_(state),
      options_(std::move(options)),
      admission_(options_.admission, options_.log),
      pool_(pool_options(options_)) {
  options_.max_payload_bytes = std::max(options_.max_payload_bytes, proto::kMinMaxPayloadBytes);
  options_.max_in_flight = std::max<size_t>(options_.max_in_flight, 1);
}

Worker::~Worker() = default;

proto::Hello Worker::hello() const {
  proto::Hello h = state_.hello(options_.label);
  h.max_payload_bytes = options_.max_payload_bytes;
  if (!options_.isa_class.empty()) h.fingerprint.isa_class = options_.isa_class;  // e.g. a GPU's kernels
  return h;
}

void Worker::log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

WorkerStats Worker::stats() const {
  WorkerStats s = counters_.snapshot();
  s.admission = admission_.counters();
  return s;
}

void Worker::refuse_over_capacity(net::ByteStream& stream) {
  const std::string why = "the worker serves its maximum number of connections; try again later";
  FrameConnection c(stream, {.max_payload_bytes = options_.max_payload_bytes});
  (void)c.send(proto::Refuse{proto::RefuseReason::BUSY, why}, net::Clock::now());  // never waits
  admission_.note_refused(stream.peer_address(), why);
}

void Worker::serve_connection(net::ByteStream& stream) {
  count(counters_.connections);
  FrameConnection c(stream, {.max_payload_bytes = options_.max_payload_bytes});
  // Declared after c: the eviction callback uses c, and the ticket's destructor waits for any callback.
  std::unique_ptr<net::Admission::Ticket> ticket =
      admission_.admit(stream.peer_address(), [&c](const std::string& why) {
        (void)c.send(proto::Refuse{proto::RefuseReason::BUSY, why}, net::Clock::now());  // never waits
        c.close();  // wakes the handshake
      });
  proto::HandshakePolicy policy = options_.policy;
  policy.check_peer = [&ticket, theirs = std::move(policy.check_peer)](
                          const proto::Hello& h) -> std::optional<proto::Refuse> {
    if (theirs)
      if (std::optional<proto::Refuse> r = theirs(h)) return r;
    if (std::optional<std::string> no = ticket->authenticate()) return proto::Refuse{proto::RefuseReason::BUSY, *no};
    return std::nullopt;
  };
  net::NetResult<proto::Hello> peer =
      net::handshake(c, hello(), net::deadline_in(options_.handshake_timeout), policy);
  if (!peer) {
    if (ticket->evicted()) {
      // Counted by admission; the handshake then failed on the closed stream (possibly as a "refusal" of
      // the half frame it had read), which is not the peer's refusal or ours.
      count(counters_.handshakes_failed);
    } else if (peer.error().kind == net::NetErrorKind::REFUSED && peer.error().refuse) {
      count(counters_.handshakes_refused[size_t(*peer.error().refuse)]);
      log("handshake with " + stream.peer_name() + " refused (" +
          std::string(proto::refuse_reason_name(*peer.error().refuse)) + "): " + peer.error().message);
    } else {
      count(counters_.handshakes_failed);
      log("handshake with " + stream.peer_name() + " failed: " + peer.error().message);
    }
    c.close();
    return;
  }
  count(counters_.handshakes_ok);
  log("serving " + (peer->label.empty() ? stream.peer_name() : peer->label + " (" + stream.peer_name() + ")"));

  auto session = std::make_shared<Session>();
  session->client = pool_.client();
  std::thread writer([&] { write_loop(c, *session); });
  read_loop(c, session);

  std::deque<Outgoing> dropped;
  {
    std::lock_guard lock(session->mu);
    session->closing = true;
    if (!session->flush) dropped.swap(session->outbox);
  }
  session->cv.notify_all();
  pool_.cancel(*session->client);
  dropped.clear();  // releases admissions: outside the session's lock, which release() takes
  writer.join();
  c.close();
}

void Worker::read_loop(FrameConnection& c, const std::shared_ptr<Session>& s) {
  const bool idle_never = options_.idle_timeout.count() == 0;
  auto close_after = [&](ErrorCode code, const std::string& why) {
    push_error(*s, proto::kNoRequestId, code, why);
    count(counters_.closed_on_protocol_error);
    std::lock_guard lock(s->mu);
    s->flush = true;  // the ERROR saying why goes out before the close
  };
  for (;;) {
    net::NetResult<proto::Frame> f =
        c.receive_frame(idle_never ? net::kNoDeadline : net::deadline_in(options_.idle_timeout));
    if (!f) {
      const net::NetError& e = f.error();
      if (e.kind == net::NetErrorKind::PROTOCOL) {  // framing error or a stream cut inside a frame: final
        log("closing " + c.peer_name() + ": " + e.message);
        close_after(ErrorCode::MALFORMED, e.message);
      } else if (e.kind == net::NetErrorKind::TIMEOUT) {
        log("closing " + c.peer_name() + ": idle");
        push_control(*s, proto::Goodbye{"idle for " + std::to_string(options_.idle_timeout.count()) + " ms"});
        std::lock_guard lock(s->mu);
        s->flush = true;
      }
      return;  // CLOSED, IO: the peer is gone; nothing can be said to it
    }
    count(counters_.bytes_in, proto::kFrameHeaderBytes + f->payload.size());
    proto::ProtoResult<proto::Message> m = proto::decode_message(*f);
    if (!m) {  // the framing is intact: say so, and carry on with the next frame
      push_error(*s, proto::kNoRequestId, ErrorCode::MALFORMED, m.error().status().message());
      continue;
    }
    if (auto* req = std::get_if<proto::ExpertRequest>(&*m)) {
      handle_request(c, s, std::move(*req));
    } else if (const auto* ping = std::get_if<proto::Ping>(&*m)) {
      push_control(*s, proto::Pong{ping->nonce});
    } else if (std::holds_alternative<proto::Goodbye>(*m)) {
      return;  // the peer closes after a GOODBYE; nothing more is sent
    } else if (std::holds_alternative<proto::Pong>(*m) || std::holds_alternative<proto::ExpertError>(*m)) {
      continue;  // answers to nothing we asked, or the peer's complaint: nothing to do
    } else {
      const std::string type(proto::frame_type_name(f->type));
      close_after(ErrorCode::UNEXPECTED, type + " is not valid after the handshake");
      return;
    }
  }
}

void Worker::handle_request(FrameConnection& c, const std::shared_ptr<Session>& s, proto::ExpertRequest req) {
  const ExpertStore& store = state_.store();
  if (options_.only_output && req.output != *options_.only_output) {
    push_error(*s, req.request_id, ErrorCode::BAD_ENCODING,
               "this worker answers only in " + std::string(expert_output_name(*options_.only_output)) +
                   " (essaim worker --expert-output), the request asks for " +
                   std::string(expert_output_name(req.output)));
    return;
  }
  if (std::optional<proto::ExpertError> e = check_expert_request(store, req, c.peer_max_payload_bytes())) {
    push_error(*s, e->request_id, e->code, std::move(e->message));
    return;
  }
  const uint64_t cost = expert_request_cost_bytes(req, store);
  {
    std::unique_lock lock(s->mu);
    if (s->in_flight >= options_.max_in_flight) {
      lock.unlock();
      push_error(*s, req.request_id, ErrorCode::OVERLOADED,
                 std::to_string(options_.max_in_flight) + " requests already in flight on this connection");
      return;
    }
    std::lock_guard budget(budget_mu_);
    // One request always fits when nothing else is pending, so a large batch is slow, never refused forever.
    if (pending_bytes_ > 0 && pending_bytes_ + cost > options_.max_pending_bytes) {
      lock.unlock();
      push_error(*s, req.request_id, ErrorCode::OVERLOADED,
                 "requests in flight hold " + std::to_string(pending_bytes_) + " bytes; this one needs " +
                     std::to_string(cost) + " more (limit " + std::to_string(options_.max_pending_bytes) + ")");
      return;
    }
    pending_bytes_ += cost;
    ++s->in_flight;
  }
  auto job = std::make_shared<Job>(Job{std::move(req), std::make_unique<Admission>(this, s, cost)});
  pool_.submit(s->client, [this, s, job](ThreadPool* tp) {
    const auto t0 = std::chrono::steady_clock::now();
    Result<proto::ExpertResponse> r = compute_expert_request(state_.store(), job->request, tp, options_.executor);
    count(counters_.compute_ns,
          uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count()));
    Outgoing o;
    if (r) {
      o.frame = proto::encode_message(*r);
      o.response = true;
      o.rows = job->request.n_rows();
      o.pairs = job->request.n_pairs();
    } else {
      count(counters_.errors[size_t(ErrorCode::INTERNAL)]);
      o.frame = proto::encode_message(proto::ExpertError{job->request.request_id, ErrorCode::INTERNAL,
                                                         r.status().message()});
    }
    o.admission = std::move(job->admission);
    std::unique_lock lock(s->mu);
    if (s->closing) {
      lock.unlock();
      return;  // o (and its admission) dies here, outside the lock
    }
    s->outbox.push_back(std::move(o));
    lock.unlock();
    s->cv.notify_all();
  });
  // A refused submit (the connection is closing) drops the task, and with it the admission.
}

void Worker::push_control(Session& s, const proto::Message& m) {
  Outgoing o;
  o.frame = proto::encode_message(m);
  std::unique_lock lock(s.mu);
  s.cv.wait(lock, [&] { return s.closing || s.control_waiting < options_.max_in_flight; });
  if (s.closing) return;
  ++s.control_waiting;
  s.outbox.push_back(std::move(o));
  lock.unlock();
  s.cv.notify_all();
}

void Worker::push_error(Session& s, uint64_t request_id, ErrorCode code, std::string message) {
  count(counters_.errors[size_t(code)]);
  push_control(s, proto::ExpertError{request_id, code, std::move(message)});
}

void Worker::write_loop(FrameConnection& c, Session& s) {
  for (;;) {
    Outgoing o;
    {
      std::unique_lock lock(s.mu);
      s.cv.wait(lock, [&] { return s.closing || !s.outbox.empty(); });
      if (s.outbox.empty() || (s.closing && !s.flush)) return;
      o = std::move(s.outbox.front());
      s.outbox.pop_front();
      if (!o.admission) --s.control_waiting;
    }
    s.cv.notify_all();  // room for a control frame
    net::NetStatus sent = c.send_raw(o.frame, net::deadline_in(options_.write_timeout));
    if (!sent) {
      log("closing " + c.peer_name() + ": " + sent.error().message);
      std::deque<Outgoing> dropped;
      {
        std::lock_guard lock(s.mu);
        s.closing = true;
        s.flush = false;
        dropped.swap(s.outbox);
      }
      s.cv.notify_all();
      c.close();  // wakes the reader
      return;     // `dropped` and `o` release their admissions here, outside the lock
    }
    count(counters_.bytes_out, o.frame.size());
    if (o.response) {
      count(counters_.requests);
      count(counters_.rows, o.rows);
      count(counters_.pairs, o.pairs);
    }
  }
}

void Worker::release(Session& s, uint64_t bytes) {
  {
    std::lock_guard budget(budget_mu_);
    pending_bytes_ -= bytes;
  }
  std::lock_guard lock(s.mu);
  --s.in_flight;
}

}  // namespace essaim::worker
